// Small DOM helpers shared by the views.

import { exportJSON, exportPNG, exportSVG } from "./export.js";

/** h("div", {class: "x", onclick: f}, child, "text", ...) */
export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k === "style" && typeof v === "object") Object.assign(e.style, v);
    else if (k in e && typeof v !== "string") e[k] = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) e.append(c);
  return e;
}

export function labeled(text, input, title) {
  return h("label", { title }, text, input);
}

export function select(options, value, onchange, attrs = {}) {
  const s = h("select", { ...attrs, onchange: () => onchange(s.value) },
    options.map((o) => (typeof o === "object" ? h("option", { value: o.value }, o.label) : h("option", { value: o }, o))));
  s.value = String(value);
  return s;
}

/** The model picker for a view: only the served models that can do what the view needs. */
export function modelSelect(models, value, onchange) {
  return select(models.map((m) => ({ value: m.name, label: `${m.name} (${m.family})` })), value, onchange,
    { "data-role": "model" });
}

/** The view's heading: title, one-line lead, and its export buttons (PNG/SVG/JSON, copy link). */
export function header(root, { title, lead, view, svg = false }) {
  const bar = h("div", { class: "toolbar" },
    h("h2", {}, title), h("span", { class: "sep" }),
    h("button", { class: "small", "data-export": "png", title: "download what this view shows as PNG",
      onclick: () => view.exportPNG && exportPNG(view.id, view.exportPNG()) }, "PNG"),
    svg ? h("button", { class: "small", "data-export": "svg", title: "download the head view as SVG",
      onclick: () => view.exportSVG && exportSVG(view.id, view.exportSVG()) }, "SVG") : null,
    h("button", { class: "small", "data-export": "json", title: "download this view's data as JSON",
      onclick: () => exportJSON(view.id, view.exportJSON()) }, "JSON"),
    h("button", { class: "small", title: "copy a link that reproduces this view",
      onclick: (e) => copyLink(e.target) }, "Link"));
  root.append(bar, h("p", { class: "lead" }, lead));
  return bar;
}

function copyLink(button) {
  const text = location.href;
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Link"; }, 1200); };
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => prompt("Link", text));
  else { prompt("Link to this view", text); }
}

export function status(el, text, error = false) {
  el.textContent = text || "";
  el.classList.toggle("error", !!error);
}

// One request at a time for a view: starting one aborts the one before, the run button is off while it runs, an
// error other than the abort shows in `msg`, and a finished run counts in root.dataset.done (the tests wait on it).
export function job(root, msg, button) {
  let current = null;
  return {
    async run(work) {
      if (current) current.abort();
      const ctrl = (current = new AbortController());
      button.disabled = true;
      try {
        await work(ctrl.signal);
        root.dataset.done = String(+(root.dataset.done || 0) + 1);
      } catch (e) {
        if (e.name !== "AbortError") status(msg, e.message, true);
      } finally {
        if (current === ctrl) { current = null; button.disabled = false; }
      }
    },
    abort() { if (current) current.abort(); },
  };
}

// The source and target inputs and the run button of a view that shows one example's attention.
export function exampleControls(st, { sourceHint, targetHint, action, run }) {
  const enter = (e) => { if (e.key === "Enter") run(); };
  const srcInput = h("input", { type: "text", class: "wide", value: st.src, "data-role": "source",
    placeholder: sourceHint, onkeydown: enter });
  const tgtInput = h("input", { type: "text", class: "wide", value: st.tgt, "data-role": "target",
    placeholder: targetHint, onkeydown: enter });
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, action);
  return { srcInput, tgtInput, go };
}

export function tokenChips(tokens, { onHover, onClick, className = "" } = {}) {
  return tokens.map((t, i) => {
    const e = h("span", { class: `tok ${className}`, "data-i": i }, t);
    if (onHover) {
      e.addEventListener("mouseenter", () => onHover(i));
      e.addEventListener("mouseleave", () => onHover(null));
    }
    if (onClick) e.addEventListener("click", () => onClick(i));
    return e;
  });
}

export function headOptions(n) {
  return [{ value: "avg", label: "average" }, ...[...Array(n).keys()].map((i) => ({ value: String(i), label: `head ${i}` }))];
}

export function layerOptions(n) {
  return [...Array(n).keys()].map((i) => ({ value: String(i), label: `layer ${i}` }));
}

/** What a view needs of a served model: {what: "captioning model", start: "a Show, Attend and Tell ... checkpoint",
 * capability (one or a list) and/or family: what GET /v1/models says of such a model, has(model): whether a served
 * model is one, hint: an optional line more}. */
export function needsText(needs) {
  const caps = [needs.capability ?? []].flat();
  const which = [needs.family && `family: ${needs.family}`,
    caps.length && `${caps.length > 1 ? "capabilities" : "capability"}: ${caps.join(", ")}`].filter(Boolean).join("; ");
  return `No ${needs.what} is served: start attnkit serve with ${needs.start} (${which}).`;
}

/** The view's content when no served model can do what it needs: which model to serve, instead of an empty form. */
export function noModel(root, needs) {
  root.append(h("div", { class: "panel nomodel", "data-role": "nomodel", "data-family": needs.family ?? "",
    "data-capability": [needs.capability ?? []].flat().join(",") },
  needsText(needs),
  needs.hint ? h("div", { class: "muted" }, needs.hint) : null,
  h("div", { class: "muted" }, "attnkit serve RUN_DIR [NAME=RUN_DIR ...] serves several models: each view finds "
    + "the ones it can use.")));
}

/** Display a SentencePiece/word token: the word-start mark becomes a visible space. */
export function pretty(tok) {
  return String(tok).replace(/^▁/, "·").replace(/▁/g, " ");
}
