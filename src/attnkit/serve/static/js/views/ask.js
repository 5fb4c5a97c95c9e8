// Ask: an image and a question about it; the answer's probabilities and, for each glimpse, where the model looked.
// Editing the question re-answers at once: the same image, another question, another map (Show, Ask, Attend and
// Answer's point).

import { postForm } from "../api.js";
import { pickModel, writeHash } from "../state.js";
import { h, header, job, labeled, modelSelect, noModel, status } from "../ui.js";
import { drawAttended } from "./caption.js";

const ID = "ask";
const SAMPLES = ["vqa_triangle", "vqa_1", "vqa_2"];  // easy-VQA test images (static/samples)
const SIZE = 256;
const DEBOUNCE_MS = 250;  // after the last keystroke, the question is answered again
const NEEDS = { what: "visual question answering model", capability: "answer", has: (m) => m.capabilities.has("answer"),
  start: "a Show, Ask, Attend and Answer checkpoint, e.g. a run of configs/easy_vqa.toml (make easy-vqa)" };

function loadImage(src) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("cannot read this image"));
    img.src = src;
  });
}

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Ask", view,
    lead: "Choose or upload an image and ask a question about it. The answer's probabilities appear beside each "
      + "glimpse's attention over the image (bright: where it looked). Edit the question: it is answered again." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  const first = models.find((m) => m.name === params.model) ?? models[0];
  const st = { model: pickModel(models, params.model), image: params.image ?? SAMPLES[0],
    question: params.question ?? (first.example || "what color is the shape?") };
  let img = null, blob = null, answer = null, timer = null;
  const save = () => writeHash(ID, { model: st.model, image: st.image, question: st.question });

  const file = h("input", { type: "file", accept: "image/*", "data-role": "upload", onchange: () => upload() });
  const questionInput = h("input", { type: "text", value: st.question, size: 40, "data-role": "question",
    oninput: () => { clearTimeout(timer); timer = setTimeout(run, DEBOUNCE_MS); } });
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Answer");
  const samples = h("div", { class: "samples" });
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  root.append(h("div", { class: "panel" },
    h("div", { class: "controls" }, labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); run(); })),
      labeled("upload", file), labeled("question", questionInput), go),
    h("div", { class: "controls" }, h("span", { class: "muted" }, "or choose:"), samples), msg));
  const sampleCanvases = SAMPLES.map((name) => {
    const c = h("canvas", { width: 64, height: 64, title: name, "data-sample": name,
      onclick: () => { st.image = name; save(); pickSample(name).then(run); } });
    loadImage(`samples/${name}.png`).then((im) => c.getContext("2d").drawImage(im, 0, 0, 64, 64)).catch(() => {});
    return c;
  });
  samples.append(...sampleCanvases);

  const main = h("canvas", { "data-role": "image", style: { width: `${SIZE}px`, height: `${SIZE}px` } });
  const answerBox = h("div", { class: "output", "data-role": "answer" });
  const bars = h("div", { "data-role": "probabilities" });
  const maps = h("div", { class: "word-strip", "data-role": "glimpses" });
  root.append(h("div", { class: "panel" }, h("div", { class: "caption-stage" }, main,
    h("div", { style: { flex: "1 1 300px" } }, h("h3", {}, "Answer"), answerBox, bars, h("h3", {}, "Glimpses"), maps))));

  async function pickSample(name) {
    for (const c of sampleCanvases) c.classList.toggle("on", c.dataset.sample === name);
    const res = await fetch(`samples/${name}.png`);
    blob = await res.blob();
    img = await loadImage(URL.createObjectURL(blob));
    drawAttended(main, img, null, null, SIZE);
  }

  async function upload() {
    const f = file.files && file.files[0];
    if (!f) return;
    st.image = "upload"; save();
    blob = f;
    try { img = await loadImage(URL.createObjectURL(f)); } catch (e) { status(msg, e.message, true); return; }
    drawAttended(main, img, null, null, SIZE);
    run();
  }

  function show() {
    answerBox.textContent = answer ? `${answer.answer} (${(answer.probability * 100).toFixed(1)}%)` : "";
    bars.replaceChildren();
    if (!answer) return;
    const ranked = Object.entries(answer.probabilities).sort((a, b) => b[1] - a[1]).slice(0, 6);
    for (const [name, p] of ranked) {
      bars.append(h("div", { class: "bar-row", "data-answer": name },
        h("span", { style: { display: "inline-block", width: "7em" } }, name),
        h("span", { style: { display: "inline-block", height: "0.8em", width: `${Math.round(p * 200)}px`,
          background: "#c0392b" } }), ` ${(p * 100).toFixed(1)}%`));
    }
    if (answer.unknown_words.length) {
      bars.append(h("div", { class: "muted" }, `never seen in training, read as <unk>: ${answer.unknown_words.join(" ")}`));
    }
    maps.replaceChildren();
    const glimpses = answer.glimpses || [];
    glimpses.forEach((g, k) => {
      const c = document.createElement("canvas");
      drawAttended(c, img, g.flat(), answer.grid, 128, { heat: true });
      maps.append(h("figure", { "data-glimpse": k }, c, h("figcaption", {}, `glimpse ${k + 1}`)));
    });
    drawAttended(main, img, glimpses.length ? glimpses[0].flat() : null, answer.grid, SIZE);
    if (!glimpses.length) maps.append(h("span", { class: "muted" }, "this model does not look at the image"));
  }

  async function run() {
    clearTimeout(timer);
    if (!blob) { status(msg, "choose or upload an image first", true); return; }
    st.question = questionInput.value; save();
    if (!st.question.trim()) { status(msg, "ask a question", true); return; }
    const form = new FormData();
    form.append("model", st.model);
    form.append("image", blob, st.image === "upload" && blob.name ? blob.name : `${st.image}.png`);
    form.append("question", st.question);
    await work.run(async (signal) => {
      status(msg, "answering…");
      answer = await postForm("/v1/answer", form, { signal });
      show();
      status(msg, `${(answer.glimpses || []).length} glimpses over a ${answer.grid.join("×")} grid`);
    });
  }

  view.exportPNG = () => {
    const cs = [main, ...maps.querySelectorAll("canvas")];
    const c = document.createElement("canvas");
    c.width = SIZE + cs.length * 136; c.height = SIZE + 30;
    const g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    g.drawImage(main, 0, 0, SIZE, SIZE);
    cs.slice(1).forEach((m, i) => g.drawImage(m, SIZE + 8 + i * 136, 0, 128, 128));
    g.font = '13px "DejaVu Sans Mono", monospace'; g.fillStyle = "#1d2330";
    g.fillText(`${st.question} -> ${answer ? answer.answer : ""}`, 4, SIZE + 20);
    return [{ canvas: c, title: answer ? `${st.question} ${answer.answer}` : st.question }];
  };
  view.exportJSON = () => ({ view: ID, model: st.model, image: st.image, question: st.question, answer });
  view.restore = (p) => {
    if (p.question != null) questionInput.value = p.question;
    if (p.image && SAMPLES.includes(p.image)) { st.image = p.image; pickSample(p.image).then(run); } else run();
  };
  view.unmount = () => { work.abort(); clearTimeout(timer); };
  view.run = run;
  view.first = (SAMPLES.includes(st.image) ? pickSample(st.image) : pickSample(SAMPLES[0])).then(run)
    .catch((e) => status(msg, e.message, true));
  return view;
}

export default { id: ID, title: "Ask", mount, needs: NEEDS };
