"""Language-model scores of a text stream: loss, perplexity, bits per character.

Two ways to give each token its context. ``language_model_scores`` cuts the stream into disjoint
blocks, as validation during training does: a token at the start of a block sees almost nothing
before it. ``sliding_window_scores`` moves a window of the model's length by ``stride`` and scores
each token once, with at least ``window - stride`` tokens before it (the strided evaluation of
Hugging Face's perplexity guide), closer to the full-context numbers published for recurrent LMs.

``continuous_cache_probs`` adds Grave et al.'s (2017) continuous cache on top of the sliding window: the
states of the last few thousand tokens, each stored with the word that followed it, vote for the next word
by their dot product with the current state. It reaches past the window, and needs no training.
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


@torch.no_grad()
def sliding_window_states(model, stream: Tensor, window: int, stride: int,
                          batch_windows: int = 16) -> tuple[Tensor, Tensor]:
    """stream [N] ids -> (states [N, d_model], log p(stream) [N]), each token's from the window that scores it.

    The states are those the output layer reads (``model.hidden_states``); the windows are those of
    :func:`sliding_window_scores`, so ``-log_probs.mean()`` is its loss.
    """
    was_training = model.training
    model.eval()
    states, log_probs = [], []
    spans = sliding_windows(stream.numel(), window, stride)
    for start in range(0, len(spans), batch_windows):
        chunk = spans[start:start + batch_windows]
        tgt_in = torch.full((len(chunk), window), PAD, dtype=torch.long)
        for row, (begin, end, _) in enumerate(chunk):
            tgt_in[row, 1: end - begin] = stream[begin:end - 1]
        tgt_in[:, 0] = BOS
        hidden, _ = model.hidden_states(tgt_in)
        for row, (begin, end, scored) in enumerate(chunk):
            states.append(hidden[row, scored - begin: end - begin])
        targets = torch.cat([stream[scored:end] for _, end, scored in chunk])
        log_probs.append(model.target_log_probs(torch.cat(states[-len(chunk):]), targets).float())
    model.train(was_training)
    return torch.cat(states).float(), torch.cat(log_probs)


def continuous_cache_probs(states: Tensor, stream: Tensor, theta: float, cache_size: int,
                           chunk: int = 512) -> Tensor:
    """p_cache(x_t) for every token of a stream (Grave et al. 2017, eq. 2), from the ``cache_size`` tokens before it:

        p_cache(x_t) = sum_{i in [t-n, t), x_i = x_t} exp(theta h_t . h_i) / sum_{i in [t-n, t)} exp(theta h_t . h_i)

    states [N, d_model] (h_i is the state that predicted x_i), stream [N] ids -> [N]; 0 where no cached word is
    x_t, and for the first token, whose cache is empty.
    """
    n = stream.numel()
    out = torch.zeros(n)
    for a in range(0, n, chunk):
        b, lo = min(a + chunk, n), max(0, a - cache_size)
        scores = theta * (states[a:b] @ states[lo:b].T)  # [queries t, keys i]
        t = torch.arange(a, b)[:, None]
        i = torch.arange(lo, b)[None, :]
        scores = scores.masked_fill((i >= t) | (i < t - cache_size), float("-inf"))
        same = stream[lo:b][None, :] == stream[a:b][:, None]
        p = (torch.logsumexp(scores.masked_fill(~same, float("-inf")), 1) - torch.logsumexp(scores, 1)).exp()
        out[a:b] = p.nan_to_num(0.0)  # the first token: no keys at all
    return out


def cache_mixture_log_probs(log_probs: Tensor, cache_probs: Tensor, lam: float) -> Tensor:
    """log p(x_t) = log((1 - lambda) p_model(x_t) + lambda p_cache(x_t)) (Grave et al. 2017, eq. 3), [N] -> [N].

    The first token, with nothing cached, keeps the model's probability.
    """
    mixed = torch.log((1 - lam) * log_probs.exp() + lam * cache_probs)
    mixed[0] = log_probs[0]
    return mixed
