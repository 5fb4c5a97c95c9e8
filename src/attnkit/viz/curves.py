"""Curves: BLEU against sentence length (Bahdanau et al., figure 2), and the cost of a layer against n."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from attnkit.viz.attention import finish


def bucket_label(row: dict) -> str:
    return f"{row['min_len']}+" if row["max_len"] is None else f"{row['min_len']}-{row['max_len']}"


def plot_bleu_by_length(systems: dict[str, list[dict]], path: str | Path | None = None, title: str = "",
                        xlabel: str = "source sentence length (words)") -> Figure:
    """systems: name -> the rows of ``attnkit.evaluate.bleu_by_length`` ({min_len, max_len, n, bleu}).

    One line per system over the union of their buckets, with each bucket's sentence count under
    its label (the systems should share one test set, so the counts agree).
    """
    buckets = sorted({(r["min_len"], r["max_len"] if r["max_len"] is not None else 10**9)
                      for rows in systems.values() for r in rows})
    position = {b: i for i, b in enumerate(buckets)}
    counts: dict[tuple, int] = {}
    fig = Figure(figsize=(max(5.0, 1.0 * len(buckets) + 2), 3.8))
    ax = fig.subplots()
    for name, rows in systems.items():
        xs, ys = [], []
        for r in sorted(rows, key=lambda r: r["min_len"]):
            b = (r["min_len"], r["max_len"] if r["max_len"] is not None else 10**9)
            xs.append(position[b])
            ys.append(r["bleu"])
            counts.setdefault(b, r["n"])
        ax.plot(xs, ys, marker="o", label=name)
    labels = []
    for lo, hi in buckets:
        row = {"min_len": lo, "max_len": None if hi == 10**9 else hi}
        labels.append(f"{bucket_label(row)}\nn={counts.get((lo, hi), 0)}")
    ax.set_xticks(range(len(buckets)), labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("BLEU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return finish(fig, path)


_NAMES = {"rnn": "RNN (GRU)", "conv": "convolution", "self_attention": "self-attention",
          "self_attention_fused": "self-attention (fused)"}


def plot_complexity(rows: list[dict], path: str | Path | None = None, title: str = "") -> Figure:
    """rows of ``attnkit.bench_complexity.measure``: time, saved memory and FLOPs of one layer against n,
    log-log, one colour per layer and one line per width d (darker = wider)."""
    panels = (("total_ms", "forward + backward (ms)"), ("saved_bytes", "saved for backward (bytes)"),
              ("flops", "forward FLOPs"))
    fig = Figure(figsize=(14, 4.2))
    axes = fig.subplots(1, 3)
    colours = dict(zip(_NAMES, ("tab:red", "tab:green", "tab:blue", "tab:purple")))
    styles = dict(zip(_NAMES, ("-", "--", "-.", ":")))  # the RNN's and the k=3 convolution's FLOPs coincide
    ds = sorted({r["d"] for r in rows})
    for ax, (key, label) in zip(axes, panels):
        for layer, name in _NAMES.items():
            for i, d in enumerate(ds):
                pts = sorted((r["n"], r[key]) for r in rows if r["layer"] == layer and r["d"] == d and r[key])
                if pts:
                    ax.plot(*zip(*pts), color=colours[layer], linestyle=styles[layer], marker=".",
                            alpha=0.35 + 0.65 * (i + 1) / len(ds), label=name if i == len(ds) - 1 else None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle((title + ", " if title else "") + f"d = {', '.join(map(str, ds))} (darker = wider)", fontsize=10)
    return finish(fig, path)


def plot_curves(series: dict[str, list[tuple[float, float]]], path: str | Path | None = None, xlabel: str = "",
                ylabel: str = "", title: str = "") -> Figure:
    """series: name -> [(x, y), ...], e.g. validation loss against training step, one line each."""
    fig = Figure(figsize=(6.0, 3.8))
    ax = fig.subplots()
    for name, points in series.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker=".", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return finish(fig, path)
