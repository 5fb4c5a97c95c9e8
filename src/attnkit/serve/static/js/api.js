// The HTTP API of `attnkit serve`, from the page: JSON requests, server-sent events read from a POST's body
// (EventSource only GETs), one-line errors.

let apiKey = null;

export function setApiKey(key) { apiKey = key || null; }

function url(path) {
  return path;
}

function headers(extra = {}) {
  const h = { ...extra };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function failure(res) {
  let msg = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    const e = body.error ?? body.detail ?? body;
    msg = typeof e === "string" ? e : e.message ?? JSON.stringify(e);
  } catch { /* not JSON */ }
  return new ApiError(res.status, msg);
}

export async function getJSON(path, { signal } = {}) {
  const res = await fetch(url(path), { headers: headers(), signal });
  if (!res.ok) throw await failure(res);
  return res.json();
}

export async function postJSON(path, body, { signal } = {}) {
  const res = await fetch(url(path), {
    method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body), signal,
  });
  if (!res.ok) throw await failure(res);
  return res.json();
}

/** postJSON, timed: {body, wait_ms (until the answer's last byte), parse_ms (JSON.parse)}. */
export async function postJSONTimed(path, body, { signal } = {}) {
  const t0 = performance.now();
  const res = await fetch(url(path), {
    method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body), signal,
  });
  if (!res.ok) throw await failure(res);
  const text = await res.text();
  const t1 = performance.now();
  const parsed = JSON.parse(text);
  return { body: parsed, wait_ms: t1 - t0, parse_ms: performance.now() - t1, bytes: text.length };
}

export async function postForm(path, form, { signal } = {}) {
  const res = await fetch(url(path), { method: "POST", headers: headers(), body: form, signal });
  if (!res.ok) throw await failure(res);
  return res.json();
}

/**
 * POST ``body`` (an object, sent as JSON, or a FormData, sent as a multipart form) and read the answer as
 * server-sent events: onEvent(eventName, data) per event (data parsed as JSON when it is JSON). Resolves when the
 * stream ends. A JSON (non-stream) answer is passed as one "result" event, so a server that does not stream still
 * works.
 */
export async function postStream(path, body, onEvent, { signal } = {}) {
  const form = body instanceof FormData;
  const res = await fetch(url(path), {
    method: "POST",
    headers: headers(form ? { Accept: "text/event-stream" }
      : { "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: form ? body : JSON.stringify(body), signal,
  });
  if (!res.ok) throw await failure(res);
  const type = res.headers.get("content-type") || "";
  if (!type.includes("text/event-stream")) {
    onEvent("result", await res.json());
    return;
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const dispatch = (block) => {
    let event = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    const text = data.join("\n");
    let parsed = text;
    try { parsed = JSON.parse(text); } catch { /* plain text */ }
    onEvent(event, parsed);
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      dispatch(block);
    }
  }
  if (buffer.trim()) dispatch(buffer);
}
