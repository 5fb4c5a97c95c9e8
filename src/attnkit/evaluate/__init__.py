"""Evaluation: sacreBLEU, chrF, the papers' BLEU (lowercased, Moses-tokenised) and BLEU by source length; the
COCO caption evaluation; GLUE's classification and regression scores; language-model loss, perplexity, bits per
character."""

from attnkit.evaluate.metrics import (
    PaperBleu,
    Score,
    bleu,
    bleu_by_length,
    caption_bleu,
    chrf,
    classification_scores,
    coco_caption_scores,
    moses_tokenize,
    paper_bleu,
    regression_scores,
)
from attnkit.evaluate.perplexity import bits_per_character, language_model_scores, sliding_window_scores

__all__ = ["PaperBleu", "Score", "bits_per_character", "bleu", "bleu_by_length", "caption_bleu", "chrf",
           "classification_scores", "coco_caption_scores", "language_model_scores", "moses_tokenize", "paper_bleu",
           "regression_scores", "sliding_window_scores"]
