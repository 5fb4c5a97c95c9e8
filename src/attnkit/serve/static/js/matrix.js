// Attention matrices on <canvas>: one pixel per cell painted through ImageData, scaled up without smoothing,
// token labels on both axes when the cells are big enough to carry them, hover read-out.

import { CMAPS, colorbar } from "./colormap.js";
import { hideTip, showTip } from "./tooltip.js";

const FONT = '12px ui-monospace, "DejaVu Sans Mono", monospace';
const EMPTY = [238, 240, 244];

/** Paint ``mat`` one pixel per cell into ``canvas`` (resized to cols x rows); rows >= rowsShown stay empty. */
export function paintCells(canvas, mat, { cmap = "viridis", vmin = 0, vmax = null, rowsShown = null } = {}) {
  const { rows, cols, data } = mat;
  if (canvas.width !== cols || canvas.height !== rows) { canvas.width = Math.max(1, cols); canvas.height = Math.max(1, rows); }
  if (!rows || !cols) return canvas;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows), px = img.data;
  const lut = CMAPS[cmap] || CMAPS.viridis;
  const hi = vmax == null ? Math.max(mat.max(), 1e-9) : vmax, scale = 255 / Math.max(hi - vmin, 1e-9);
  const shown = rowsShown == null ? rows : Math.min(rows, rowsShown);
  const n = shown * cols;
  for (let i = 0, p = 0; i < n; i++, p += 4) {
    let k = ((data[i] - vmin) * scale) | 0;
    k = k < 0 ? 0 : k > 255 ? 255 : k;
    px[p] = lut[k * 3]; px[p + 1] = lut[k * 3 + 1]; px[p + 2] = lut[k * 3 + 2]; px[p + 3] = 255;
  }
  for (let i = n, p = n * 4; i < rows * cols; i++, p += 4) {
    px[p] = EMPTY[0]; px[p + 1] = EMPTY[1]; px[p + 2] = EMPTY[2]; px[p + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  return canvas;
}

function clip(s, n = 14) {
  s = String(s);
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}

export class MatrixView {
  /**
   * @param container element the canvas (and legend) go into
   * @param opts {cmap, maxCell, minCell, onHover(row, col), onClick(row, col), xTitle, yTitle, legend}
   */
  constructor(container, opts = {}) {
    this.opts = { cmap: "viridis", maxCell: 26, minCell: 1, legend: true, ...opts };
    this.wrap = document.createElement("div");
    this.wrap.className = "matrix-wrap";
    this.canvas = document.createElement("canvas");
    this.canvas.className = "matrix";
    this.wrap.append(this.canvas);
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    container.append(this.wrap);
    if (this.opts.legend) container.append(this.legend);
    this.cells = document.createElement("canvas");
    this.mat = null; this.hot = { row: null, col: null };
    this.canvas.addEventListener("mousemove", (e) => this._move(e));
    this.canvas.addEventListener("mouseleave", () => { hideTip(); this._hover(null, null); });
    this.canvas.addEventListener("click", (e) => {
      const hit = this.hit(e);
      if (hit && this.opts.onClick) this.opts.onClick(hit.row, hit.col);
    });
  }

  /** Show a matrix: set(mat, {rowLabels, colLabels, rowsShown, vmax, title}) and draw it. */
  set(mat, info = {}) {
    this.mat = mat; this.info = info;
    if (mat) {
      this.cmap = info.cmap || this.opts.cmap;
      this.vmax = info.vmax ?? Math.max(mat.max(), 1e-9);
      this.vmin = info.vmin ?? 0;
      paintCells(this.cells, mat, { cmap: this.cmap, vmin: this.vmin, vmax: this.vmax, rowsShown: info.rowsShown ?? null });
    }
    this.draw();
  }

  highlight(row, col = null) {
    this.hot = { row, col };
    this.draw();
  }

  draw() {
    const mat = this.mat, canvas = this.canvas;
    const ctx = canvas.getContext("2d");
    if (!mat) { canvas.width = canvas.height = 0; return; }
    const { rowLabels = [], colLabels = [] } = this.info;
    const { cmap, vmax } = this;
    const avail = Math.max(200, (this.wrap.clientWidth || this.opts.width || 800) - 12);
    ctx.font = FONT;
    const widest = (labels) => labels.reduce((m, s) => Math.max(m, ctx.measureText(clip(s)).width), 0);
    let left = rowLabels.length ? Math.min(130, widest(rowLabels) + 10) : 14;
    let cell = Math.floor((avail - left) / Math.max(1, mat.cols));
    cell = Math.max(this.opts.minCell, Math.min(this.opts.maxCell, cell));
    const labels = cell >= 9;
    if (!labels) left = 14;
    const top = labels && colLabels.length ? Math.min(110, widest(colLabels) + 10) : 14;
    const W = left + mat.cols * cell + 6, H = top + mat.rows * cell + 6;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.ceil(W * dpr); canvas.height = Math.ceil(H * dpr);
    canvas.style.width = `${W}px`; canvas.style.height = `${H}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.cells, left, top, mat.cols * cell, mat.rows * cell);
    this.layout = { left, top, cell, labels };
    ctx.font = FONT;
    ctx.fillStyle = "#2a3140";
    if (labels) {
      const fs = Math.min(12, cell - 1);
      ctx.font = `${fs}px ui-monospace, "DejaVu Sans Mono", monospace`;
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      rowLabels.forEach((s, r) => {
        ctx.fillStyle = r === this.hot.row ? "#2f6fde" : "#2a3140";
        ctx.fillText(clip(s), left - 5, top + r * cell + cell / 2);
      });
      ctx.textAlign = "left";
      colLabels.forEach((s, c) => {
        ctx.save();
        ctx.translate(left + c * cell + cell / 2, top - 5);
        ctx.rotate(-Math.PI / 2);
        ctx.fillStyle = c === this.hot.col ? "#2f6fde" : "#2a3140";
        ctx.fillText(clip(s), 0, 0);
        ctx.restore();
      });
    }
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#ff5a36";
    if (this.hot.row != null && this.hot.row < mat.rows) {
      ctx.strokeRect(left - 1, top + this.hot.row * cell - 1, mat.cols * cell + 2, cell + 2);
    }
    if (this.hot.col != null && this.hot.col < mat.cols) {
      ctx.strokeRect(left + this.hot.col * cell - 1, top - 1, cell + 2, mat.rows * cell + 2);
    }
    if (this.opts.legend) {
      const [lo, hi] = this.info.range ?? [this.vmin, vmax];
      const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3));
      this.legend.replaceChildren(fmt(lo), colorbar(cmap), fmt(hi),
        document.createTextNode(`  ${mat.rows}×${mat.cols}${this.info.title ? ` · ${this.info.title}` : ""}`));
    }
  }

  /** The cell (or the row/column label) under a mouse event: {row, col} with -1 for a label. */
  hit(e) {
    if (!this.mat || !this.layout) return null;
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left, y = e.clientY - r.top;
    const { left, top, cell } = this.layout;
    const col = Math.floor((x - left) / cell), row = Math.floor((y - top) / cell);
    const inRow = row >= 0 && row < this.mat.rows, inCol = col >= 0 && col < this.mat.cols;
    if (inRow && inCol) return { row, col };
    if (inRow && x < left) return { row, col: -1 };
    if (inCol && y < top) return { row: -1, col };
    return null;
  }

  _move(e) {
    const hit = this.hit(e);
    if (!hit) { hideTip(); this._hover(null, null); return; }
    const { rowLabels = [], colLabels = [] } = this.info;
    const { row, col } = hit;
    if (row >= 0 && col >= 0) {
      const v = this.mat.get(row, col);
      showTip(e.clientX, e.clientY, `${rowLabels[row] ?? row} → ${colLabels[col] ?? col}\n${v.toFixed(4)}`);
    } else {
      hideTip();
    }
    this._hover(row >= 0 ? row : null, col >= 0 ? col : null);
  }

  _hover(row, col) {
    if (this.opts.onHover) this.opts.onHover(row, col);
  }
}
