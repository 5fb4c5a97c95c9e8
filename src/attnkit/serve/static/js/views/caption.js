// Caption: choose or upload an image; the caption appears word by word, each word with where it looked
// (Show, Attend and Tell's figure): the image stays bright where the attention is, darkens elsewhere.

import { postForm } from "../api.js";
import { CMAPS } from "../colormap.js";
import { example, num, pickModel, setExample, writeHash } from "../state.js";
import { h, header, job, labeled, modelSelect, noModel, status } from "../ui.js";

const ID = "caption";
const SAMPLES = ["dog", "beach", "street"];
const SIZE = 336;  // CSS pixels of the main image
const REVEAL_MS = 180;  // between words as the caption appears
const NEEDS = { what: "captioning model", capability: "caption", has: (m) => m.capabilities.has("caption"),
  start: "a Show, Attend and Tell or Transformer captioner checkpoint, e.g. a run of configs/flickr8k_sat.toml" };

function loadImage(src) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("cannot read this image"));
    img.src = src;
  });
}

/** Draw ``img`` into ``canvas`` (size x size), lit by ``weights`` (grid [gh, gw]) when given. */
export function drawAttended(canvas, img, weights, grid, size, { heat = false } = {}) {
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(size * dpr); canvas.height = Math.round(size * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.drawImage(img, 0, 0, size, size);
  if (!weights || !grid) return;
  const [gh, gw] = grid;
  const cells = document.createElement("canvas");
  cells.width = gw; cells.height = gh;
  const cg = cells.getContext("2d"), data = cg.createImageData(gw, gh);
  // stretched from the map's least to its most attended cell, as matplotlib's imshow shows Show-Attend-Tell's maps
  const lo = Math.min(...weights), span = Math.max(Math.max(...weights) - lo, 1e-9), lut = CMAPS.heat;
  for (let i = 0; i < gh * gw; i++) {
    const w = ((weights[i] ?? lo) - lo) / span;
    if (heat) {
      const k = Math.round(w * 255) * 3;
      data.data.set([lut[k], lut[k + 1], lut[k + 2], Math.round(170 * Math.sqrt(w))], i * 4);
    } else {
      data.data.set([0, 0, 0, Math.round(215 * (1 - w) ** 1.5)], i * 4);  // dark where it did not look
    }
  }
  cg.putImageData(data, 0, 0);
  g.imageSmoothingEnabled = true;
  g.imageSmoothingQuality = "high";
  g.drawImage(cells, 0, 0, size, size);  // upsampled smoothly, as the paper's figures are
}

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Caption", view,
    lead: "Choose or upload an image. The caption appears word by word; under each word, where the model looked "
      + "while choosing it (bright: its most attended cells, dark: its least). Hover a word to show it large." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  // a link's image, else the example the views share (the last image captioned, or the first on load)
  const st = {
    model: pickModel(models, params.model), image: params.image ?? (example.image || SAMPLES[0]),
    beam: num(params.beam, 3), word: num(params.word, -1),
    style: params.style === "heat" ? "heat" : "dim",
  };
  let img = null, blob = null, answer = null, timer = null;
  const save = () => writeHash(ID, { model: st.model, image: st.image, beam: st.beam,
    word: st.word >= 0 ? st.word : "", style: st.style });

  const file = h("input", { type: "file", accept: "image/*", "data-role": "upload", onchange: () => upload() });
  const beamInput = h("input", { type: "number", min: 1, max: 16, value: st.beam, "data-role": "beam" });
  const styleSel = h("select", { onchange: () => { st.style = styleSel.value; save(); drawMain(); drawStrip(); } },
    h("option", { value: "dim" }, "dim the rest"), h("option", { value: "heat" }, "heat map"));
  styleSel.value = st.style;
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Caption");
  const samples = h("div", { class: "samples" });
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  root.append(h("div", { class: "panel" },
    h("div", { class: "controls" }, labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); })),
      labeled("upload", file), labeled("beam", beamInput), labeled("show", styleSel), go),
    h("div", { class: "controls" }, h("span", { class: "muted" }, "or choose:"), samples), msg));
  const sampleCanvases = SAMPLES.map((name) => {
    const c = h("canvas", { width: 64, height: 64, title: name, "data-sample": name,
      onclick: () => { st.image = name; save(); pickSample(name).then(run); } });
    loadImage(`samples/${name}.png`).then((im) => c.getContext("2d").drawImage(im, 0, 0, 64, 64)).catch(() => {});
    return c;
  });
  samples.append(...sampleCanvases);

  const main = h("canvas", { "data-role": "image", style: { width: `${SIZE}px`, height: `${SIZE}px` } });
  const captionBox = h("div", { class: "output", "data-role": "caption" });
  const scoreBox = h("div", { class: "score" });
  const strip = h("div", { class: "word-strip", "data-role": "words" });
  root.append(h("div", { class: "panel" }, h("div", { class: "caption-stage" }, main,
    h("div", { style: { flex: "1 1 300px" } }, h("h3", {}, "Caption"), captionBox, scoreBox, strip))));

  function markSample() {
    for (const c of sampleCanvases) c.classList.toggle("on", c.dataset.sample === st.image);
  }

  async function pickSample(name) {
    markSample();
    const res = await fetch(`samples/${name}.png`);
    blob = await res.blob();
    img = await loadImage(URL.createObjectURL(blob));
    answer = null;
    drawMain(); drawStrip();
  }

  async function upload() {
    const f = file.files && file.files[0];
    if (!f) return;
    st.image = "upload"; save(); markSample();
    blob = f;
    try { img = await loadImage(URL.createObjectURL(f)); } catch (e) { status(msg, e.message, true); return; }
    answer = null;
    drawMain(); drawStrip();
    run();
  }

  function words() { return answer ? answer.words : []; }

  function drawMain() {
    if (!img) return;
    const i = st.word;
    const w = answer && i >= 0 && answer.attention ? answer.attention[i] : null;
    drawAttended(main, img, w, answer?.grid, SIZE, { heat: st.style === "heat" });
    main.dataset.word = w ? i : "";
  }

  function drawStrip(upTo = null) {
    strip.replaceChildren();
    if (!answer || !img) return;
    const n = upTo == null ? words().length : upTo;
    words().slice(0, n).forEach((word, i) => {
      const c = document.createElement("canvas");
      drawAttended(c, img, answer.attention?.[i], answer.grid, 112, { heat: st.style === "heat" });
      const fig = h("figure", { class: i === st.word ? "hot" : "", "data-i": i,
        onmouseenter: () => focus(i), onclick: () => focus(i) }, c, h("figcaption", {}, word));
      strip.append(fig);
    });
  }

  function focus(i) {
    st.word = i; save();
    drawMain();
    for (const f of strip.children) f.classList.toggle("hot", +f.dataset.i === i);
    for (const e of captionBox.children) e.classList.toggle("hot", +e.dataset.i === i);
  }

  async function run() {
    if (!blob) { status(msg, "choose or upload an image first", true); return; }
    st.beam = Math.max(1, num(beamInput.value, 3)); save();
    clearTimeout(timer);
    const form = new FormData();
    form.append("model", st.model);
    form.append("image", blob, st.image === "upload" && blob.name ? blob.name : `${st.image}.png`);
    form.append("beam", String(st.beam));
    form.append("attention", "true");
    setExample({ image: st.image, blob: st.image === "upload" ? blob : null });
    await work.run(async (signal) => {
      status(msg, "captioning…");
      const t0 = performance.now();
      answer = await postForm("/v1/caption", form, { signal });
      const ms = performance.now() - t0;
      // word by word: each word and its heat map appear in turn
      const ws = words();
      const want = st.word;
      captionBox.replaceChildren();
      for (let i = 0; i < ws.length; i++) {
        signal.throwIfAborted();
        captionBox.append(h("span", { class: "tok new", "data-i": i, onmouseenter: () => focus(i) }, ws[i]), " ");
        st.word = i; drawMain(); drawStrip(i + 1);
        await new Promise((r) => { timer = setTimeout(r, REVEAL_MS); });
      }
      focus(want >= 0 && want < ws.length ? want : 0);
      scoreBox.textContent = answer.score != null ? `log p = ${(+answer.score).toFixed(3)} · ${(ms / 1000).toFixed(2)} s` : "";
      status(msg, `${ws.length} words, attention over a ${answer.grid?.join("×") ?? "?"} grid`);
    });
  }

  view.exportPNG = () => {
    // the image and every word's map in one sheet
    const ws = words(), per = 6, cell = 130;
    const c = document.createElement("canvas");
    const rows = Math.ceil(ws.length / per);
    c.width = Math.max(SIZE, per * cell); c.height = SIZE + 10 + rows * (cell + 20);
    const g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    g.drawImage(main, 0, 0, SIZE, SIZE);
    g.font = '13px "DejaVu Sans Mono", monospace'; g.fillStyle = "#1d2330"; g.textAlign = "center";
    [...strip.querySelectorAll("canvas")].forEach((wc, i) => {
      const x = (i % per) * cell, y = SIZE + 10 + Math.floor(i / per) * (cell + 20);
      g.drawImage(wc, x + 4, y, 120, 120);
      g.fillText(ws[i], x + 64, y + 134);
    });
    return [{ canvas: c, title: answer ? answer.caption : "" }];
  };
  view.exportJSON = () => ({ view: ID, model: st.model, image: st.image, beam: st.beam, answer });
  view.restore = (p) => {
    st.word = num(p.word, -1);
    if (p.image && SAMPLES.includes(p.image)) { st.image = p.image; pickSample(p.image).then(run); }
  };
  view.unmount = () => { work.abort(); clearTimeout(timer); };
  view.run = run;
  if (SAMPLES.includes(st.image)) {
    view.first = pickSample(st.image).then(run).catch((e) => status(msg, e.message, true));
  } else if (st.image === "upload" && example.image === "upload" && example.blob) {  // the image uploaded before
    blob = example.blob;
    view.first = loadImage(URL.createObjectURL(blob)).then((im) => { img = im; drawMain(); return run(); })
      .catch((e) => status(msg, e.message, true));
  }
  return view;
}

export default { id: ID, title: "Caption", mount, needs: NEEDS };
