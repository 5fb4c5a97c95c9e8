// One floating tooltip for the whole page.

let el = null;

export function showTip(x, y, text) {
  el = el || document.getElementById("tooltip");
  if (!el) return;
  el.textContent = text;
  el.hidden = false;
  const w = el.offsetWidth, h = el.offsetHeight;
  const left = x + 14 + w > window.innerWidth ? x - w - 10 : x + 14;
  const top = y + 16 + h > window.innerHeight ? y - h - 10 : y + 16;
  el.style.left = `${Math.max(2, left)}px`;
  el.style.top = `${Math.max(2, top)}px`;
}

export function hideTip() {
  el = el || document.getElementById("tooltip");
  if (el) el.hidden = true;
}
