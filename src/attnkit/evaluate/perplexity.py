"""Language-model scores of a text stream: loss, perplexity, bits per character.

Two ways to give each token its context. ``language_model_scores`` cuts the stream into disjoint
blocks, as validation during training does: a token at the start of a block sees almost nothing
before it. ``sliding_window_scores`` moves a window of the model's length by ``stride`` and scores
each token once, with at least ``window - stride`` tokens before it (the strided evaluation of
Hugging Face's perplexity guide), closer to the full-context numbers published for recurrent LMs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.data import BOS, PAD, block_batch


def bits_per_character(loss: float) -> float:
    """Bits per character from the mean NLL in nats per character: bpc = loss / ln 2.

    For a character model a token is a character, so its mean NLL per token is ``loss``.
    """
    return loss / math.log(2)


def _summary(model, was_training: bool, nll: float, n: int, characters: bool, **extra) -> dict:
    model.train(was_training)
    loss = nll / max(n, 1)
    scores = {"loss": loss, "ppl": math.exp(min(loss, 50)), "tokens": n, **extra}
    if characters:
        scores["bpc"] = bits_per_character(loss)
    return scores


@torch.no_grad()
def language_model_scores(model, blocks: Tensor, batch_blocks: int = 16, characters: bool = False) -> dict:
    """blocks [N, T] (PAD-padded ids, as attnkit.data.stream_blocks cuts them) -> scores of every real token.

    ``model`` is a TransformerLM: called with ``targets`` it returns their summed NLL itself (an adaptive
    softmax never builds the whole vocabulary's log-probabilities for that).

    ``loss`` is the mean negative log-likelihood in nats per token, ``ppl`` its exponential; with
    ``characters`` (one token per character) also ``bpc``, bits per character: loss / ln 2.
    """
    was_training = model.training
    model.eval()
    nll, n = 0.0, 0
    for start in range(0, blocks.size(0), batch_blocks):
        b = block_batch(blocks, list(range(start, min(start + batch_blocks, blocks.size(0)))))
        nll += float(model(b.src, b.tgt_in, targets=b.tgt_out).nll)  # the NLL summed over non-pad targets
        n += b.n_tokens
    return _summary(model, was_training, nll, n, characters)


def sliding_windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows over a stream of ``n`` tokens: (begin, end, first scored) with each token scored exactly once.

    The first window scores all its tokens; each later one starts ``stride`` further on and scores only
    the tokens after the previous window's end.
    """
    if not 0 < stride <= window:
        raise ValueError(f"stride {stride} must be in [1, window = {window}]")
    spans, begin, scored = [], 0, 0
    while scored < n:
        end = min(begin + window, n)
        spans.append((begin, end, scored))
        scored, begin = end, begin + stride
    return spans


@torch.no_grad()
def sliding_window_scores(model, stream: Tensor, window: int, stride: int, batch_windows: int = 16,
                          characters: bool = False) -> dict:
    """stream [N] ids -> scores of every token, each predicted from BOS and the window's tokens before it.

    ``window`` is the model's length in tokens (BOS takes the place of the last input, as in training).
    """
    was_training = model.training
    model.eval()
    spans = sliding_windows(stream.numel(), window, stride)
    nll, n = 0.0, 0
    for start in range(0, len(spans), batch_windows):
        chunk = spans[start:start + batch_windows]
        tgt_out = torch.full((len(chunk), window), PAD, dtype=torch.long)
        for row, (begin, end, _) in enumerate(chunk):
            tgt_out[row, : end - begin] = stream[begin:end]
        tgt_in = torch.cat([torch.full((len(chunk), 1), BOS, dtype=torch.long), tgt_out[:, :-1]], dim=1)
        for row, (begin, _, scored) in enumerate(chunk):
            tgt_out[row, : scored - begin] = PAD  # context only: scored by an earlier window
        nll += float(model(tgt_in.new_zeros(len(chunk), 0), tgt_in, targets=tgt_out).nll)
        n += int(tgt_out.ne(PAD).sum())
    return _summary(model, was_training, nll, n, characters, window=window, stride=stride)
