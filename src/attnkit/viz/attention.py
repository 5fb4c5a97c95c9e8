"""Attention maps as heatmaps, with the tokens on the axes (Bahdanau et al., figure 3).

Every plot function returns a matplotlib ``Figure`` (shown inline when it is a notebook cell's value) and, given a
``path``, also writes it there. Figures are made without pyplot, so no backend is chosen or forced on import and
nothing needs a screen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write a figure (creating the folder); the format follows the suffix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def finish(fig: Figure, path: str | Path | None, dpi: int = 120) -> Figure:
    """Lay out ``fig``, write it to ``path`` if given, and return it."""
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path, dpi)
    return fig


def plot_attention(weights, source: list[str], target: list[str], path: str | Path | None = None,
                   title: str = "") -> Figure:
    """weights [len(target), len(source)]: row i is where output token i looked. -> the figure (also written to
    ``path``, a PNG or any format matplotlib knows from the suffix)."""
    w = np.asarray(weights, dtype=float)
    if w.shape != (len(target), len(source)):
        raise ValueError(f"weights of shape {w.shape} do not match {len(target)} target x {len(source)} source labels")
    fig = Figure(figsize=(max(4, 0.35 * len(source) + 1.5), max(3, 0.35 * len(target) + 1.2)))
    ax = fig.subplots()
    ax.imshow(w, cmap="gray_r", vmin=0.0, vmax=max(w.max(), 1e-9), aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=90)
    ax.set_yticks(range(len(target)), target)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title)
    return finish(fig, path, dpi=120)


def plot_caption_attention(image, words: list[str], alphas, grid: tuple[int, int], path: str | Path | None = None,
                           columns: int = 5) -> Figure:
    """Xu et al.'s figure: the image once, then one panel per word with its attention lit up.

    image [3, H, W] uint8 (or [H, W, 3]); alphas [len(words), h * w], row t over the grid cells;
    grid (h, w). The map is upsampled smoothly to the image size, as in the paper.
    """
    import torch
    import torch.nn.functional as F

    img = np.asarray(image)
    if img.shape[0] == 3:
        img = img.transpose(1, 2, 0)
    a = torch.as_tensor(np.asarray(alphas, dtype=np.float32))
    if a.shape != (len(words), grid[0] * grid[1]):
        raise ValueError(f"alphas of shape {tuple(a.shape)} do not match {len(words)} words x {grid} grid")
    maps = F.interpolate(a.view(len(words), 1, *grid), size=img.shape[:2], mode="bicubic", align_corners=False)
    maps = maps[:, 0].clamp(min=0).numpy()
    panels = len(words) + 1
    rows = -(-panels // columns)
    fig = Figure(figsize=(2.2 * columns, 2.4 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    axes.flat[0].imshow(img)
    axes.flat[0].set_title("image", fontsize=9)
    for t, (word, m) in enumerate(zip(words, maps), 1):
        ax = axes.flat[t]
        ax.imshow(img)
        ax.imshow(m / max(m.max(), 1e-9), cmap="gray", alpha=0.6, vmin=0, vmax=1)
        ax.set_title(word, fontsize=10)
    return finish(fig, path, dpi=100)


def plot_speech_attention(features, characters: list[str], attention, time_reduction: int,
                          path: str | Path | None = None, hop_seconds: float = 0.01) -> Figure:
    """The LAS paper's alignment figure: the utterance's log-mel frames [T, F] on top, and below each output
    character's attention [len(characters), U] over the encoder's frames (each ``time_reduction`` feature frames),
    both on one time axis in seconds."""
    features = np.asarray(features, dtype=np.float32)
    weights = np.asarray(attention, dtype=np.float32)
    seconds = features.shape[0] * hop_seconds
    fig = Figure(figsize=(max(6.0, seconds * 2.5), 2.0 + 0.22 * len(characters)))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, max(1.0, len(characters) / 8)]})
    top.imshow(features.T, origin="lower", aspect="auto", cmap="magma", extent=(0, seconds, 0, features.shape[1]))
    top.set_ylabel("mel band")
    span = weights.shape[1] * time_reduction * hop_seconds
    bottom.imshow(weights, aspect="auto", cmap="Greys", extent=(0, span, len(characters) - 0.5, -0.5),
                  vmin=0.0, vmax=max(float(weights.max()), 1e-6))
    bottom.set_yticks(range(len(characters)), [c if c.strip() else "␣" for c in characters])
    bottom.set_xlabel("time (s)")
    bottom.set_ylabel("output")
    fig.tight_layout()
    return finish(fig, path)
