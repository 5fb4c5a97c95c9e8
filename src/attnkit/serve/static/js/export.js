// Downloads: PNG of the view's canvases, SVG where the view draws one, the view's data as JSON.
// window.attnkit.lastExport records each export (name, type, bytes) so tests can see it happened.

function stamp() {
  return new Date().toISOString().replace(/[-:]/g, "").replace(/\..*/, "");
}

function record(name, type, size) {
  window.attnkit = window.attnkit || {};
  window.attnkit.lastExport = { name, type, size };
  window.attnkit.exports = (window.attnkit.exports || 0) + 1;
}

export function download(blob, name) {
  record(name, blob.type, blob.size);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

/**
 * Stack several canvases (with optional titles) into one PNG, top to bottom.
 * items: [{canvas, title}] — canvases keep their pixel size.
 */
export function composite(items, { background = "#fff", pad = 12 } = {}) {
  const list = items.filter((it) => it.canvas && it.canvas.width && it.canvas.height);
  const titleH = 20;
  const W = Math.max(200, ...list.map((it) => it.canvas.width)) + 2 * pad;
  const H = list.reduce((h, it) => h + it.canvas.height + (it.title ? titleH : 0) + pad, pad);
  const out = document.createElement("canvas");
  out.width = W; out.height = H;
  const ctx = out.getContext("2d");
  ctx.fillStyle = background; ctx.fillRect(0, 0, W, H);
  let y = pad;
  for (const it of list) {
    if (it.title) {
      ctx.fillStyle = "#1d2330"; ctx.font = '13px "DejaVu Sans", sans-serif'; ctx.textBaseline = "top";
      ctx.fillText(it.title, pad, y + 2);
      y += titleH;
    }
    ctx.drawImage(it.canvas, pad, y);
    y += it.canvas.height + pad;
  }
  return out;
}

export function exportPNG(view, items) {
  const canvas = items.length === 1 && !items[0].title ? items[0].canvas : composite(items);
  canvas.toBlob((blob) => download(blob, `attnkit-${view}-${stamp()}.png`), "image/png");
}

export function exportSVG(view, svgText) {
  download(new Blob([svgText], { type: "image/svg+xml" }), `attnkit-${view}-${stamp()}.svg`);
}

export function exportJSON(view, data) {
  const text = JSON.stringify(data, null, 1);
  download(new Blob([text], { type: "application/json" }), `attnkit-${view}-${stamp()}.json`);
}
