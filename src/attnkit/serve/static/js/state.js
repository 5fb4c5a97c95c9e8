// The view's state in the URL's hash: #view?key=value&... — a link reproduces what it shows.

export function readHash() {
  const raw = decodeURIComponent(location.hash.replace(/^#\/?/, "").split("?")[0] || "");
  const query = location.hash.includes("?") ? location.hash.slice(location.hash.indexOf("?") + 1) : "";
  const params = {};
  for (const [k, v] of new URLSearchParams(query)) params[k] = v;
  return { view: raw, params };
}

export function hashFor(view, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    q.set(k, Array.isArray(v) ? v.join(",") : String(v));
  }
  const s = q.toString();
  return `#${view}${s ? `?${s}` : ""}`;
}

/** Record the state without reloading or adding a history entry for every keystroke. */
export function writeHash(view, params) {
  const h = hashFor(view, params);
  if (h !== location.hash) history.replaceState(null, "", h);
}

export const num = (v, d) => (v === undefined || v === null || v === "" || Number.isNaN(+v) ? d : +v);
export const list = (v) => (v ? String(v).split(",").filter((x) => x !== "") : []);
