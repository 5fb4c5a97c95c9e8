"""Audio in, characters out, through the same search as translation and captioning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decode.search import Hypothesis, SearchStep, generate
from attnkit.nn.audio import pad_frames


@dataclass
class Transcript:
    hypotheses: list[Hypothesis]  # best first; attention [len + 1, U] over the encoder's frames when asked for
    text: list[str]
    frames: int = 0  # the utterance's feature frames (10 ms each)
    memory_frames: int = 0  # the encoder's frames the attention ranges over


def max_characters(frames: int, limit: int) -> int:
    """The longest transcript searched for ``frames`` 10 ms frames: a character per 20 ms at most (speech runs
    at about one per 60-80 ms), never past ``limit``."""
    return max(1, min(limit, frames // 2 + 1))


@torch.no_grad()
def transcribe(model, tokenizer, features: list[Tensor], beam_size: int = 1, len_penalty: float = 1.0,
               max_len: int = 200, batch_frames: int = 20000, need_weights: bool = False,
               on_result=None, on_step: Callable[[SearchStep, list[int]], None] | None = None) -> list[Transcript]:
    """Utterances' features (each [T, F]) -> their transcripts, in order. Batches hold utterances of similar
    length, at most ``batch_frames`` padded frames; ``on_result(i, transcript)`` is called as each is done, in
    order (a face streams them). ``on_step(step, batch)``: each step of each batch's search, as
    :func:`~attnkit.decode.translate` gives it (:class:`~attnkit.decode.search.SearchStep`: the partial transcripts,
    their scores, the step's attention over the batch's padded frames), ``batch`` the indices in ``features`` of
    the batch's rows; raising stops the search."""
    model.eval()
    order = sorted(range(len(features)), key=lambda i: features[i].size(0))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * features[i].size(0) > batch_frames:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    done: dict[int, Transcript] = {}
    emitted = 0
    lengths_of = getattr(model, "model", model).memory_lengths  # the fast runtime's decoder wraps the model
    for batch in sorted(batches, key=min):
        frames = pad_frames([features[i].float() for i in batch])
        lens = torch.tensor([max_characters(int(n), max_len) for n in frames.lengths])
        memory = lengths_of(frames.lengths)
        watch = None if on_step is None else (lambda step, batch=batch: on_step(step, batch))
        found = generate(model, frames, lens, beam_size, len_penalty, 1, need_weights, on_step=watch)
        for k, hyps in zip(batch, found):
            if need_weights:
                hyps = [Hypothesis(h.tokens, h.score, None if h.attention is None else
                                   h.attention[:, : int(memory[batch.index(k)])], h.log_probs) for h in hyps]
            done[k] = Transcript(hyps, [tokenizer.decode(h.tokens) for h in hyps], int(features[k].size(0)),
                                 int(memory[batch.index(k)]))
        while emitted in done and on_result is not None:
            on_result(emitted, done[emitted])
            emitted += 1
    return [done[i] for i in range(len(features))]
