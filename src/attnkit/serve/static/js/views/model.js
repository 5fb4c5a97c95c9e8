// Model view: every layer x head of encoder self-, decoder self- and cross-attention as a thumbnail grid;
// click one to open it full size with its tokens.

import { KINDS, attentionJSON, axes, fetchAttention } from "../attention.js";
import { pick } from "../mat.js";
import { MatrixView, paintCells } from "../matrix.js";
import { example, pickModel, setExample, writeHash } from "../state.js";
import { exampleControls, h, header, job, labeled, modelSelect, noModel, pretty, status } from "../ui.js";

const ID = "model";
// a classifier's attention comes with its explanation, in the Classify view (/v1/attention does not answer for it)
const NEEDS = { what: "model with attention", capability: "attention",
  has: (m) => m.capabilities.has("attention") && !m.capabilities.has("classify"),
  start: "a Transformer (translation or language model), convolutional-encoder Transformer or RNNsearch checkpoint",
  hint: "A classifier's attention is in the Classify view." };
const THUMB = 84;  // CSS pixels of a thumbnail's longer side
const size = (n) => (n >= 1e6 ? `${(n / 1e6).toFixed(1)} MB` : `${Math.ceil(n / 1e3)} kB`);

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Model view", view,
    lead: "Every attention map of one example: rows are layers, columns heads. A translation model shows encoder "
      + "self-, decoder self- and cross-attention, a language model its causal self-attention. Click a map to open it." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  const isLM = (name) => !!models.find((m) => m.name === name)?.capabilities.has("generate");
  // a link's example, else the one the views share: the last sentence (or prompt) run in any view
  const model = pickModel(models, params.model, example.model);
  const st = {
    model, src: params.src ?? (isLM(model) ? example.prompt : example.src), tgt: params.tgt ?? "",
    open: params.open ?? "",
  };
  let att = null;
  const save = () => writeHash(ID, st);

  const { srcInput, tgtInput, go } = exampleControls(st, { sourceHint: "source sentence (a language model: its text)",
    targetHint: "target (empty: the model's own output)", action: "Show attention", run: () => run() });
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  root.append(h("div", { class: "panel" }, h("div", { class: "controls" },
    labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); })),
    h("span", { class: "wide" }, srcInput), h("span", { class: "wide" }, tgtInput), go), msg));
  const grids = h("div", { class: "panel", "data-role": "grids", style: { flex: "0 1 auto" } });
  const detail = h("div", { class: "panel grow", "data-role": "detail", hidden: true,
    style: { position: "sticky", top: "56px" } });
  const detailTitle = h("h3");
  detail.append(detailTitle);
  const big = new MatrixView(detail, { maxCell: 30 });
  root.append(h("div", { class: "row" }, grids, detail));
  let thumbs = [];

  function renderGrids() {
    grids.replaceChildren();
    thumbs = [];
    if (!att) return;
    for (const kind of KINDS) {
      const layers = att[kind.key];
      if (!layers.length) continue;
      const H = layers[0].length;
      const section = h("div", { class: "grid-section", "data-kind": kind.key });
      const title = att.source.length ? kind.title : "Causal self-attention";
      section.append(h("h3", {}, `${title} · ${layers.length} layer${layers.length > 1 ? "s" : ""} × ${H} head${H > 1 ? "s" : ""}`));
      const grid = h("div", { class: "thumbs", style: { gridTemplateColumns: `max-content repeat(${H + 1}, max-content)` } });
      grid.append(h("span"), ...[...Array(H).keys()].map((i) => h("span", { class: "axis-label" }, `head ${i}`)),
        h("span", { class: "axis-label" }, "average"));
      layers.forEach((heads, l) => {
        grid.append(h("span", { class: "axis-label" }, `layer ${l}`));
        [...heads.map((_, i) => String(i)), "avg"].forEach((head) => {
          const mat = pick(layers, l, head);
          const c = document.createElement("canvas");
          paintCells(c, mat, { cmap: "viridis" });
          const s = THUMB / Math.max(mat.rows, mat.cols);
          c.style.width = `${Math.max(1, Math.round(mat.cols * s))}px`;
          c.style.height = `${Math.max(1, Math.round(mat.rows * s))}px`;
          const key = `${kind.key}:${l}:${head}`;
          const t = h("div", { class: "thumb", "data-key": key, title: `${kind.title}, layer ${l}, ${head === "avg" ? "average" : `head ${head}`}`,
            onclick: () => open(key) }, c);
          thumbs.push({ key, canvas: c, el: t });
          grid.append(t);
        });
      });
      section.append(grid);
      grids.append(section);
    }
  }

  function open(key) {
    st.open = key; save();
    for (const t of thumbs) t.el.classList.toggle("open", t.key === key);
    const [kind, l, head] = key.split(":");
    if (!att || !att[kind] || !att[kind][+l]) { detail.hidden = true; return; }
    const mat = pick(att[kind], +l, head);
    const [rows, cols] = axes(att, kind);
    detail.hidden = false;
    const name = att.source.length ? KINDS.find((k) => k.key === kind).title : "Causal self-attention";
    detailTitle.textContent = `${name}, layer ${l}, ${head === "avg" ? "average of heads" : `head ${head}`}`;
    big.set(mat, { rowLabels: rows.map(pretty), colLabels: cols.map(pretty) });
    detail.dataset.key = key;
  }

  async function run() {
    st.src = srcInput.value.trim(); st.tgt = tgtInput.value.trim(); save();
    if (!st.src) { status(msg, "type a sentence first", true); return; }
    const m = models.find((x) => x.name === st.model);
    if (m?.capabilities.has("translate")) setExample({ src: st.src, model: st.model });
    else if (isLM(st.model)) setExample({ prompt: st.src, lm: st.model });
    status(msg, "computing attention…");
    await work.run(async (signal) => {
      const body = { model: st.model, source: st.src, precision: 3 };  // 256 colours need no more
      if (st.tgt) body.target = st.tgt;
      att = await fetchAttention(body, { signal });
      const t0 = performance.now();
      renderGrids();
      if (st.open) open(st.open);
      await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));  // painted
      const render = performance.now() - t0;
      const n = thumbs.length;
      const timing = { maps: n, source_tokens: att.source.length, target_tokens: att.target.length,
        answer_bytes: att.timing.bytes, wait_ms: att.timing.wait_ms, parse_ms: att.timing.parse_ms,
        convert_ms: att.timing.convert_ms, render_ms: render };
      window.attnkit.timings.model = timing;
      status(msg, `${n} maps, ${att.source.length} source × ${att.target.length} target tokens · drawn in `
        + `${render.toFixed(0)} ms (the answer: ${size(timing.answer_bytes)} in `
        + `${timing.wait_ms.toFixed(0)} ms, parsed in ${timing.parse_ms.toFixed(0)} ms, `
        + `converted in ${timing.convert_ms.toFixed(0)} ms)`);
      view.timing = timing;
    });
  }

  view.exportPNG = () => {
    // the grid as one image: each thumbnail at its CSS size, sections stacked
    const items = [];
    for (const kind of KINDS) {
      const layers = att ? att[kind.key] : [];
      if (!layers.length) continue;
      const H = layers[0].length + 1, gap = 6, lab = 56;
      const cell = THUMB + gap;
      const c = document.createElement("canvas");
      c.width = lab + H * cell; c.height = 18 + layers.length * cell;
      const g = c.getContext("2d");
      g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
      g.fillStyle = "#555"; g.font = '11px "DejaVu Sans", sans-serif';
      for (let i = 0; i < H; i++) g.fillText(i === H - 1 ? "average" : `head ${i}`, lab + i * cell, 12);
      g.imageSmoothingEnabled = false;
      layers.forEach((_, l) => {
        g.fillStyle = "#555";
        g.fillText(`layer ${l}`, 0, 18 + l * cell + THUMB / 2);
        for (let i = 0; i < H; i++) {
          const t = thumbs.find((x) => x.key === `${kind.key}:${l}:${i === H - 1 ? "avg" : i}`);
          if (!t) continue;
          g.drawImage(t.canvas, lab + i * cell, 18 + l * cell, parseFloat(t.canvas.style.width), parseFloat(t.canvas.style.height));
        }
      });
      items.push({ canvas: c, title: kind.title });
    }
    if (!detail.hidden) items.push({ canvas: big.canvas, title: detailTitle.textContent });
    return items;
  };
  view.exportJSON = () => ({ view: ID, model: st.model, source: st.src, target: st.tgt || null,
    timing: view.timing ?? null, attention: att ? attentionJSON(att) : null });
  view.restore = (p) => {
    if (p.src !== undefined) srcInput.value = p.src;
    if (p.tgt !== undefined) tgtInput.value = p.tgt;
    st.open = p.open ?? st.open;
    run();
  };
  view.unmount = () => work.abort();
  view.run = run;
  if (st.src) view.first = run();
  return view;
}

export default { id: ID, title: "Model view", mount, needs: NEEDS };
