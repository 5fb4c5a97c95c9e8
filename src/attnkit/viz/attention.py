"""Attention maps as heatmaps, with the tokens on the axes (Bahdanau et al., figure 3)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen needed
import matplotlib.pyplot as plt
import numpy as np


def plot_attention(weights, source: list[str], target: list[str], path: str | Path, title: str = "") -> Path:
    """weights [len(target), len(source)]: row i is where output token i looked.

    Writes a PNG (or any format matplotlib knows from the suffix) and returns its path.
    """
    w = np.asarray(weights, dtype=float)
    if w.shape != (len(target), len(source)):
        raise ValueError(f"weights of shape {w.shape} do not match {len(target)} target x {len(source)} source labels")
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * len(source) + 1.5), max(3, 0.35 * len(target) + 1.2)))
    ax.imshow(w, cmap="gray_r", vmin=0.0, vmax=max(w.max(), 1e-9), aspect="auto")
    ax.set_xticks(range(len(source)), source, rotation=90)
    ax.set_yticks(range(len(target)), target)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
