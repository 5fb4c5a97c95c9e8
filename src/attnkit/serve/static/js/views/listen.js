// Listen: a clip (the sample, or an upload) is transcribed as a stream: each character appears as the search
// decides it, with its attention over the frames drawn as it comes; then the spectrogram, and under it each
// character's attention (LAS's alignment). A click on a character plays the stretch of sound it attended to.

import { postStream } from "../api.js";
import { CMAPS } from "../colormap.js";
import { pickModel, writeHash } from "../state.js";
import { h, header, job, labeled, modelSelect, noModel, status } from "../ui.js";

const ID = "listen";
const SAMPLE = "samples/digits.wav";
const WIDTH = 720, SPEC_H = 120, ATT_H = 60;
const NEEDS = { what: "speech model", capability: "transcribe", has: (m) => m.capabilities.has("transcribe"),
  start: "a LAS or Speech Transformer checkpoint, e.g. a run of configs/fsdd_digits_las.toml" };

/** The log-mel frames [T][F] as an image, low bands at the bottom, over ``width`` x ``height`` pixels. */
function drawSpectrogram(canvas, frames, width, height) {
  canvas.width = width; canvas.height = height;
  const g = canvas.getContext("2d");
  if (!frames || !frames.length) return;
  const t = frames.length, f = frames[0].length, cells = document.createElement("canvas");
  cells.width = t; cells.height = f;
  const cg = cells.getContext("2d"), data = cg.createImageData(t, f), lut = CMAPS.heat;
  let lo = Infinity, hi = -Infinity;
  for (const row of frames) for (const v of row) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const span = Math.max(hi - lo, 1e-9);
  for (let x = 0; x < t; x++) {
    for (let y = 0; y < f; y++) {
      const k = Math.round(((frames[x][y] - lo) / span) * 255) * 3;
      data.data.set([lut[k], lut[k + 1], lut[k + 2], 255], ((f - 1 - y) * t + x) * 4);
    }
  }
  cg.putImageData(data, 0, 0);
  g.imageSmoothingEnabled = false;
  g.drawImage(cells, 0, 0, width, height);
}

/** One character's attention over the encoder's frames: a bar per frame, on the spectrogram's time axis. While
 * the search runs the frames' times are not known yet: the frames then share the width evenly (they are evenly
 * spaced in time). */
function drawAttention(canvas, weights, frames, seconds, width, height) {
  canvas.width = width; canvas.height = height;
  const g = canvas.getContext("2d");
  g.fillStyle = "#f4f4f4"; g.fillRect(0, 0, width, height);
  if (!weights) return;
  const top = Math.max(...weights, 1e-9);
  g.fillStyle = "#c0392b";
  weights.forEach((w, u) => {
    const [a, b] = frames ? frames[u] : [(u * seconds) / weights.length, ((u + 1) * seconds) / weights.length];
    const x = (a / seconds) * width, bw = Math.max(1, ((b - a) / seconds) * width - 1);
    g.fillRect(x, height * (1 - w / top), bw, height * (w / top));
  });
}

/** The stretch a character attended to: from its most attended frame, widened over its neighbours above a fifth
 * of that weight. */
function attendedSpan(weights, frames) {
  const k = weights.indexOf(Math.max(...weights));
  let lo = k, hi = k;
  while (lo > 0 && weights[lo - 1] > weights[k] / 5) lo--;
  while (hi < weights.length - 1 && weights[hi + 1] > weights[k] / 5) hi++;
  return [frames[lo][0], frames[hi][1]];
}

function mount(root, ctx, params) {
  const models = ctx.modelsFor(NEEDS.has);
  const view = { id: ID };
  header(root, { title: "Listen", view,
    lead: "Transcribe the sample clip or upload one (WAV, FLAC, OGG). The transcript appears character by "
      + "character; under the spectrogram, where each character listened. Click a character to hear that stretch." });
  if (!models.length) { noModel(root, NEEDS); return view; }
  const st = { model: pickModel(models, params.model), char: -1 };
  let blob = null, answer = null, stopAt = null;
  const save = () => writeHash(ID, { model: st.model });

  const file = h("input", { type: "file", accept: "audio/*", "data-role": "upload", onchange: () => upload() });
  const go = h("button", { class: "primary", "data-role": "run", onclick: () => run() }, "Transcribe");
  const sample = h("button", { "data-role": "sample", onclick: () => pickSample().then(run) }, "sample clip");
  const msg = h("div", { class: "status", "data-role": "status" });
  const work = job(root, msg, go);
  const player = h("audio", { controls: true, "data-role": "audio" });
  player.addEventListener("timeupdate", () => {
    if (stopAt != null && player.currentTime >= stopAt) { player.pause(); stopAt = null; }
  });
  root.append(h("div", { class: "panel" },
    h("div", { class: "controls" }, labeled("model", modelSelect(models, st.model, (v) => { st.model = v; save(); })),
      labeled("upload", file), sample, go), msg, player));
  const spec = h("canvas", { "data-role": "spectrogram", style: { width: `${WIDTH}px`, height: `${SPEC_H}px` } });
  const att = h("canvas", { "data-role": "attention", style: { width: `${WIDTH}px`, height: `${ATT_H}px` } });
  const text = h("div", { class: "output", "data-role": "transcript" });
  root.append(h("div", { class: "panel" }, spec, att, h("h3", {}, "Transcript"), text));

  function setClip(b) {
    blob = b;
    player.src = URL.createObjectURL(b);
    answer = null; st.char = -1;
    text.replaceChildren(); drawSpectrogram(spec, null, WIDTH, SPEC_H); drawAttention(att, null, [], 1, WIDTH, ATT_H);
  }

  async function pickSample() {
    const res = await fetch(SAMPLE);
    setClip(await res.blob());
  }

  function upload() {
    const f = file.files && file.files[0];
    if (f) { setClip(f); run(); }
  }

  function show(i) {
    st.char = i;
    for (const s of text.querySelectorAll("span")) s.classList.toggle("hot", Number(s.dataset.i) === i);
    drawAttention(att, answer.attention?.[i], answer.frames, answer.seconds, WIDTH, ATT_H);
    att.dataset.char = String(i);
  }

  function play(i) {
    const [a, b] = attendedSpan(answer.attention[i], answer.frames);
    show(i);
    player.currentTime = a; stopAt = b;
    player.play().catch(() => {});
  }

  /** The characters as spans; once the answer is in, each shows its attention on hover and plays on a click. */
  function spell(chars) {
    text.replaceChildren(...chars.map((c, i) => h("span", answer
      ? { class: "char", "data-i": i, title: "click: play what it attended to", onmouseenter: () => show(i),
        onclick: () => play(i) }
      : { class: "char", "data-i": i },
    c === " " ? "\u2423" : c)));
  }

  /** A search step: the partial transcript, and its newest character's attention over the frames. */
  function step(e) {
    text.dataset.steps = String(Number(text.dataset.steps || 0) + 1);
    spell(e.tokens);
    const seconds = Number.isFinite(player.duration) ? player.duration : 1;
    if (e.attention) drawAttention(att, e.attention, null, seconds, WIDTH, ATT_H);
    att.dataset.char = String(e.tokens.length - 1);
  }

  function finish(a) {
    answer = a;
    drawSpectrogram(spec, answer.spectrogram, WIDTH, SPEC_H);
    status(msg, `${answer.transcript}  (${answer.seconds} s, log p = ${answer.score.toFixed(2)})`);
    spell(answer.characters);
    show(answer.characters.length - 1);
    text.dataset.done = "1";
  }

  async function run() {
    if (!blob) await pickSample();
    text.dataset.done = ""; text.dataset.steps = "0";
    answer = null;
    const form = new FormData();
    form.append("audio", blob, blob.name || "clip.wav");
    form.append("model", st.model);
    form.append("stream", "true");
    await work.run(async (signal) => {
      await postStream("/v1/transcribe", form, (name, data) => {
        if (name === "step") step(data);
        else if (name === "done" || name === "result") finish(data);
        else if (name === "error") throw new Error(data.error);
      }, { signal });
    });
  }

  view.exportPNG = () => [{ canvas: spec, title: answer ? answer.transcript : "" }];
  view.exportJSON = () => ({ view: ID, model: st.model, answer });
  view.unmount = () => { work.abort(); };
  view.run = run;
  view.first = pickSample().then(run).catch((e) => status(msg, e.message, true));
  return view;
}

export default { id: ID, title: "Listen", mount, needs: NEEDS };
