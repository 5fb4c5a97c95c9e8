"""Pictures: attention heatmaps, attention over image regions."""

from attnkit.viz.attention import plot_attention, plot_caption_attention

__all__ = ["plot_attention", "plot_caption_attention"]
