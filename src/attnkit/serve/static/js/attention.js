// What the server's attention answers hold, in one shape for the views:
// {source: [tok], target: [tok], rowLabels: [tok], encoder|decoder|cross: Mat[layer][head], ...extra}

import { layersOf } from "./mat.js";
import { postJSONTimed } from "./api.js";

export const KINDS = [
  { key: "encoder", title: "Encoder self-attention", rows: "source", cols: "source" },
  { key: "decoder", title: "Decoder self-attention", rows: "target", cols: "target" },
  { key: "cross", title: "Cross-attention", rows: "target", cols: "source" },
];

function tokensOf(x) {
  if (!x) return [];
  if (Array.isArray(x)) return x.map(String);
  return String(x).split(/\s+/).filter(Boolean);
}

/** The label of each row of a decoder-side map: the token predicted there (row t reads the target up to t). */
export function predictedLabels(target) {
  if (target.length && (target[0] === "<s>" || target[0] === "<bos>")) return [...target.slice(1), "</s>"];
  return target;
}

export function normalizeAttention(body) {
  const a = body.attention && !Array.isArray(body.attention) && typeof body.attention === "object" && !body.attention.shape
    ? { ...body, ...body.attention } : body;
  const source = tokensOf(a.source_tokens ?? a.source);
  const target = tokensOf(a.target_tokens ?? a.target);
  const out = {
    raw: body, source, target,
    encoder: layersOf(a.encoder), decoder: layersOf(a.decoder), cross: layersOf(a.cross),
  };
  out.rowLabels = predictedLabels(target);
  // a language model reads its own text: the decoder's rows are the tokens themselves
  out.decoderRows = target;
  return out;
}

/** POST /v1/attention and normalise the answer. */
export async function fetchAttention(body, opts) {
  const r = await postJSONTimed("/v1/attention", body, opts);
  const t0 = performance.now();
  const att = normalizeAttention(r.body);
  att.timing = { wait_ms: r.wait_ms, parse_ms: r.parse_ms, convert_ms: performance.now() - t0, bytes: r.bytes };
  return att;
}

/** Axis labels of a kind's maps: [rowLabels, colLabels]. */
export function axes(att, kind) {
  if (kind === "encoder") return [att.source, att.source];
  if (kind === "decoder") return [att.target, att.target];
  return [att.rowLabels.length === (att.cross[0]?.[0]?.rows ?? -1) ? att.rowLabels : att.target, att.source];
}

/** The JSON the views export: tokens and every map as nested lists rounded to 4 decimals. */
export function attentionJSON(att) {
  const maps = (layers) => layers.map((heads) => heads.map((m) => m.toNested()));
  return { source: att.source, target: att.target, encoder: maps(att.encoder), decoder: maps(att.decoder),
    cross: maps(att.cross) };
}
