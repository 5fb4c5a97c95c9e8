// Attention matrices as flat Float32Arrays, and the conversions from what the server sends.

export class Mat {
  constructor(rows, cols, data) {
    this.rows = rows; this.cols = cols;
    this.data = data || new Float32Array(rows * cols);
  }
  get(r, c) { return this.data[r * this.cols + c]; }
  row(r) { return this.data.subarray(r * this.cols, (r + 1) * this.cols); }
  max() { let m = 0; for (const v of this.data) if (v > m) m = v; return m; }
  min() { let m = Infinity; for (const v of this.data) if (v < m) m = v; return m === Infinity ? 0 : m; }
  /** Nested rows (for JSON export), values rounded to 4 decimals. */
  toNested(digits = 4) {
    const f = 10 ** digits, out = [];
    for (let r = 0; r < this.rows; r++) out.push(Array.from(this.row(r), (v) => Math.round(v * f) / f));
    return out;
  }
  static fromNested(rows) {
    const n = rows.length, m = n ? rows[0].length : 0, mat = new Mat(n, m);
    for (let r = 0; r < n; r++) {
      const row = rows[r];
      for (let c = 0; c < m; c++) mat.data[r * m + c] = +row[c] || 0;
    }
    return mat;
  }
  static average(mats) {
    const first = mats[0], out = new Mat(first.rows, first.cols);
    for (const m of mats) for (let i = 0; i < out.data.length; i++) out.data[i] += m.data[i];
    for (let i = 0; i < out.data.length; i++) out.data[i] /= mats.length;
    return out;
  }
}

function depth(x) {
  let d = 0;
  while (Array.isArray(x)) { d++; x = x[0]; }
  return d;
}

function decodeBase64(b64, dtype) {
  const bin = atob(b64), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  if (dtype === "float32") return new Float32Array(bytes.buffer);
  if (dtype === "uint8") return Float32Array.from(bytes, (v) => v / 255);
  if (dtype === "float16") {
    const h = new Uint16Array(bytes.buffer), out = new Float32Array(h.length);
    for (let i = 0; i < h.length; i++) {
      const s = h[i] & 0x8000 ? -1 : 1, e = (h[i] >> 10) & 0x1f, f = h[i] & 0x3ff;
      out[i] = e === 0 ? s * 2 ** -14 * (f / 1024) : e === 31 ? (f ? NaN : s * Infinity) : s * 2 ** (e - 15) * (1 + f / 1024);
    }
    return out;
  }
  throw new Error(`unknown dtype ${dtype}`);
}

/**
 * One kind of attention (encoder, decoder or cross) as layers of heads of Mats: Mat[layer][head].
 * Accepts nested lists [layer][head][q][k] (or [layer][q][k] for single-head models), or a packed form
 * {shape: [L, H, Q, K], data: [...] | base64, dtype}.
 */
export function layersOf(x) {
  if (x == null) return [];
  if (!Array.isArray(x) && typeof x === "object" && x.shape) {
    const [L, H, Q, K] = x.shape.length === 4 ? x.shape : [1, ...x.shape.slice(-3)];
    const flat = typeof x.data === "string" ? decodeBase64(x.data, x.dtype || "float32") : Float32Array.from(x.data);
    const out = [];
    for (let l = 0; l < L; l++) {
      const heads = [];
      for (let h = 0; h < H; h++) {
        const off = ((l * H) + h) * Q * K;
        heads.push(new Mat(Q, K, flat.slice(off, off + Q * K)));
      }
      out.push(heads);
    }
    return out;
  }
  if (!Array.isArray(x) || !x.length) return [];
  const d = depth(x);
  if (d === 4) return x.map((layer) => layer.map((head) => Mat.fromNested(head)));
  if (d === 3) return x.map((head) => [Mat.fromNested(head)]);  // [layer][q][k]: one head per layer
  if (d === 2) return [[Mat.fromNested(x)]];
  throw new Error("attention: expected [layer][head][query][key] arrays");
}

/** The map to show: one head, or the mean over heads ("avg"). */
export function pick(layers, layer, head) {
  const heads = layers[Math.min(layer, layers.length - 1)];
  if (!heads) return null;
  if (head === "avg" || head == null || head === "") {
    if (!heads.avg) heads.avg = heads.length === 1 ? heads[0] : Mat.average(heads);
    return heads.avg;
  }
  return heads[Math.min(+head, heads.length - 1)];
}
