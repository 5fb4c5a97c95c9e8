"""Sentences in, sentences out: tokenize, batch by length, encode, search, detokenize."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnkit.data import Tokenizers, pad, token_batches
from attnkit.data.shortlist import VocabularyMap
from attnkit.decode.search import Hypothesis, SearchStep, generate, max_lengths
from attnkit.tokens import EOS


@dataclass
class Translation:
    source: str
    hypotheses: list[Hypothesis]  # best first
    text: list[str]  # detokenized, one per hypothesis


@torch.no_grad()
def translate(model, toks: Tokenizers, sentences: list[str], beam_size: int = 5, len_penalty: float = 1.0,
              n_best: int = 1, max_len_a: float = 1.2, max_len_b: int = 10, batch_tokens: int = 4000,
              need_weights: bool = False, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
              seed: int | None = None, shortlist: VocabularyMap | None = None,
              on_step: Callable[[SearchStep, list[int]], None] | None = None) -> list[Translation]:
    """Translate in length-sorted batches of at most ``batch_tokens`` source tokens; results keep input order.

    ``beam_size == 1`` with ``temperature == 0`` is greedy; ``temperature > 0`` samples. ``shortlist``: each batch
    scores only its source tokens' candidates (:meth:`VocabularyMap.candidates`). ``on_step(step, batch)``: each
    step of each batch's search (:class:`~attnkit.decode.search.SearchStep`: the partial hypotheses, their scores,
    the step's attention), ``batch`` the indices in ``sentences`` of the batch's rows; raising stops the search.
    """
    model.eval()
    ids = [s + [EOS] for s in toks.src.encode(sentences)]
    results: list[Translation | None] = [None] * len(sentences)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    for batch in token_batches([len(s) - 1 for s in ids], [0] * len(ids), batch_tokens):
        lens = max_lengths(torch.tensor([len(ids[i]) - 1 for i in batch]), max_len_a, max_len_b)
        vocabulary = None if shortlist is None else shortlist.candidates([ids[i] for i in batch])
        watch = None if on_step is None else (lambda step, batch=batch: on_step(step, batch))
        nbest = generate(model, pad([ids[i] for i in batch]), lens, beam_size, len_penalty, n_best, need_weights,
                         temperature, top_k, top_p, generator, on_step=watch, vocabulary=vocabulary)
        for i, hyps in zip(batch, nbest):
            results[i] = Translation(sentences[i], hyps, [toks.tgt.decode(h.tokens) for h in hyps])
    return results
