"""Evaluation: sacreBLEU, chrF and BLEU by source length; language-model loss, perplexity, bits per character."""

from attnkit.evaluate.metrics import Score, bleu, bleu_by_length, caption_bleu, chrf
from attnkit.evaluate.perplexity import language_model_scores, sliding_window_scores

__all__ = ["Score", "bleu", "bleu_by_length", "caption_bleu", "chrf", "language_model_scores",
           "sliding_window_scores"]
