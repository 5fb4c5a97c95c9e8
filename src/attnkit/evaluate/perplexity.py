"""Language-model scores over a stream cut into blocks: loss, perplexity, bits per character."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.data import PAD, block_batch


@torch.no_grad()
def language_model_scores(model, blocks: Tensor, batch_blocks: int = 16, characters: bool = False) -> dict:
    """blocks [N, T] (PAD-padded ids, as attnkit.data.stream_blocks cuts them) -> scores of every real token.

    ``loss`` is the mean negative log-likelihood in nats per token, ``ppl`` its exponential; with
    ``characters`` (one token per character) also ``bpc``, bits per character: loss / ln 2.
    """
    was_training = model.training
    model.eval()
    nll, n = 0.0, 0
    for start in range(0, blocks.size(0), batch_blocks):
        b = block_batch(blocks, list(range(start, min(start + batch_blocks, blocks.size(0)))))
        logits = model(b.src, b.tgt_in).float()
        nll += float(F.cross_entropy(logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD, reduction="sum"))
        n += b.n_tokens
    model.train(was_training)
    loss = nll / max(n, 1)
    scores = {"loss": loss, "ppl": math.exp(min(loss, 50)), "tokens": n}
    if characters:
        scores["bpc"] = loss / math.log(2)
    return scores
