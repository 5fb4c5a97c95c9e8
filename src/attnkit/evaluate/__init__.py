"""Evaluation: sacreBLEU, chrF and BLEU by source length."""

from attnkit.evaluate.metrics import Score, bleu, bleu_by_length, caption_bleu, chrf

__all__ = ["Score", "bleu", "bleu_by_length", "caption_bleu", "chrf"]
