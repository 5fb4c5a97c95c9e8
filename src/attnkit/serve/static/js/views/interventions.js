// Interventions: mask any set of heads or source tokens, re-run, and compare the output and its score with the
// unmasked model's, side by side.

import { KINDS, attentionJSON, axes, fetchAttention } from "../attention.js";
import { pick } from "../mat.js";
import { MatrixView } from "../matrix.js";
import { example, list, pickModel, setExample, writeHash } from "../state.js";
import { h, header, job, labeled, modelSelect, noModel, pretty, status } from "../ui.js";

const ID = "interventions";
const NEEDS = { what: "translation model with attention", capability: ["translate", "attention"],
  has: (m) => m.capabilities.has("attention") && m.capabilities.has("translate"),
  start: "a Transformer, convolutional-encoder Transformer or RNNsearch translation checkpoint" };

/** The output text and score an attention answer carries (the server's own decoding under the masks). */
function outcome(att) {
  const r = att.raw || {};
  const text = r.translation ?? r.output ?? r.text ?? r.caption
    ?? att.rowLabels.filter((t) => t !== "</s>").map(pretty).join(" ");
  const score = r.score ?? r.log_prob ?? r.logprob ?? null;
  return { text: String(text), score: score == null ? null : +score };
}

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Interventions", view,
    lead: "Mask attention heads (their output set to zero) or source tokens (no query may attend to them): each "
      + "change re-runs the model at once, and its new output and score stand beside the unmasked model's." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  // a link's sentence, else the example the views share (the last one run in any view, or the first on load)
  const st = {
    model: pickModel(models, params.model, example.model), src: params.src ?? example.src,
    heads: new Set(list(params.heads)), mask: new Set(list(params.mask).map(Number)),
  };
  let base = null, masked = null;
  const save = () => writeHash(ID, { model: st.model, src: st.src, heads: [...st.heads].sort(),
    mask: [...st.mask].sort((a, b) => a - b) });

  const srcInput = h("input", { type: "text", class: "wide", value: st.src, "data-role": "source",
    placeholder: "a sentence", onkeydown: (e) => { if (e.key === "Enter") load(); } });
  const loadBtn = h("button", { class: "primary", "data-role": "load", onclick: () => load() }, "Translate");
  const runBtn = h("button", { class: "primary", "data-role": "run", onclick: () => rerun(), disabled: true },
    "Re-run");
  const clearBtn = h("button", { onclick: () => { st.heads.clear(); st.mask.clear(); changed(); } },
    "Clear masks");
  const msg = h("div", { class: "status", "data-role": "status" });
  const loading = job(root, msg, loadBtn);
  root.append(h("div", { class: "panel" }, h("div", { class: "controls" },
    labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); })),
    h("span", { class: "wide" }, srcInput), loadBtn), msg));

  const maskPanel = h("div", { class: "panel", "data-role": "masks" });
  root.append(maskPanel);
  const left = h("div", { class: "panel", "data-role": "before" });
  const right = h("div", { class: "panel", "data-role": "after" });
  root.append(h("div", { class: "compare" }, left, right));
  const sideA = side(left, "Unmasked"), sideB = side(right, "With masks");

  function side(panel, title) {
    const out = h("div", { class: "output", "data-role": "output" });
    const score = h("div", { class: "score", "data-role": "score" });
    panel.append(h("h3", {}, title), out, score);
    const m = new MatrixView(panel, { maxCell: 22 });
    return { out, score, matrix: m };
  }

  function showSide(s, att, other) {
    if (!att) { s.out.textContent = ""; s.score.textContent = ""; s.matrix.set(null); return; }
    const o = outcome(att);
    s.out.textContent = o.text || "(empty)";
    let line = o.score == null ? "" : `log p = ${o.score.toFixed(4)}`;
    if (other && o.score != null) {
      const b = outcome(other).score;
      if (b != null) line += `  (${o.score - b >= 0 ? "+" : ""}${(o.score - b).toFixed(4)})`;
    }
    s.score.textContent = line;
    s.score.dataset.value = o.score ?? "";
    if (att.cross.length) {
      const [rows, cols] = axes(att, "cross");
      s.matrix.set(pick(att.cross, att.cross.length - 1, "avg"), { rowLabels: rows.map(pretty), colLabels: cols.map(pretty),
        title: "cross-attention, last layer, average of heads" });
    }
  }

  function renderMasks() {
    maskPanel.replaceChildren();
    if (!base) return;
    maskPanel.append(h("h3", {}, "Source tokens (click to mask)"));
    maskPanel.append(h("div", { class: "tokens", "data-role": "source-tokens" }, base.source.map((t, i) =>
      h("span", { class: `tok toggle${st.mask.has(i) ? " masked" : ""}`, "data-i": i, title: "mask this source token",
        onclick: () => { st.mask.has(i) ? st.mask.delete(i) : st.mask.add(i); changed(); } }, pretty(t)))));
    const row = h("div", { class: "row", style: { marginTop: "12px" } });
    for (const kind of KINDS) {
      const layers = base[kind.key];
      if (!layers.length) continue;
      const H = layers[0].length;
      const grid = h("div", { class: "heads-grid", style: { gridTemplateColumns: `max-content repeat(${H}, max-content)` },
        "data-kind": kind.key });
      layers.forEach((_, l) => {
        grid.append(h("span", { class: "lbl" }, `layer ${l}`));
        for (let i = 0; i < H; i++) {
          const key = `${kind.key}.${l}.${i}`;
          grid.append(h("button", { class: st.heads.has(key) ? "on" : "", "data-head": key, title: `mask ${kind.title}, layer ${l}, head ${i}`,
            onclick: () => { st.heads.has(key) ? st.heads.delete(key) : st.heads.add(key); changed(); } }, `h${i}`));
        }
      });
      row.append(h("div", {}, h("h3", {}, kind.title), grid));
    }
    maskPanel.append(row, h("div", { class: "controls", style: { marginTop: "10px" } }, runBtn, clearBtn,
      h("span", { class: "muted" }, `${st.heads.size} head${st.heads.size === 1 ? "" : "s"}, ${st.mask.size} source token${st.mask.size === 1 ? "" : "s"} masked`)));
    runBtn.disabled = false;
  }

  // every change re-runs at once (after a short pause, so a burst of clicks makes one request)
  let pending = null;
  function changed() {
    save(); renderMasks();
    clearTimeout(pending);
    pending = setTimeout(() => rerun(), 250);
  }

  function maskBody() {
    return {
      mask_heads: [...st.heads].map((k) => { const [kind, l, i] = k.split("."); return [kind, +l, +i]; }),
      mask_source: [...st.mask].sort((a, b) => a - b),
    };
  }

  async function load() {
    st.src = srcInput.value.trim(); save();
    if (!st.src) { status(msg, "type a sentence first", true); return; }
    setExample({ src: st.src, model: st.model });
    await loading.run(async (signal) => {
      status(msg, "translating…");
      base = await fetchAttention({ model: st.model, source: st.src }, { signal });
      masked = null;
      for (const i of [...st.mask]) if (i >= base.source.length) st.mask.delete(i);
      renderMasks();
      showSide(sideA, base);
      showSide(sideB, null);
      status(msg, "mask heads or source tokens, then re-run");
      if (st.heads.size || st.mask.size) await rerun(signal);
      signal.throwIfAborted();
    });
  }

  let inflight = null;
  async function rerun(signal) {  // signal: the load's, when a load re-runs its masks (aborting it aborts this)
    if (!base) return;
    if (inflight) inflight.abort();
    const ctrl = (inflight = new AbortController());
    if (signal) signal.addEventListener("abort", () => ctrl.abort(), { once: true });
    const body = maskBody();
    runBtn.disabled = true;
    status(msg, "re-running with masks…");
    try {
      masked = await fetchAttention({ model: st.model, source: st.src, ...body }, { signal: ctrl.signal });
      showSide(sideB, masked, base);
      const a = outcome(base), b = outcome(masked);
      status(msg, a.text === b.text ? "the output did not change" : "the output changed");
      right.dataset.output = b.text;
      right.dataset.score = b.score ?? "";
      right.dataset.masks = `${body.mask_heads.length},${body.mask_source.length}`;
      root.dataset.done = String(+(root.dataset.done || 0) + 1);
    } catch (e) {
      if (e.name !== "AbortError") status(msg, e.message, true);
    } finally {
      if (inflight === ctrl) { inflight = null; runBtn.disabled = false; }
    }
  }

  view.exportPNG = () => [
    { canvas: sideA.matrix.canvas, title: `unmasked: ${sideA.out.textContent}  ${sideA.score.textContent}` },
    { canvas: sideB.matrix.canvas, title: `masked: ${sideB.out.textContent}  ${sideB.score.textContent}` },
  ];
  view.exportJSON = () => ({ view: ID, model: st.model, source: st.src, ...maskBody(),
    unmasked: base ? { ...outcome(base), attention: attentionJSON(base) } : null,
    masked: masked ? { ...outcome(masked), attention: attentionJSON(masked) } : null });
  view.restore = (p) => {
    st.heads = new Set(list(p.heads)); st.mask = new Set(list(p.mask).map(Number));
    if (p.src !== undefined) srcInput.value = p.src;
    load();
  };
  view.unmount = () => { loading.abort(); if (inflight) inflight.abort(); clearTimeout(pending); };
  if (st.src) view.first = load();
  return view;
}

export default { id: ID, title: "Interventions", mount, needs: NEEDS };
