"""Answering questions about images with a visual question answering model (:mod:`attnkit.models.vqa`).

The pairs are sorted by question length and cut into batches of at most ``batch_size`` pairs, so each batch pads
only to its own longest question (padding never reaches the answer), and the CNN reads each of a batch's images
once however many of its questions ask about it; the answers come back in input order, each
with every answer's probability, ``softmax(z)``, and each glimpse's attention over the image grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from attnkit.data import pad, token_batches
from attnkit.data.vqa import QuestionVocab, load_pixels


@dataclass
class Answer:
    """``answer``: the most probable answer and ``probability`` its probability; ``probabilities``: answer ->
    probability, in the model's answer order; ``glimpses``: [K, rows, columns], each glimpse's weights over the
    image grid (each summing to one; the baseline without attention: one uniform map; None for the question-only
    baseline); ``unknown_words``: the question's words the model never saw, read as ``<unk>``."""

    answer: str
    probability: float
    probabilities: dict[str, float]
    glimpses: Tensor | None = None
    unknown_words: list[str] = field(default_factory=list)

    def to_json(self, decimals: int = 4) -> dict:
        """The answer as JSON (``glimpses`` as nested lists, rounded)."""
        maps = None if self.glimpses is None else [[[round(float(x), decimals) for x in row] for row in g]
                                                   for g in self.glimpses]
        return {"answer": self.answer, "probability": round(self.probability, decimals),
                "probabilities": {a: round(p, decimals) for a, p in self.probabilities.items()},
                "glimpses": maps, "unknown_words": list(self.unknown_words)}


@torch.no_grad()
def answer(model, vocab: QuestionVocab, images: list, questions: list[str], image_size: int, grid: list[int],
           batch_size: int = 64) -> list[Answer]:
    """Each (image file, question) pair's :class:`Answer`, in input order."""
    pixels, image_of = load_pixels([Path(p) for p in images], image_size)
    ids = vocab.encode(questions)
    device = next(model.parameters()).device
    out: list[Answer | None] = [None] * len(questions)
    lengths = [max(len(q), 1) for q in ids]
    for idx in token_batches(lengths, [0] * len(ids), batch_size * (max(lengths, default=1) + 1),
                             max_examples=batch_size):
        batch = pad([ids[i] or [0] for i in idx]).to(device)
        used, image_index = image_of[idx].unique(return_inverse=True)  # each image of the batch read once
        result = model(pixels[used].to(device), batch, need_weights=True, image_index=image_index.to(device))
        probabilities = result.logits.float().softmax(-1).cpu()
        alpha = result.attention.cross[0][:, :, 0].float().cpu() if result.attention.cross else None  # [B, K, L]
        for row, i in enumerate(idx):
            p = probabilities[row]
            k = int(p.argmax())
            maps = None if alpha is None else alpha[row].reshape(alpha.size(1), *grid)
            out[i] = Answer(vocab.answers[k], float(p[k]), dict(zip(vocab.answers, (float(x) for x in p))), maps,
                            vocab.unknown(questions[i]))
    return out
