// Colour maps as 256-entry RGB lookup tables (Uint8Array of 768), built once from a few control points.

function table(stops) {
  const lut = new Uint8Array(256 * 3);
  for (let i = 0; i < 256; i++) {
    const t = i / 255;
    let k = 0;
    while (k < stops.length - 2 && t > stops[k + 1][0]) k++;
    const [t0, c0] = stops[k], [t1, c1] = stops[k + 1];
    const f = t1 > t0 ? Math.min(1, Math.max(0, (t - t0) / (t1 - t0))) : 0;
    for (let c = 0; c < 3; c++) lut[i * 3 + c] = Math.round(c0[c] + f * (c1[c] - c0[c]));
  }
  return lut;
}

const hex = (h) => [1, 3, 5].map((i) => parseInt(h.slice(i, i + 2), 16));
const even = (colors) => colors.map((c, i) => [i / (colors.length - 1), hex(c)]);

export const CMAPS = {
  // matplotlib's viridis, sampled at nine points
  viridis: table(even(["#440154", "#472c7a", "#3b518b", "#2c718e", "#21908d", "#27ad81", "#5cc863", "#aadc32",
    "#fde725"])),
  // Bahdanau et al.'s figure 3: black for no attention, white for all of it
  gray: table(even(["#000000", "#ffffff"])),
  // white to deep blue: attention on a light page
  blues: table(even(["#ffffff", "#dbe7f7", "#9fc3e8", "#5592cf", "#2562ad", "#0b3a7e"])),
  // negative blue, zero white, positive red (positional encodings, dot products)
  diverging: table(even(["#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b"])),
  // the caption view's heat over the image (transparent where cold, set by alpha elsewhere)
  heat: table(even(["#000000", "#3b0f70", "#8c2981", "#de4968", "#fe9f6d", "#fcfdbf"])),
};

export function rgb(cmap, t) {
  const lut = CMAPS[cmap] || CMAPS.viridis;
  const i = Math.max(0, Math.min(255, Math.round(t * 255))) * 3;
  return `rgb(${lut[i]},${lut[i + 1]},${lut[i + 2]})`;
}

/** A horizontal colour bar canvas for a legend. */
export function colorbar(cmap, width = 120, height = 10) {
  const c = document.createElement("canvas");
  c.width = width; c.height = height;
  const ctx = c.getContext("2d");
  for (let x = 0; x < width; x++) {
    ctx.fillStyle = rgb(cmap, x / (width - 1));
    ctx.fillRect(x, 0, 1, height);
  }
  return c;
}
