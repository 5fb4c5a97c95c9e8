"""Pictures: attention heatmaps."""

from attnkit.viz.attention import plot_attention

__all__ = ["plot_attention"]
