// Positional encoding: the Transformer's sinusoids, computed in the page — the matrix PE[pos, i] and the dot
// products PE[p] · PE[q] between positions — or a served model's own (learned) position embeddings.

import { postJSON } from "../api.js";
import { Mat } from "../mat.js";
import { MatrixView } from "../matrix.js";
import { num, writeHash } from "../state.js";
import { h, header, labeled, status } from "../ui.js";

const ID = "positional";

/** PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)): [n, d]. */
export function sinusoids(n, d, base = 10000) {
  const m = new Mat(n, d);
  for (let pos = 0; pos < n; pos++) {
    for (let i = 0; i < d; i += 2) {
      const angle = pos / base ** (i / d);
      m.data[pos * d + i] = Math.sin(angle);
      if (i + 1 < d) m.data[pos * d + i + 1] = Math.cos(angle);
    }
  }
  return m;
}

export function gram(pe) {
  const { rows: n, cols: d, data } = pe, out = new Mat(n, n);
  for (let p = 0; p < n; p++) {
    for (let q = p; q < n; q++) {
      let s = 0;
      for (let i = 0; i < d; i++) s += data[p * d + i] * data[q * d + i];
      out.data[p * n + q] = out.data[q * n + p] = s;
    }
  }
  return out;
}

function mount(root, ctx, params) {
  // a classifier answers /v1/classify alone: its position embeddings are not served
  const learned = ctx.modelsFor((m) => m.positional && !m.capabilities.has("classify"));
  const view = { id: ID };
  header(root, { title: "Positional encoding", view,
    lead: "The sinusoids of “Attention Is All You Need”, computed in this page: each row is a position, each column "
      + "a dimension (sines in even columns, cosines in odd). Right: the dot product between two positions' "
      + "encodings, which depends only on how far apart they are. Click a position to plot its row." });
  const st = {
    source: params.source && (params.source === "page" || learned.some((m) => m.name === params.source)) ? params.source : "page",
    d: num(params.d, 128), n: num(params.n, 100), base: num(params.base, 10000), pos: num(params.pos, 20),
  };
  let pe = null, dot = null, busy = null;
  const save = () => writeHash(ID, st);
  const srcSel = h("select", { "data-role": "source", onchange: () => { st.source = srcSel.value; save(); run(); } },
    h("option", { value: "page" }, "sinusoids (computed here)"),
    learned.map((m) => h("option", { value: m.name }, `${m.name}: ${m.positional} (from the server)`)));
  srcSel.value = st.source;
  const dInput = h("input", { type: "number", min: 2, max: 1024, step: 2, value: st.d, "data-role": "d_model" });
  const nInput = h("input", { type: "number", min: 2, max: 512, value: st.n, "data-role": "positions" });
  const baseInput = h("input", { type: "number", min: 2, value: st.base, "data-role": "base" });
  for (const i of [dInput, nInput, baseInput]) i.addEventListener("change", () => run());
  const msg = h("div", { class: "status", "data-role": "status" });
  root.append(h("div", { class: "panel" }, h("div", { class: "controls" }, labeled("encoding", srcSel),
    labeled("d_model", dInput), labeled("positions", nInput), labeled("base", baseInput),
    h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Draw")), msg));
  const left = h("div", { class: "panel grow", "data-role": "pe" }, h("h3", {}, "PE[position, dimension]"));
  const right = h("div", { class: "panel grow", "data-role": "dot" }, h("h3", {}, "PE[p] · PE[q]"));
  root.append(h("div", { class: "row" }, left, right));
  const peView = new MatrixView(left, { cmap: "diverging", maxCell: 8, onClick: (r) => r >= 0 && choose(r) });
  const dotView = new MatrixView(right, { cmap: "viridis", maxCell: 8, onClick: (r) => r >= 0 && choose(r) });
  const plot = h("canvas", { "data-role": "plot" });
  const plotTitle = h("h3");
  root.append(h("div", { class: "panel" }, plotTitle, plot));

  function choose(p) {
    st.pos = p; save();
    peView.highlight(p); dotView.highlight(p);
    drawPlot();
  }

  function drawPlot() {
    if (!dot) return;
    const p = Math.min(st.pos, dot.rows - 1), row = dot.row(p);
    plotTitle.textContent = `PE[${p}] · PE[q] for every position q`;
    const W = Math.min(1100, (plot.parentElement.clientWidth || 900) - 30), H = 180, pad = 34;
    const dpr = window.devicePixelRatio || 1;
    plot.width = W * dpr; plot.height = H * dpr; plot.style.width = `${W}px`; plot.style.height = `${H}px`;
    const g = plot.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = "#fff"; g.fillRect(0, 0, W, H);
    let lo = Math.min(...row), hi = Math.max(...row);
    if (hi - lo < 1e-9) hi = lo + 1;
    const x = (q) => pad + (q / Math.max(1, row.length - 1)) * (W - pad - 10);
    const y = (v) => H - 20 - ((v - lo) / (hi - lo)) * (H - 34);
    g.strokeStyle = "#d5dae3"; g.beginPath(); g.moveTo(pad, y(lo)); g.lineTo(W - 10, y(lo)); g.stroke();
    g.strokeStyle = "#ff5a36"; g.beginPath(); g.moveTo(x(p), 8); g.lineTo(x(p), H - 20); g.stroke();
    g.strokeStyle = "#2f6fde"; g.lineWidth = 2; g.beginPath();
    row.forEach((v, q) => (q ? g.lineTo(x(q), y(v)) : g.moveTo(x(q), y(v))));
    g.stroke();
    g.fillStyle = "#6b7385"; g.font = '11px "DejaVu Sans", sans-serif';
    g.fillText(hi.toFixed(1), 2, y(hi) + 4); g.fillText(lo.toFixed(1), 2, y(lo));
    g.fillText("0", x(0) - 3, H - 6); g.fillText(String(row.length - 1), x(row.length - 1) - 14, H - 6);
    g.fillText(`q`, W / 2, H - 6);
  }

  async function run() {
    st.d = Math.max(2, Math.min(1024, num(dInput.value, 128))); st.n = Math.max(2, Math.min(512, num(nInput.value, 100)));
    st.base = Math.max(2, num(baseInput.value, 10000)); save();
    const t0 = performance.now();
    try {
      if (st.source === "page") {
        pe = sinusoids(st.n, st.d, st.base);
        dot = gram(pe);
      } else {
        if (busy) busy.abort();
        const ctrl = (busy = new AbortController());
        status(msg, "asking the server…");
        const r = await postJSON("/v1/positional", { model: st.source, positions: st.n }, { signal: ctrl.signal });
        pe = Mat.fromNested(r.matrix);
        dot = r.dot ? Mat.fromNested(r.dot) : gram(pe);
        st.d = pe.cols; dInput.value = pe.cols;
      }
      const abs = Math.max(Math.abs(pe.min()), Math.abs(pe.max()), 1e-9);
      // the diverging map is centred on 0: shift the values by +abs and scale to 2 * abs
      const shifted = new Mat(pe.rows, pe.cols, pe.data.map((v) => v + abs));
      const rows = [...Array(pe.rows).keys()].map(String);
      peView.set(shifted, { rowLabels: rows, colLabels: [...Array(pe.cols).keys()].map(String), vmax: 2 * abs,
        range: [-abs, abs] });
      dotView.set(dot, { rowLabels: rows, colLabels: rows, vmin: dot.min(), vmax: dot.max() });
      choose(Math.min(st.pos, pe.rows - 1));
      status(msg, `${pe.rows} positions × ${pe.cols} dimensions · drawn in ${(performance.now() - t0).toFixed(0)} ms`);
      root.dataset.done = String(+(root.dataset.done || 0) + 1);
    } catch (e) {
      if (e.name !== "AbortError") status(msg, e.message, true);
    }
  }

  view.exportPNG = () => [{ canvas: peView.canvas, title: "PE[position, dimension]" },
    { canvas: dotView.canvas, title: "PE[p] · PE[q]" }, { canvas: plot, title: plotTitle.textContent }];
  view.exportJSON = () => ({ view: ID, ...st, matrix: pe ? pe.toNested() : null, dot: dot ? dot.toNested(3) : null });
  view.restore = (p) => {
    if (p.d) dInput.value = p.d;
    if (p.n) nInput.value = p.n;
    if (p.base) baseInput.value = p.base;
    st.pos = num(p.pos, st.pos);
    run();
  };
  run();
  return view;
}

export default { id: ID, title: "Positional", mount };
