// The view's state in the URL's hash: #view?key=value&... — a link reproduces what it shows.

export function readHash() {
  const raw = decodeURIComponent(location.hash.replace(/^#\/?/, "").split("?")[0] || "");
  const query = location.hash.includes("?") ? location.hash.slice(location.hash.indexOf("?") + 1) : "";
  const params = {};
  for (const [k, v] of new URLSearchParams(query)) params[k] = v;
  return { view: raw, params };
}

export function hashFor(view, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    q.set(k, Array.isArray(v) ? v.join(",") : String(v));
  }
  const s = q.toString();
  return `#${view}${s ? `?${s}` : ""}`;
}

/** Record the state without reloading or adding a history entry for every keystroke. */
export function writeHash(view, params) {
  const h = hashFor(view, params);
  if (h !== location.hash) history.replaceState(null, "", h);
}

export const num = (v, d) => (v === undefined || v === null || v === "" || Number.isNaN(+v) ? d : +v);
export const list = (v) => (v ? String(v).split(",").filter((x) => x !== "") : []);

// --- the example the views share: what was last run in any view (a sentence to translate, a language model's
// prompt, a captioner's image, a classifier's sentence), so that a view opens on it and shows its result, not an
// empty form. On load it holds a first example for the served models.

const ENGLISH_SOURCE = "A dog is running through the grass.";  // Multi30k's and Tatoeba's: English
const LM_PROMPT = "the";
const IMAGE = "dog";  // one of static/samples/*.png

/** The current example: {src, model (the translation model that read it), prompt, lm, image, blob, text, pair,
 * classifier (the classifier that read text, and pair when it reads pairs)}. */
export const example = { src: "", model: "", prompt: "", lm: "", image: "", blob: null, text: "", pair: "",
  classifier: "" };

export function setExample(patch) {
  Object.assign(example, patch);
}

/** A first sentence for a translation model: the example GET /v1/models gives for it, else English. */
export function firstSource(m) {
  return m.example ? String(m.example) : ENGLISH_SOURCE;
}

/** Whether a classifier reads sentence pairs, as GET /v1/models says. */
export function readsPairs(m) {
  return !!m.pairs;
}

/** A first second sentence for a classifier of pairs: the one GET /v1/models gives, else empty. */
export function firstPair(m) {
  return m.example_pair != null ? String(m.example_pair) : "";
}

/** Fill in the first example for ``models`` (normalized: capabilities a Set). */
export function seedExample(models) {
  const mt = models.find((m) => m.capabilities.has("translate") && m.capabilities.has("attention"))
    ?? models.find((m) => m.capabilities.has("translate"));
  const lm = models.find((m) => m.capabilities.has("generate"));
  const cls = models.find((m) => m.capabilities.has("classify"));
  setExample({
    src: mt ? firstSource(mt) : "", model: mt ? mt.name : "",
    prompt: lm ? (lm.example != null ? String(lm.example) : LM_PROMPT) : "", lm: lm ? lm.name : "",
    image: models.some((m) => m.capabilities.has("caption")) ? IMAGE : "", blob: null,
    text: cls && cls.example != null ? String(cls.example) : "", pair: cls && readsPairs(cls) ? firstPair(cls) : "",
    classifier: cls ? cls.name : "",
  });
}

/** The model a view opens with: the link's, else the example's when the view can use it, else the first. */
export function pickModel(models, ...wanted) {
  for (const name of wanted) if (name && models.some((m) => m.name === name)) return name;
  return models[0].name;
}
