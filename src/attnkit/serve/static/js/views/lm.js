// Language model: a prompt, temperature / top-k / top-p, the next-token probabilities at each step, and the causal
// self-attention of the chosen token.

import { postStream } from "../api.js";
import { attentionJSON, fetchAttention } from "../attention.js";
import { pick } from "../mat.js";
import { MatrixView } from "../matrix.js";
import { example, num, pickModel, setExample, writeHash } from "../state.js";
import { h, header, headOptions, job, labeled, layerOptions, modelSelect, noModel, pretty, select, status } from "../ui.js";

const ID = "lm";
const TOP = 10;
const NEEDS = { what: "language model", family: "transformer_lm", capability: "generate",
  has: (m) => m.capabilities.has("generate"),
  start: "a Transformer language model (GPT) checkpoint, e.g. a run of configs/tinyshakespeare_char.toml" };

function show(piece) {
  const s = pretty(piece);
  return s === "\n" ? "↵" : s === " " ? "␣" : s;
}

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Language model", view,
    lead: "Sample a continuation. Each new token shows the model's next-token distribution (bar: the distribution "
      + "it was sampled from after temperature, top-k and top-p; tick: the model's own probability) and, below, "
      + "the causal self-attention while it was chosen." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  // a link's prompt, else the example the views share (the last prompt run, or the first on load)
  const fromLink = params.prompt !== undefined || !!params.run;
  const st = {
    model: pickModel(models, params.model, example.lm),
    prompt: params.prompt ?? example.prompt, max: num(params.max, 40), temp: num(params.temp, 1), k: num(params.k, 0),
    p: num(params.p, 1), seed: params.seed ?? "0", layer: num(params.layer, -1), head: params.head ?? "avg",
    step: num(params.step, -1),
  };
  let steps = [], tokens = [], att = null, answer = null, promptLen = 0;
  const save = () => writeHash(ID, { model: st.model, prompt: st.prompt, max: st.max, temp: st.temp, k: st.k,
    p: st.p, seed: st.seed, layer: st.layer >= 0 ? st.layer : "", head: st.head, step: st.step >= 0 ? st.step : "" });

  const promptInput = h("textarea", { rows: 2, "data-role": "prompt", placeholder: "a prompt (may be empty)" });
  promptInput.value = st.prompt;
  const maxInput = h("input", { type: "number", min: 1, max: 1024, value: st.max, "data-role": "max" });
  const tempInput = h("input", { type: "number", min: 0, max: 5, step: 0.05, value: st.temp, "data-role": "temperature" });
  const tempRange = h("input", { type: "range", min: 0, max: 2, step: 0.05, value: st.temp,
    oninput: () => { tempInput.value = tempRange.value; } });
  tempInput.addEventListener("input", () => { tempRange.value = tempInput.value; });
  const kInput = h("input", { type: "number", min: 0, max: 1000, value: st.k, "data-role": "top-k" });
  const pInput = h("input", { type: "number", min: 0.01, max: 1, step: 0.05, value: st.p, "data-role": "top-p" });
  const seedInput = h("input", { type: "number", min: 0, value: st.seed, "data-role": "seed", placeholder: "random" });
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Generate");
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  root.append(h("div", { class: "panel" },
    h("div", { class: "controls" }, labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); }))),
    promptInput,
    h("div", { class: "controls", style: { marginTop: "8px" } },
      labeled("max tokens", maxInput), labeled("temperature", h("span", {}, tempRange, tempInput), "0: greedy"),
      labeled("top-k", kInput, "0: all"), labeled("top-p", pInput), labeled("seed", seedInput, "empty: random"), go),
    msg));

  const outBox = h("div", { class: "tokens output", "data-role": "output" });
  root.append(h("div", { class: "panel" }, h("h3", {}, "Text (click a new token)"), outBox));
  const barsBox = h("div", { class: "bars", "data-role": "bars" });
  const barsTitle = h("h3", {}, "Next-token probabilities");
  const layerSel = h("span"), headSel = h("span");
  const attTitle = h("h3", { style: { margin: 0 } }, "Causal self-attention");
  const rowBox = h("div", { class: "tokens", "data-role": "attention-row", style: { marginBottom: "8px" } });
  const attPanel = h("div", { class: "panel grow", "data-role": "self-attention" },
    h("div", { class: "controls" }, attTitle, layerSel, headSel), rowBox);
  root.append(h("div", { class: "row" }, h("div", { class: "panel", style: { flex: "0 1 380px" } }, barsTitle, barsBox),
    attPanel));
  const matrix = new MatrixView(attPanel, { maxCell: 26 });

  function renderText(fresh = false) {
    const prompt = answer ? answer.text.slice(0, answer.text.length - answer.completion.length) : st.prompt;
    outBox.replaceChildren(h("span", { class: "tok", style: { background: "transparent" }, title: "the prompt" }, prompt),
      ...tokens.map((t, i) => h("span", { class: `tok toggle${i === st.step ? " chosen" : ""}`, "data-i": i,
        onclick: () => choose(i) }, show(t))));
    if (fresh && outBox.lastChild) outBox.lastChild.classList.add("new");
  }

  function renderBars() {
    const i = st.step >= 0 ? st.step : steps.length - 1;
    const s = steps[i];
    barsBox.replaceChildren();
    if (!s || !s.top || !s.top.length) {
      barsTitle.textContent = "Next-token probabilities";
      if (steps.length) barsBox.append(h("span", { class: "muted" }, "no distribution for this step"));
      return;
    }
    barsTitle.textContent = `Next-token probabilities at step ${i + 1}: chose “${show(s.token)}”`;
    const max = Math.max(...s.top.map(([, p, q]) => Math.max(p, q ?? p)), 1e-9);
    for (const [piece, p, q] of s.top) {
      const fill = h("div", { class: "fill", style: { width: `${(100 * (q ?? p)) / max}%` } });
      const tick = h("div", { style: { position: "absolute", left: `${(100 * p) / max}%`, top: "-2px", width: "2px",
        height: "17px", background: "#1d2330" }, title: `model p = ${p.toFixed(4)}` });
      barsBox.append(h("div", { class: `bar${piece === s.token ? " chosen" : ""}`, "data-piece": piece },
        h("span", {}, show(piece)), h("div", { style: { position: "relative" } }, fill, tick),
        h("span", { class: "p", title: "sampled with q (model p)" }, `${(q ?? p).toFixed(3)}`)));
    }
    barsBox.dataset.step = i;
    barsBox.dataset.first = s.top.map(([piece, p, q]) => `${piece}:${(q ?? p).toFixed(4)}`).join("|");
  }

  function selectors() {
    layerSel.replaceChildren(); headSel.replaceChildren();
    if (!att || !att.decoder.length) return;
    const L = att.decoder.length, H = att.decoder[0].length;
    if (st.layer < 0 || st.layer >= L) st.layer = L - 1;
    if (st.head !== "avg" && +st.head >= H) st.head = "avg";
    layerSel.append(labeled("layer", select(layerOptions(L), st.layer, (v) => { st.layer = +v; save(); renderAttention(); },
      { "data-role": "layer" })));
    headSel.append(labeled("head", select(headOptions(H), st.head, (v) => { st.head = v; save(); renderAttention(); },
      { "data-role": "head" })));
  }

  // the attention while the chosen token was predicted: row (prompt tokens + step) of the decoder's maps, whose
  // query is the token before it (row t of a causal map reads tokens 0..t and predicts token t + 1)
  function renderAttention() {
    rowBox.replaceChildren();
    const i = st.step >= 0 ? st.step : steps.length - 1;
    if (att && att.decoder.length) {
      const mat = pick(att.decoder, st.layer, st.head);
      const labels = att.target.map(show);
      const row = promptLen + i;
      matrix.set(mat, { rowLabels: labels, colLabels: labels,
        title: `layer ${st.layer}, ${st.head === "avg" ? "average of heads" : `head ${st.head}`}` });
      if (i >= 0 && row < mat.rows) {
        matrix.highlight(row);
        attTitle.textContent = `Causal self-attention while choosing “${show(tokens[i] ?? "")}”`;
        const weights = mat.row(row), m = Math.max(...weights.subarray(0, row + 1), 1e-9);
        for (let j = 0; j <= row; j++) {
          const w = weights[j] / m;
          rowBox.append(h("span", { class: "tok", title: weights[j].toFixed(4),
            style: { background: `rgba(47,111,222,${(0.06 + 0.8 * w).toFixed(3)})`, color: w > 0.55 ? "#fff" : "" } }, labels[j]));
        }
        rowBox.dataset.row = row;
      }
    } else if (i >= 0 && steps[i] && steps[i].attention) {  // while streaming: the step's row (layers, heads averaged)
      const weights = steps[i].attention, m = Math.max(...weights, 1e-9);
      const labels = ["<s>", ...[...Array(weights.length - 1).keys()].map((j) => (j >= promptLen ? show(tokens[j - promptLen] ?? "") : "·"))];
      weights.forEach((v, j) => rowBox.append(h("span", { class: "tok",
        style: { background: `rgba(47,111,222,${(0.06 + 0.8 * v / m).toFixed(3)})` } }, labels[j] ?? "")));
    }
  }

  function choose(i) {
    st.step = i; save();
    renderText(); renderBars(); renderAttention();
  }

  function onEvent(name, data) {
    if (name === "error") throw new Error(data.error ?? "stream error");
    if (name === "done") { answer = data; return; }
    if (data.token == null) return;
    tokens.push(String(data.token));
    steps.push({ token: String(data.token), top: data.top ?? null, attention: data.attention ?? null });
    if (data.attention && tokens.length === 1) promptLen = data.attention.length - 1;
    renderText(true);
    renderBars();
    renderAttention();
    status(msg, `sampling… ${tokens.length} tokens`);
  }

  async function run(keepStep = false) {
    const wanted = keepStep ? st.step : -1;
    st.prompt = promptInput.value;
    st.max = Math.max(1, num(maxInput.value, 40)); st.temp = num(tempInput.value, 1);
    st.k = Math.max(0, num(kInput.value, 0)); st.p = Math.min(1, Math.max(0.01, num(pInput.value, 1)));
    st.seed = seedInput.value.trim();
    st.step = -1; save();
    setExample({ prompt: st.prompt, lm: st.model });
    work.abort();
    steps = []; tokens = []; att = null; answer = null; promptLen = 0;
    renderText(); renderBars(); renderAttention(); matrix.set(null);
    status(msg, "sampling…");
    const body = { model: st.model, prompt: st.prompt, max_tokens: st.max, temperature: st.temp, top_k: st.k,
      top_p: st.p, stream: true, attention: true, top: TOP };
    if (st.seed !== "") body.seed = +st.seed;
    const t0 = performance.now();
    await work.run(async (signal) => {
      await postStream("/v1/generate", body, onEvent, { signal });
      if (!answer) answer = { text: st.prompt + tokens.join(""), completion: tokens.join(""), tokens, score: null };
      const t1 = performance.now();
      // the final answer's steps hold every step's distribution (greedy decoding streams none)
      if (Array.isArray(answer.steps)) answer.steps.forEach((s, i) => { if (steps[i] && !steps[i].top) steps[i].top = s.top; });
      if (answer.tokens && answer.tokens.length !== tokens.length) {
        tokens = answer.tokens.map(String);
        steps = tokens.map((t, i) => steps[i] ?? { token: t, top: answer.steps?.[i]?.top ?? null });
      }
      att = await fetchAttention({ model: st.model, source: answer.text }, { signal });
      promptLen = Math.max(0, att.target.length - 1 - tokens.length);
      st.step = wanted >= 0 && wanted < steps.length ? wanted : steps.length - 1; save();
      selectors();
      renderText(); renderBars(); renderAttention();
      status(msg, `${tokens.length} tokens in ${((t1 - t0) / 1000).toFixed(2)} s`
        + (answer.score != null ? ` · log p = ${(+answer.score).toFixed(3)}` : ""));
    });
  }

  view.exportPNG = () => {
    const bars = document.createElement("canvas");
    const s = steps[st.step >= 0 ? st.step : steps.length - 1];
    const top = s?.top ?? [];
    bars.width = 420; bars.height = 24 + top.length * 20;
    const g = bars.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, bars.width, bars.height);
    g.font = '12px "DejaVu Sans Mono", monospace'; g.textBaseline = "middle";
    const max = Math.max(...top.map(([, p, q]) => Math.max(p, q ?? p)), 1e-9);
    top.forEach(([piece, p, q], k) => {
      const y = 12 + k * 20;
      g.fillStyle = "#1d2330"; g.fillText(show(piece), 4, y + 6);
      g.fillStyle = piece === s.token ? "#d09a00" : "#9db9ec"; g.fillRect(80, y, 260 * (q ?? p) / max, 13);
      g.fillStyle = "#1d2330"; g.fillRect(80 + 260 * p / max, y - 2, 2, 17);
      g.fillText((q ?? p).toFixed(3), 350, y + 6);
    });
    return [{ canvas: bars, title: `next-token probabilities: ${(answer?.text ?? "").slice(0, 80)}` },
      { canvas: matrix.canvas, title: attTitle.textContent }];
  };
  view.exportJSON = () => ({ view: ID, model: st.model, request: { prompt: st.prompt, max_tokens: st.max,
    temperature: st.temp, top_k: st.k, top_p: st.p, seed: st.seed === "" ? null : +st.seed }, answer,
    steps: steps.map((s) => ({ token: s.token, top: s.top })), attention: att ? attentionJSON(att) : null });
  view.restore = (p) => {
    if (p.prompt !== undefined) promptInput.value = p.prompt;
    if (p.temp !== undefined) tempInput.value = tempRange.value = p.temp;
    if (p.k !== undefined) kInput.value = p.k;
    if (p.p !== undefined) pInput.value = p.p;
    if (p.seed !== undefined) seedInput.value = p.seed;
    if (p.max !== undefined) maxInput.value = p.max;
    st.step = num(p.step, -1);
    run(true);
  };
  view.unmount = () => work.abort();
  view.run = run;
  if (fromLink || st.prompt) view.first = run(true);
  return view;
}

export default { id: ID, title: "Language model", mount, needs: NEEDS };
