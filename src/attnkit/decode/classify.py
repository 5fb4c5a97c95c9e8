"""Classifying sentences and sentence pairs with a fine-tuned classifier (or scoring them with a regressor).

The inputs are sorted by length and cut into batches of at most ``batch_tokens`` tokens (and ``batch_size``
inputs), so each batch pads only to its own longest input, little beyond its shortest; the answers come back in
the input order: for a classifier the most probable label and every label's probability, ``softmax(z)``; for a
regressor the one predicted score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnkit.data import token_batches
from attnkit.data.wordpiece import WordPiece, collate_sentences
from attnkit.errors import AttnkitError


@dataclass
class Classification:
    """``label``: the most probable label (a regressor's: its one label name, e.g. "score"); ``probabilities``:
    label -> probability, in the model's label order (None for a regressor); ``score``: a regressor's prediction
    (None for a classifier)."""

    label: str
    probabilities: dict[str, float] | None = None
    score: float | None = None


@torch.no_grad()
def classify_logits(model, tokenizer: WordPiece, texts: Sequence[str], pairs: Sequence[str] | None = None,
                    batch_tokens: int = 4096, batch_size: int = 0) -> torch.Tensor:
    """Logits [N, n_labels] of every input (``texts[i]``, or the pair ``texts[i]``, ``pairs[i]``), in input order."""
    if pairs is not None and len(pairs) != len(texts):
        raise AttnkitError(f"{len(texts)} first sentences but {len(pairs)} second sentences")
    if not texts:
        return torch.zeros(0, model.n_labels)
    examples = [tokenizer.example(a, None if pairs is None else pairs[i]) for i, a in enumerate(texts)]
    device = next(model.parameters()).device
    out = torch.empty(len(examples), model.n_labels)
    lengths = [len(ids) - 1 for ids, _ in examples]
    for idx in token_batches(lengths, [0] * len(examples), batch_tokens, max_examples=batch_size):
        b = collate_sentences([examples[i] for i in idx], tokenizer.pad_id).to(device)
        out[idx] = model(b.tokens, b.padding_mask, b.token_types).logits.float().cpu()
    return out


def classify(model, tokenizer: WordPiece, texts: Sequence[str], pairs: Sequence[str] | None = None,
             batch_tokens: int = 4096, batch_size: int = 0) -> list[Classification]:
    """Each input's :class:`Classification`, in input order (see :func:`classify_logits`; ``batch_size`` 0: as many
    inputs a batch as ``batch_tokens`` allows)."""
    logits = classify_logits(model, tokenizer, texts, pairs, batch_tokens, batch_size)
    if model.problem == "regression":
        return [Classification(model.labels[0], None, float(z[0])) for z in logits]
    probabilities = logits.softmax(-1)
    out = []
    for p in probabilities:
        values = dict(zip(model.labels, (float(x) for x in p)))
        out.append(Classification(model.labels[int(p.argmax())], values))
    return out
