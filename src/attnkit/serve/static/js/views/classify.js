// Classify: a fine-tuned BERT's prediction for a sentence (or a pair) and why: each word piece coloured by how much
// the prediction's log-odds lose when it is hidden (occlusion), every layer x head of the input's self-attention
// (BertViz's model view: click a map to open it) and the attention rollout from [CLS].

import { postJSONTimed } from "../api.js";
import { colorbar, rgb } from "../colormap.js";
import { layersOf, Mat } from "../mat.js";
import { MatrixView, paintCells } from "../matrix.js";
import { example, firstPair, pickModel, readsPairs, setExample, writeHash } from "../state.js";
import { h, header, job, labeled, modelSelect, noModel, status } from "../ui.js";

const ID = "classify";
const NEEDS = { what: "classifier", family: "bert_classifier", capability: "classify",
  has: (m) => m.capabilities.has("classify"),
  start: "a fine-tuned BERT classifier or regressor, e.g. a run of configs/glue_sst2.toml" };
const THUMB = 84;  // CSS pixels of a thumbnail's side
const SPECIALS = new Set(["[CLS]", "[SEP]", "[PAD]"]);

const signed = (v, d = 3) => `${v >= 0 ? "+" : "−"}${Math.abs(v).toFixed(d)}`;
/** Decimals that show changes as small as ``m`` (the largest): 3, more for a model that barely cares (up to 6). */
const digits = (m) => Math.min(6, Math.max(3, Math.ceil(-Math.log10(m)) + 2));

/** The answer of POST /v1/classify in one shape: {label, probabilities, score, explanation (attention as
 * Mat[layer][head], rollout as a Mat) | null}. */
function normalize(body) {
  const r = (body.results || [])[0] ?? {};
  const e = body.explanation ?? r.explanation ?? null;
  const out = { raw: body, label: String(r.label ?? e?.label ?? ""), probabilities: r.probabilities ?? null,
    score: r.score ?? null, explanation: null };
  if (e) {
    out.explanation = { pieces: e.pieces.map(String), types: e.token_types ?? e.pieces.map(() => 0),
      label: String(e.label ?? out.label), value: +e.value, occlusion: e.occlusion.map(Number),
      attention: layersOf(e.attention), rollout: e.rollout ? Mat.fromNested(e.rollout) : null };
  }
  return out;
}

/** A piece as shown: WordPiece's continuation mark dropped (the piece sits against the one before). */
function shown(piece) {
  return piece.startsWith("##") && piece.length > 2 ? piece.slice(2) : piece;
}

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Classify", view,
    lead: "Type a sentence (and its pair, for a model of sentence pairs): the model's label and probabilities, or a "
      + "regressor's score. Below, why: each word piece coloured by how much the prediction's log-odds drop when that "
      + "piece is hidden from every attention (occlusion), every layer × head of the self-attention (click one to "
      + "open it), and the attention rollout: how much of each piece reaches [CLS] through all the layers." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  const modelOf = (name) => models.find((m) => m.name === name);
  const exampleOf = (m) => (m.example != null ? String(m.example) : "");
  // a link's sentence, else the example the views share (the last one classified, or the served model's first)
  const name = pickModel(models, params.model, example.classifier);
  const shared = name === example.classifier || !example.classifier;
  const st = {
    model: name, text: params.text ?? (shared && example.text ? example.text : exampleOf(modelOf(name))),
    pair: params.pair ?? (shared && example.pair ? example.pair : firstPair(modelOf(name))), open: params.open ?? "",
  };
  let answer = null, thumbs = [];
  const pairs = () => readsPairs(modelOf(st.model) ?? {});
  const save = () => writeHash(ID, { model: st.model, text: st.text, pair: pairs() ? st.pair : "", open: st.open });

  const enter = (e) => { if (e.key === "Enter") run(); };
  const textInput = h("input", { type: "text", class: "wide", value: st.text, "data-role": "text",
    placeholder: "a sentence to classify", onkeydown: enter });
  const pairInput = h("input", { type: "text", class: "wide", value: st.pair, "data-role": "pair",
    placeholder: "the second sentence of the pair", onkeydown: enter });
  const pairBox = h("span", { class: "wide" }, pairInput);
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Classify");
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  const modelPicker = modelSelect(models, st.model, (v) => choose(v));
  root.append(h("div", { class: "panel" }, h("div", { class: "controls" },
    labeled("model", modelPicker), h("span", { class: "wide" }, textInput), pairBox, go), msg));

  // the prediction, and the sentence coloured by occlusion with the rollout from [CLS] under it
  const predBox = h("div", { "data-role": "prediction" });
  const piecesBox = h("div", { class: "tokens pieces", "data-role": "occlusion" });
  const occLegend = h("div", { class: "legend", "data-role": "occlusion-legend" });
  const cls = h("div", { class: "tokens pieces", "data-role": "cls-rollout" });
  const clsLegend = h("div", { class: "legend" });
  root.append(h("div", { class: "row" },
    h("div", { class: "panel", style: { flex: "0 1 340px" } }, h("h3", {}, "Prediction"), predBox),
    h("div", { class: "panel grow" }, h("h3", {}, "Occlusion: what each word piece does to the prediction"),
      piecesBox, occLegend,
      h("h3", { style: { marginTop: "14px" } }, "Attention rollout from [CLS]"), cls, clsLegend)));

  // every layer x head, one opened large, and the rollout's matrix
  const grids = h("div", { class: "panel", "data-role": "grids", style: { flex: "0 1 auto" } });
  const detail = h("div", { class: "panel grow", "data-role": "detail", hidden: true });
  const detailTitle = h("h3");
  detail.append(detailTitle);
  const big = new MatrixView(detail, { maxCell: 30 });
  const rolloutPanel = h("div", { class: "panel grow", "data-role": "rollout" },
    h("h3", {}, "Attention rollout (rows: each position; columns: how much of each input piece reaches it)"));
  const rollout = new MatrixView(rolloutPanel, { maxCell: 30 });
  root.append(h("div", { class: "row" }, grids, detail), h("div", { class: "row" }, rolloutPanel));

  function choose(name) {
    const before = modelOf(st.model), after = modelOf(name);
    // the sentence the last model opened on gives way to the new model's own example (a pair for a pair model)
    if (!textInput.value.trim() || textInput.value === exampleOf(before)) textInput.value = exampleOf(after);
    if (readsPairs(after) && (!pairInput.value.trim() || pairInput.value === firstPair(before))) {
      pairInput.value = firstPair(after);
    }
    st.model = name;
    pairBox.hidden = !pairs();
    save();
  }

  function renderPrediction() {
    predBox.replaceChildren();
    if (!answer) return;
    const { label, probabilities, score } = answer;
    predBox.dataset.label = label;
    if (probabilities) {
      predBox.append(h("div", { class: "prediction" }, h("span", { class: "muted" }, "label "),
        h("b", { "data-role": "label" }, label)));
      const bars = h("div", { class: "bars", "data-role": "probabilities" });
      for (const [name, p] of Object.entries(probabilities)) {
        bars.append(h("div", { class: `bar${name === label ? " chosen" : ""}`, "data-label": name, "data-p": p,
          title: `p(${name}) = ${(+p).toFixed(6)}` },
        h("span", { class: "name" }, name), h("div", {}, h("div", { class: "fill", style: { width: `${100 * p}%` } })),
        h("span", { class: "p" }, (+p).toFixed(3))));
      }
      predBox.append(bars);
    } else {
      predBox.append(h("div", { class: "prediction" }, h("span", { class: "muted" }, `${label} `),
        h("b", { "data-role": "score", "data-value": score }, score == null ? "" : (+score).toFixed(3))),
      h("div", { class: "muted" }, "a regressor: its predicted score"));
    }
  }

  // red: hiding the piece lowers the prediction (it supports it); blue: hiding it raises it (it argues against)
  function renderOcclusion() {
    piecesBox.replaceChildren(); occLegend.replaceChildren(); cls.replaceChildren(); clsLegend.replaceChildren();
    const e = answer?.explanation;
    if (!e) return;
    const m = Math.max(...e.occlusion.map(Math.abs), 1e-9);
    const d = digits(m);
    piecesBox.dataset.digits = d;
    // a label's log-odds, log(p / (1 - p)): a confident prediction's probability barely moves, its log-odds do
    const what = answer.probabilities ? `the log-odds of ${e.label}` : "the score";
    e.pieces.forEach((piece, i) => {
      const v = e.occlusion[i], t = 0.5 + 0.5 * v / m;
      const special = SPECIALS.has(piece);
      piecesBox.append(h("span", { class: `tok piece${special ? " special" : ""}${piece.startsWith("##") ? " cont" : ""}`
        + `${e.types[i] ? " second" : ""}`, "data-i": i, "data-piece": piece, "data-value": v,
      style: { background: special ? "" : rgb("diverging", t), color: Math.abs(t - 0.5) > 0.33 ? "#fff" : "" },
      title: special ? `${piece}: never hidden` : `${piece}: ${what} ${signed(v, 4)} when hidden`,
      onmouseenter: () => hover(i), onmouseleave: () => hover(null) },
      h("span", { class: "text" }, shown(piece)), h("small", { class: "value" }, special ? "" : signed(v, d))));
    });
    occLegend.append(signed(-m, d), colorbar("diverging"), signed(m, d),
      h("span", {}, ` change in ${what} when this piece is hidden (${answer.probabilities ? `p(${e.label})` : what} = `
        + `${e.value.toFixed(4)}): `,
        h("b", { style: { color: "#b2182b" } }, "red"),
        answer.probabilities ? " the piece supports the prediction, " : " the piece raises the score, ",
        h("b", { style: { color: "#2166ac" } }, "blue"),
        answer.probabilities ? " it argues against it" : " it lowers it"));
    if (e.rollout) {  // coloured up to the most of any word piece: [CLS] keeps much of itself through the residuals
      const row = e.rollout.row(0);
      const top = Math.max(...e.pieces.map((piece, j) => (SPECIALS.has(piece) ? 0 : row[j])), 1e-9);
      e.pieces.forEach((piece, j) => cls.append(h("span", { class: `tok piece${piece.startsWith("##") ? " cont" : ""}`,
        "data-i": j, "data-value": row[j], title: `rollout [CLS] ← ${piece}: ${row[j].toFixed(4)}`,
        style: { background: rgb("blues", Math.min(1, row[j] / top)), color: row[j] / top > 0.6 ? "#fff" : "" },
        onmouseenter: () => hover(j), onmouseleave: () => hover(null) }, shown(piece))));
      clsLegend.append("0", colorbar("blues"), top.toFixed(3),
        "  the [CLS] row of the rollout: how much of each piece reaches the final [CLS] state (the label's input where the model pools [CLS])");
    }
  }

  function renderGrids() {
    grids.replaceChildren();
    thumbs = [];
    const layers = answer?.explanation?.attention ?? [];
    if (!layers.length) return;
    const H = layers[0].length;
    grids.append(h("h3", {}, `Self-attention · ${layers.length} layer${layers.length > 1 ? "s" : ""} × ${H} head`
      + `${H > 1 ? "s" : ""}`));
    const grid = h("div", { class: "thumbs", style: { gridTemplateColumns: `max-content repeat(${H}, max-content)` } });
    grid.append(h("span"), ...[...Array(H).keys()].map((i) => h("span", { class: "axis-label" }, `head ${i}`)));
    layers.forEach((heads, l) => {
      grid.append(h("span", { class: "axis-label" }, `layer ${l}`));
      heads.forEach((mat, i) => {
        const c = document.createElement("canvas");
        paintCells(c, mat, { cmap: "viridis" });
        const s = THUMB / Math.max(mat.rows, mat.cols, 1);
        c.style.width = `${Math.max(1, Math.round(mat.cols * s))}px`;
        c.style.height = `${Math.max(1, Math.round(mat.rows * s))}px`;
        const key = `${l}:${i}`;
        const t = h("div", { class: "thumb", "data-key": key, title: `layer ${l}, head ${i}`, onclick: () => open(key) }, c);
        thumbs.push({ key, canvas: c, el: t });
        grid.append(t);
      });
    });
    grids.append(grid);
  }

  function open(key) {
    const layers = answer?.explanation?.attention ?? [];
    const [l, i] = String(key).split(":").map(Number);
    if (!layers[l] || !layers[l][i]) { detail.hidden = true; return; }
    st.open = key; save();
    for (const t of thumbs) t.el.classList.toggle("open", t.key === key);
    const labels = answer.explanation.pieces;
    detail.hidden = false;
    detailTitle.textContent = `Layer ${l}, head ${i}`;
    big.set(layers[l][i], { rowLabels: labels, colLabels: labels, title: `layer ${l}, head ${i}` });
    detail.dataset.key = key;
  }

  function renderRollout() {
    const e = answer?.explanation;
    if (!e || !e.rollout) { rollout.set(null); rolloutPanel.hidden = true; return; }
    rolloutPanel.hidden = false;
    rollout.set(e.rollout, { rowLabels: e.pieces, colLabels: e.pieces, title: "rollout, every layer" });
  }

  // hovering a piece marks its row where the matrices show it
  function hover(i) {
    big.highlight(i);
    rollout.highlight(i);
    for (const box of [piecesBox, cls]) for (const c of box.children) c.classList.toggle("hot", +c.dataset.i === i);
  }

  function render() {
    renderPrediction(); renderOcclusion(); renderGrids(); renderRollout();
    if (st.open && answer?.explanation) open(st.open);
    else detail.hidden = true;
  }

  async function run() {
    st.text = textInput.value.trim(); st.pair = pairInput.value.trim(); save();
    // an empty sentence is sent too: the server says what is wrong with a request, in one line
    const body = { model: st.model, sentences: [st.text], explain: true };
    if (pairs()) body.pairs = [st.pair];
    if (st.text) setExample({ text: st.text, pair: st.pair, classifier: st.model });
    answer = null;
    render();
    status(msg, "classifying…");
    await work.run(async (signal) => {
      const r = await postJSONTimed("/v1/classify", body, { signal });
      answer = normalize(r.body);
      render();
      const e = answer.explanation;
      status(msg, `${e ? `${e.pieces.length} word pieces, ${e.attention.length} × ${e.attention[0]?.length ?? 0} `
        + "attention maps · " : ""}answered in ${r.wait_ms.toFixed(0)} ms`);
      view.result = { text: st.text, pair: pairs() ? st.pair : null, label: answer.label,
        probabilities: answer.probabilities, score: answer.score };
    });
  }

  // the pieces and their occlusion colours as an image, for the PNG export
  function piecesCanvas() {
    const e = answer?.explanation;
    const c = document.createElement("canvas");
    if (!e) return c;
    const g = c.getContext("2d"), font = '13px "DejaVu Sans Mono", monospace', W = 900, rowH = 36;
    g.font = font;
    const boxes = [];
    let x = 0, y = 0;
    const m = Math.max(...e.occlusion.map(Math.abs), 1e-9), d = digits(m);
    e.pieces.forEach((piece, i) => {
      const w = Math.max(g.measureText(shown(piece)).width, g.measureText(signed(e.occlusion[i], d)).width) + 10;
      if (x + w > W && x) { x = 0; y += rowH; }
      boxes.push({ piece, v: e.occlusion[i], x, y, w });
      x += w + 3;
    });
    c.width = W; c.height = y + rowH;
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    g.font = font; g.textBaseline = "top";
    for (const b of boxes) {
      const special = SPECIALS.has(b.piece), t = 0.5 + 0.5 * b.v / m;
      g.fillStyle = special ? "#eef1f6" : rgb("diverging", t);
      g.fillRect(b.x, b.y, b.w, rowH - 4);
      g.fillStyle = Math.abs(t - 0.5) > 0.33 && !special ? "#fff" : "#1d2330";
      g.fillText(shown(b.piece), b.x + 5, b.y + 3);
      if (!special) { g.font = '10px "DejaVu Sans Mono", monospace'; g.fillText(signed(b.v, d), b.x + 5, b.y + 19); g.font = font; }
    }
    return c;
  }

  function gridCanvas() {
    const layers = answer?.explanation?.attention ?? [];
    const c = document.createElement("canvas");
    if (!layers.length) return c;
    const H = layers[0].length, gap = 6, lab = 56, cell = THUMB + gap;
    c.width = lab + H * cell; c.height = 18 + layers.length * cell;
    const g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    g.fillStyle = "#555"; g.font = '11px "DejaVu Sans", sans-serif';
    for (let i = 0; i < H; i++) g.fillText(`head ${i}`, lab + i * cell, 12);
    g.imageSmoothingEnabled = false;
    layers.forEach((heads, l) => {
      g.fillText(`layer ${l}`, 0, 18 + l * cell + THUMB / 2);
      heads.forEach((_, i) => {
        const t = thumbs.find((x) => x.key === `${l}:${i}`);
        if (t) g.drawImage(t.canvas, lab + i * cell, 18 + l * cell, parseFloat(t.canvas.style.width), parseFloat(t.canvas.style.height));
      });
    });
    return c;
  }

  view.exportPNG = () => {
    const what = answer ? (answer.probabilities ? `${answer.label} (p = ${(+answer.probabilities[answer.label]).toFixed(3)})`
      : `score ${(+answer.score).toFixed(3)}`) : "";
    const items = [{ canvas: piecesCanvas(), title: `${st.text}${pairs() ? `  |  ${st.pair}` : ""}  →  ${what}` },
      { canvas: gridCanvas(), title: "self-attention, layers × heads" }];
    if (!detail.hidden) items.push({ canvas: big.canvas, title: detailTitle.textContent });
    if (!rolloutPanel.hidden) items.push({ canvas: rollout.canvas, title: "attention rollout" });
    return items;
  };
  view.exportJSON = () => {
    const e = answer?.explanation;
    return { view: ID, model: st.model, text: st.text, pair: pairs() ? st.pair : null,
      result: answer ? { label: answer.label, probabilities: answer.probabilities, score: answer.score } : null,
      explanation: e ? { pieces: e.pieces, token_types: e.types, label: e.label, value: e.value, occlusion: e.occlusion,
        attention: e.attention.map((heads) => heads.map((m) => m.toNested())),
        rollout: e.rollout ? e.rollout.toNested() : null } : null };
  };
  view.restore = (p) => {
    if (p.model && modelOf(p.model)) { st.model = p.model; modelPicker.value = p.model; pairBox.hidden = !pairs(); }
    if (p.text !== undefined) textInput.value = p.text;
    if (p.pair !== undefined) pairInput.value = p.pair;
    st.open = p.open ?? st.open;
    run();
  };
  view.unmount = () => work.abort();
  view.run = run;
  pairBox.hidden = !pairs();
  if (st.text) view.first = run();
  else textInput.focus();
  return view;
}

export default { id: ID, title: "Classify", mount, needs: NEEDS };
