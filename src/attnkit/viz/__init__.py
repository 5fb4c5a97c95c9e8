"""Pictures: attention heatmaps, attention over image regions, BLEU by length, the cost of a layer."""

from attnkit.viz.attention import plot_attention, plot_caption_attention, plot_speech_attention
from attnkit.viz.curves import plot_bleu_by_length, plot_complexity, plot_curves

__all__ = ["plot_attention", "plot_bleu_by_length", "plot_caption_attention", "plot_complexity", "plot_curves",
           "plot_speech_attention"]
