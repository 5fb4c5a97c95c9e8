// Translate: the translation streams in token by token while its cross-attention matrix fills; layer / head or
// their average; hover a word for its links (BertViz's head view); the beam's hypotheses and scores per step.

import { postStream } from "../api.js";
import { axes, attentionJSON, fetchAttention } from "../attention.js";
import { HeadView } from "../headview.js";
import { Mat, pick } from "../mat.js";
import { MatrixView } from "../matrix.js";
import { example, num, pickModel, setExample, writeHash } from "../state.js";
import { h, header, headOptions, job, labeled, layerOptions, modelSelect, noModel, pretty, select, status, tokenChips }
  from "../ui.js";

const ID = "translate";
const NEEDS = { what: "translation model", capability: "translate", has: (m) => m.capabilities.has("translate"),
  start: "a Transformer, convolutional-encoder Transformer, RNN encoder-decoder or RNNsearch translation checkpoint" };

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Translate", view, svg: true,
    lead: "Type a sentence: the translation appears token by token while the cross-attention fills in, one row per "
      + "output token. Hover a word (in the matrix, the head view or the output) to see what it attends to; click it to "
      + "keep its links." });
  if (!models.length) { noModel(root, NEEDS); return view; }

  // a link's sentence, else the example the views share (the last one run in any view, or the first on load)
  const st = {
    model: pickModel(models, params.model, example.model),
    src: params.src ?? example.src, beam: num(params.beam, 4), lp: num(params.lp, 1), nbest: num(params.nbest, 4),
    layer: num(params.layer, -1), head: params.head ?? "avg", word: num(params.word, -1),
  };
  let att = null, sourceTokens = null, streamRows = null, outTokens = [], beams = [], steps = [], result = null;

  const save = () => writeHash(ID, { model: st.model, src: st.src, beam: st.beam, lp: st.lp, nbest: st.nbest,
    layer: st.layer >= 0 ? st.layer : "", head: st.head, word: st.word >= 0 ? st.word : "" });

  const srcInput = h("input", { type: "text", class: "wide", value: st.src, "data-role": "source",
    placeholder: "a sentence in the model's source language", onkeydown: (e) => { if (e.key === "Enter") run(); } });
  const beamInput = h("input", { type: "number", min: 1, max: 16, value: st.beam, "data-role": "beam" });
  const lpInput = h("input", { type: "number", min: 0, max: 3, step: 0.1, value: st.lp, "data-role": "lp" });
  const nbestInput = h("input", { type: "number", min: 1, max: 16, value: st.nbest, "data-role": "nbest" });
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Translate");
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  root.append(h("div", { class: "panel" },
    h("div", { class: "controls" },
      labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); })),
      h("span", { class: "wide" }, srcInput),
      labeled("beam", beamInput, "beam size (1: greedy)"), labeled("length penalty", lpInput),
      labeled("n-best", nbestInput), go),
    msg));

  const layerSel = h("span"), headSel = h("span");
  const matPanel = h("div", { class: "panel grow", "data-role": "cross" },
    h("div", { class: "controls" }, h("h3", { style: { margin: 0 } }, "Cross-attention"), layerSel, headSel));
  const headPanel = h("div", { class: "panel", "data-role": "headview" }, h("h3", {}, "Head view"));
  root.append(h("div", { class: "row" }, matPanel, headPanel));
  const matrix = new MatrixView(matPanel, { maxCell: 34, onHover: (r) => focus(r), onClick: (r) => r >= 0 && pin(r) });
  const heads = new HeadView(headPanel, { onHover: (r) => focus(r, "headview"), onClick: (r) => pin(r) });
  const outBox = h("div", { class: "tokens output", "data-role": "output" });
  const stepSlider = h("input", { type: "range", min: 0, max: 0, value: 0, "data-role": "step",
    oninput: () => showBeams(+stepSlider.value) });
  const stepLabel = h("span", { class: "muted" });
  const hypsBox = h("div", { "data-role": "hypotheses" });
  root.append(h("div", { class: "panel" }, h("h3", {}, "Output"), outBox,
    h("div", { class: "controls", style: { marginTop: "12px" } }, h("h3", { style: { margin: 0 } }, "Beam"),
      stepSlider, stepLabel), hypsBox));

  function selectors() {
    const L = att ? att.cross.length : 0, H = att && L ? att.cross[0].length : 0;
    layerSel.replaceChildren();
    headSel.replaceChildren();
    if (!L) return;
    if (st.layer < 0 || st.layer >= L) st.layer = L - 1;
    if (st.head !== "avg" && +st.head >= H) st.head = "avg";
    layerSel.append(labeled("layer", select(layerOptions(L), st.layer, (v) => { st.layer = +v; save(); draw(); },
      { "data-role": "layer" })));
    headSel.append(labeled("head", select(headOptions(H), st.head, (v) => { st.head = v; save(); draw(); },
      { "data-role": "head" })));
  }

  function currentMap() {
    if (att && att.cross.length) {
      const [rows, cols] = axes(att, "cross");
      return { mat: pick(att.cross, st.layer, st.head), rows, cols, shown: null,
        title: `layer ${st.layer}, ${st.head === "avg" ? "average of heads" : `head ${st.head}`}` };
    }
    if (streamRows && streamRows.cols) {
      const n = Math.max(outTokens.length + 1, streamRows.rows.length);
      const mat = new Mat(n, streamRows.cols);
      streamRows.rows.forEach((r, i) => mat.data.set(r.slice(0, streamRows.cols), i * streamRows.cols));
      const labels = [...outTokens.map(pretty)];
      return { mat, rows: labels, cols: streamRows.source, shown: streamRows.rows.length, title: "streaming" };
    }
    return null;
  }

  function draw() {
    const m = currentMap();
    if (!m || !m.mat) { matrix.set(null); heads.set(null); return; }
    matrix.set(m.mat, { rowLabels: m.rows.map(pretty), colLabels: m.cols.map(pretty), rowsShown: m.shown, title: m.title });
    matrix.canvas.dataset.rows = m.mat.rows;
    matrix.canvas.dataset.cols = m.mat.cols;
    matrix.canvas.dataset.filled = m.shown ?? m.mat.rows;
    matrix.canvas.dataset.layer = st.layer;
    matrix.canvas.dataset.head = st.head;
    matrix.canvas.dataset.sum = m.mat.data.reduce((a, b) => a + b, 0).toFixed(6);
    heads.set(m.mat, m.rows.map(pretty), m.cols.map(pretty),
      { rowsShown: m.shown, leftTitle: "target", rightTitle: "source" });
  }

  // hovering a word shows its links; clicking pins them (click again to unpin), and the link keeps the pin
  function focus(row, from) {
    const r = row ?? (st.word >= 0 ? st.word : null);
    matrix.highlight(r);
    if (from !== "headview" || row == null) heads.focus(r);
    for (const e of outBox.children) e.classList.toggle("hot", +e.dataset.i === r);
  }

  function pin(row) {
    st.word = st.word === row ? -1 : row;
    save();
    focus(row);
  }

  function renderOutput(fresh = false) {
    const labels = att ? att.rowLabels : outTokens;
    outBox.replaceChildren(...tokenChips(labels.map(pretty), { onHover: (i) => focus(i), onClick: (i) => pin(i) }));
    if (fresh && outBox.lastChild) outBox.lastChild.classList.add("new");
  }

  function showBeams(i) {
    if (!steps.length && !result) { hypsBox.replaceChildren(); return; }
    const last = !steps.length || i >= steps.length - 1;
    const list = last && result ? result.hypotheses : steps[Math.min(i, steps.length - 1)] ?? [];
    stepLabel.textContent = last && result ? `final (${result.hypotheses.length}-best)`
      : `step ${Math.min(i, steps.length - 1) + 1} of ${steps.length}`;
    hypsBox.replaceChildren(h("table", { class: "hyps" },
      h("tr", {}, h("th", {}, "#"), h("th", {}, "hypothesis"), h("th", {}, "score")),
      list.map((hyp, k) => h("tr", { class: k === 0 ? "best" : "" }, h("td", { class: "num" }, k + 1),
        h("td", { class: "text" }, hyp.text ?? (hyp.tokens || []).map(pretty).join(" ")),
        h("td", { class: "num" }, hyp.score == null ? "" : (+hyp.score).toFixed(3))))));
  }

  // stream events (attnkit.serve.app's contract): "step" {step, token, tokens, text, score, done, beams,
  // attention: the step's cross-attention row of the best hypothesis}, then "done" (the plain answer) or "error"
  function onEvent(name, data) {
    if (!data || typeof data !== "object") return;
    if (name === "error") throw new Error(data.error ?? "stream error");
    if (name === "done" || name === "result") { result = finalResult(data); return; }
    if (Array.isArray(data.tokens)) outTokens = data.tokens.map(String);
    else if (data.token != null) outTokens.push(String(data.token));
    const row = data.attention;
    if (Array.isArray(row) && row.length) {
      if (!streamRows) streamRows = { source: sourceTokens || row.map((_, j) => String(j)), cols: row.length, rows: [] };
      const i = Math.max(0, outTokens.length - 1);
      streamRows.rows.length = Math.min(streamRows.rows.length, i);  // a new best hypothesis: its own rows
      streamRows.rows[i] = Float32Array.from(row);
      for (let k = 0; k < i; k++) if (!streamRows.rows[k]) streamRows.rows[k] = new Float32Array(row.length);
    }
    if (Array.isArray(data.beams) && data.beams.length) {
      beams = data.beams.map((b) => ({ text: b.text, tokens: b.tokens, score: b.score }));
    } else {
      beams = [{ text: data.text, tokens: data.tokens, score: data.score }];
    }
    steps.push(beams);
    stepSlider.max = steps.length - 1; stepSlider.value = steps.length - 1;
    showBeams(steps.length - 1);
    renderOutput(true);
    draw();
    view.fills.push(streamRows ? streamRows.rows.length : 0);  // rows of the matrix filled after each event
    status(msg, `decoding… ${outTokens.length} token${outTokens.length === 1 ? "" : "s"}`);
  }

  // the plain answer: {translations: [text], scores: [s], hypotheses?: [[{text, score}]], attention?: [{source,
  // target, weights}]}
  function finalResult(data) {
    const text = (data.translations || [""])[0] ?? "";
    const score = (data.scores || [])[0];
    const hyps = data.hypotheses && data.hypotheses[0] ? data.hypotheses[0].map((x) => ({ text: x.text, score: x.score }))
      : [{ text, score }];
    return { text: String(text), score, hypotheses: hyps, attention: (data.attention || [])[0] ?? null };
  }

  async function run(keepWord = false) {
    if (!keepWord) st.word = -1;
    st.src = srcInput.value.trim();
    st.beam = Math.max(1, num(beamInput.value, 4));
    st.lp = num(lpInput.value, 1);
    st.nbest = Math.min(st.beam, Math.max(1, num(nbestInput.value, 1)));
    save();
    if (!st.src) { status(msg, "type a sentence first", true); return; }
    setExample({ src: st.src, model: st.model });
    await work.run(async (signal) => {
      att = null; sourceTokens = null; streamRows = null; outTokens = []; beams = []; steps = []; result = null;
      view.fills = [];
      // a model without attention (an RNN encoder-decoder) translates, and that is all there is to show
      const attends = models.find((m) => m.name === st.model)?.capabilities.has("attention");
      // the source's tokens label the matrix's columns while it streams: a one-step forward pass (no decoding)
      if (attends) {
        fetchAttention({ model: st.model, source: st.src, target: "", precision: 1 }, { signal })
          .then((a) => { sourceTokens = a.source; if (streamRows) { streamRows.source = a.source; draw(); } })
          .catch(() => {});
      }
      renderOutput(); draw(); showBeams(0);
      status(msg, "decoding…");
      const t0 = performance.now();
      await postStream("/v1/translate", { model: st.model, sentences: [st.src], beam: st.beam, len_penalty: st.lp,
        n_best: st.nbest, attention: true, stream: true }, onEvent, { signal });
      const t1 = performance.now();
      const target = result?.text ?? outTokens.join(" ");
      if (attends) att = await fetchAttention({ model: st.model, source: st.src, target }, { signal });
      else outTokens = [...outTokens, "</s>"];
      selectors();
      renderOutput();
      draw();
      if (st.word >= (att ? att.rowLabels : outTokens).length) st.word = -1;
      focus(null);
      showBeams(steps.length ? steps.length - 1 : 0);
      if (steps.length) { stepSlider.max = steps.length - 1; }
      const best = result?.hypotheses?.[0]?.score;
      status(msg, `${(att ? att.rowLabels : outTokens).length} tokens in ${((t1 - t0) / 1000).toFixed(2)} s`
        + (best != null ? ` · score ${(+best).toFixed(3)}` : ""));
      view.result = { source: st.src, translation: target, hypotheses: result?.hypotheses ?? [] };
    });
  }

  view.exportPNG = () => [{ canvas: matrix.canvas, title: `${st.src}  →  ${view.result?.translation ?? ""}` }];
  view.exportSVG = () => heads.serialize();
  view.exportJSON = () => ({ view: ID, model: st.model, source: st.src, beam: st.beam, len_penalty: st.lp,
    result: view.result ?? null, steps, attention: att ? attentionJSON(att) : null });
  view.restore = (p) => {
    st.model = p.model ?? st.model; st.layer = num(p.layer, st.layer); st.head = p.head ?? st.head;
    st.word = num(p.word, -1);
    if (p.src !== undefined && p.src !== st.src) { srcInput.value = p.src; run(true); } else { selectors(); draw(); focus(null); }
  };
  view.unmount = () => work.abort();
  view.run = run;
  if (st.src) view.first = run(true);
  else { srcInput.focus(); }
  return view;
}

export default { id: ID, title: "Translate", mount, needs: NEEDS };
