// BertViz's head view in SVG: the attending tokens on the left, the attended ones on the right, a line between
// each pair as strong as the attention. Hover a token to keep only its lines.

const NS = "http://www.w3.org/2000/svg";
const ROW = 19, TOP = 26, GAP = 150;
const MAX_LINES = 2500;  // beyond this many pairs, lines are drawn only for the hovered token

function el(name, attrs = {}, text = null) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}

function clip(s, n = 16) {
  s = String(s);
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}

export class HeadView {
  constructor(container, opts = {}) {
    this.opts = { color: "#2f6fde", ...opts };
    this.box = document.createElement("div");
    this.box.className = "headview";
    container.append(this.box);
    this.svg = el("svg", { xmlns: NS });
    this.box.append(this.svg);
    this.mat = null; this.focusRow = null; this.focusCol = null;
  }

  set(mat, left, right, info = {}) {
    this.mat = mat; this.left = left; this.right = right; this.info = info;
    this.render();
  }

  /** Keep only the lines of one attending token (row), or of one attended token (col); null for all. */
  focus(row, col = null) {
    if (row === this.focusRow && col === this.focusCol) return;
    this.focusRow = row; this.focusCol = col;
    this._links();
    this._marks();
  }

  render() {
    const svg = this.svg;
    svg.replaceChildren();
    if (!this.mat) return;
    const { left, right } = this;
    const probe = document.createElement("canvas").getContext("2d");
    probe.font = '13px ui-monospace, "DejaVu Sans Mono", monospace';
    const wl = Math.max(40, ...left.map((s) => probe.measureText(clip(s)).width)) + 12;
    const wr = Math.max(40, ...right.map((s) => probe.measureText(clip(s)).width)) + 12;
    this.xl = wl; this.xr = wl + GAP;
    const H = TOP + Math.max(left.length, right.length) * ROW + 8, W = this.xr + wr;
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.append(el("rect", { x: 0, y: 0, width: W, height: H, fill: "#fff" }));
    const t = this.info;
    svg.append(el("text", { x: this.xl - 6, y: 14, "text-anchor": "end", class: "axis" }, t.leftTitle || "query"));
    svg.append(el("text", { x: this.xr + 6, y: 14, class: "axis" }, t.rightTitle || "key"));
    this.bars = el("g");
    this.links = el("g", { stroke: this.opts.color, "stroke-linecap": "round" });
    svg.append(this.bars, this.links);
    this.leftText = left.map((s, i) => {
      const e = el("text", { x: this.xl - 6, y: TOP + i * ROW + 13, "text-anchor": "end", "data-side": "left",
        "data-i": i }, clip(s));
      e.addEventListener("mouseenter", () => this._hover(i, null));
      e.addEventListener("click", () => this.opts.onClick && this.opts.onClick(i));
      return e;
    });
    this.rightText = right.map((s, j) => {
      const e = el("text", { x: this.xr + 6, y: TOP + j * ROW + 13, "data-side": "right", "data-j": j }, clip(s));
      e.addEventListener("mouseenter", () => this._hover(null, j));
      return e;
    });
    svg.append(...this.leftText, ...this.rightText);
    svg.addEventListener("mouseleave", () => this._hover(null, null));
    this._links();
    this._marks();
  }

  _hover(row, col) {
    this.focus(row, col);
    if (this.opts.onHover) this.opts.onHover(row, col);
  }

  _links() {
    const g = this.links, mat = this.mat;
    if (!g || !mat) return;
    g.replaceChildren();
    const shown = this.info.rowsShown ?? mat.rows;
    const rows = this.focusRow != null ? [this.focusRow] : [...Array(Math.min(shown, mat.rows)).keys()];
    const cols = this.focusCol != null ? [this.focusCol] : [...Array(mat.cols).keys()];
    if (this.focusRow == null && this.focusCol == null && rows.length * cols.length > MAX_LINES) return;
    let max = 1e-9;
    for (const r of rows) for (const c of cols) max = Math.max(max, mat.get(r, c));
    const x1 = this.xl, x2 = this.xr;
    const frag = document.createDocumentFragment();
    for (const r of rows) {
      if (r >= shown) continue;
      for (const c of cols) {
        const w = mat.get(r, c) / max;
        if (w < 0.02) continue;
        const y1 = TOP + r * ROW + 9, y2 = TOP + c * ROW + 9;
        frag.append(el("line", { x1, y1, x2, y2, "stroke-opacity": w.toFixed(3), "stroke-width": (1 + 2.2 * w).toFixed(2) }));
      }
    }
    g.append(frag);
  }

  _marks() {
    if (!this.leftText) return;
    this.leftText.forEach((e, i) => e.classList.toggle("hot", i === this.focusRow));
    this.rightText.forEach((e, j) => e.classList.toggle("hot", j === this.focusCol));
    const g = this.bars;
    g.replaceChildren();
    const mat = this.mat;
    if (this.focusRow != null && this.focusRow < mat.rows) {  // how much each key gets from this token
      const row = mat.row(this.focusRow);
      const m = Math.max(...row, 1e-9);
      row.forEach((v, j) => g.append(el("rect", { x: this.xr + 2, y: TOP + j * ROW + 1, width: 4 + 60 * v / m,
        height: ROW - 3, fill: this.opts.color, "fill-opacity": (0.12 + 0.3 * v / m).toFixed(3) })));
    }
  }

  /** The SVG as a standalone file (fonts named, no page CSS needed). */
  serialize() {
    const copy = this.svg.cloneNode(true);
    copy.setAttribute("font-family", "DejaVu Sans Mono, monospace");
    copy.setAttribute("font-size", "13");
    return new XMLSerializer().serializeToString(copy);
  }
}
