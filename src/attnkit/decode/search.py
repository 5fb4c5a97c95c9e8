"""Greedy decoding, beam search and sampling, written once for every model of the contract
(:mod:`attnkit.models.contract`)::

    memory = model.encode(src)                  # once per batch
    state = model.init_state(memory)            # caches / recurrent state, with state.select(indices, same_source)
    log_probs, state, attn = model.step(tokens, state, need_weights)   # tokens [N] -> [N, V], attn [N, S] or None

The functions here take the initial ``state`` and never look inside it. ``state.repeat_beams(k)`` makes k
consecutive rows (beams) of every row; ``state.select(indices)`` reorders, repeats or drops rows; with
``same_source=True`` the caller promises that every row keeps its source sentence (beam search reordering
one sentence's beams), so the source side (encoder memory, cross-attention keys and values) need not be
gathered again.

A step of the search is a model step and the choice of the next tokens in one function (:func:`greedy_step`,
:func:`beam_step`), so that a decoder of the fast runtime can offer its own (``model.search_steps()``: ranked with
faster kernels, or compiled into one graph) in their place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor

from attnkit.models.contract import device_of
from attnkit.tokens import BOS, EOS


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities (beam search: divided by length ** len_penalty)
    attention: Tensor | None = None  # [len(tokens) + 1, S]: one row per output step, EOS included
    log_probs: list[float] = field(default_factory=list)  # sampling: one per output step, EOS included


@dataclass
class SearchStep:
    """What an ``on_step`` callback of :func:`sample`, :func:`beam_search` or :func:`generate` receives after each
    step, to stream a search as it goes (a server, a live view). Tensors as the search holds them: nothing is
    copied or read into Python unless the callback does, and the callback must not change them.

    Rows are the live hypotheses, k consecutive rows per live sentence (k = 1 when sampling); ``sentences`` gives
    each live sentence's row in the batch the search was given.
    """

    t: int  # the step: 0 chose the first output token
    sentences: Tensor  # [m] the batch row of each live sentence
    tokens: Tensor  # [m k] the token each live hypothesis just took (EOS: a sampled row that ended here)
    history: Tensor  # [m k, t + 1] each live hypothesis' tokens so far (sampling: a prefix's tokens included)
    scores: Tensor  # [m, k] their sums of log-probabilities so far; beam search: best first, -inf a dead beam
    attention: Tensor | None = None  # [m k, S] the attention each hypothesis' step paid (need_weights), else None
    log_probs: Tensor | None = None  # [m k, V] the distributions the tokens were sampled from (before temperature
    #                                  and filtering); None for greedy and beam steps, whose ranking fuses them
    finished: list[list[Hypothesis]] | None = None  # beam search: each batch row's finished hypotheses so far
    ended: list[int] = field(default_factory=list)  # beam search: batch rows whose search ended at this step


def model_device(model) -> torch.device:
    """Where ``model`` keeps its weights (the CPU for models without parameters, e.g. onnxruntime's)."""
    return device_of(model)


def top_extensions(scores: Tensor, log_probs: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The ``n`` best one-token extensions of each sentence's beams: scores [M, K] (each beam's total so far),
    log_probs [M, K, V] -> (totals [M, n], indices [M, n] into the flattened K * V candidates), best first."""
    m, k, v = log_probs.shape
    return (scores[:, :, None] + log_probs).view(m, k * v).topk(n, dim=1)


def length_normalized(total: float, length: int, len_penalty: float) -> float:
    """A finished hypothesis' beam-search score: ``sum log p / length ** len_penalty``, its length counting EOS."""
    return total / length ** len_penalty


def argmax(log_probs: Tensor) -> Tensor:
    """The most likely token of each row: log_probs [N, V] -> [N]."""
    return log_probs.argmax(-1)


def max_lengths(src_lengths: Tensor, a: float, b: int) -> Tensor:
    """The longest output allowed per sentence: ``a * source length + b`` (fairseq's max_len_a/b)."""
    return (src_lengths.float() * a + b).long().clamp(min=1)


def with_temperature(log_probs: Tensor, temperature: float) -> Tensor:
    """Logits whose softmax is p_i ∝ exp(z_i / T): (z - max z) / T.

    log_probs [N, V] -> [N, V]. Shifting the largest z to 0 leaves the distribution as it is and keeps the most likely
    token finite however small T is (z / T alone overflows every entry to -inf below T ~ 1e-38, a NaN distribution);
    a T below the dtype's smallest normal number is that number, not 0.
    """
    return (log_probs - log_probs.amax(-1, keepdim=True)) / max(temperature, torch.finfo(log_probs.dtype).tiny)


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Keep the ``top_k`` most likely tokens and the smallest set whose probability reaches ``top_p``; -inf elsewhere.

    logits [N, V]. The most likely token always survives.
    """
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False  # the most likely token, even for a top_p below the dtype's resolution
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def in_vocabulary(positions: Tensor, state) -> Tensor:
    """Token ids of ``positions`` in the log-probabilities of a step that returned ``state``: the same, but for a
    shortlist (``state.vocabulary``), whose positions map to ids through it. EOS's position is its id either way."""
    vocabulary = state.vocabulary
    return positions if vocabulary is None else vocabulary[positions]


def _end_at_limits(log_probs: Tensor, tokens: Tensor, limits: Tensor, t: int) -> tuple[Tensor, Tensor]:
    """tokens [N] chosen at step ``t`` -> (tokens with EOS where a row reaches its limit [N], their log-probs [N])."""
    tokens = tokens.masked_fill(limits <= t + 1, EOS)
    return tokens, log_probs.gather(1, tokens[:, None]).squeeze(1)


def greedy_step(step, tokens: Tensor, state, limits: Tensor, t: int, need_weights: bool = False, *,
                argmax=argmax):
    """A greedy decoding step: ``step`` (a model's) and the choice of its best tokens (``argmax``), in one function.
    tokens [N], limits [N] (the longest output allowed per row) -> (next tokens [N], their log-probabilities [N],
    state, attention)."""
    log_probs, state, attn = step(tokens, state, need_weights)
    positions, scores = _end_at_limits(log_probs, argmax(log_probs), limits, t)
    return in_vocabulary(positions, state), scores, state, attn


def _search_step(model, search_step):
    """``search_step`` over ``model.step``, or the model's own version of it (``model.search_steps()``)."""
    return model.search_steps().get(search_step.__name__) or partial(search_step, model.step)


@torch.no_grad()
def sample(model, state, max_lens: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None, need_weights: bool = False,
           prefix: Tensor | None = None, on_token: Callable[[Tensor], None] | None = None,
           on_step: Callable[[SearchStep], None] | None = None) -> list[Hypothesis]:
    """Ancestral sampling; ``temperature == 0`` is greedy decoding. One hypothesis per batch row.

    max_lens [N]; ``prefix`` [N, P] forces the first P output tokens (a language model's prompt);
    ``on_token`` is called after every step with the tokens just chosen [N] (EOS once a row ended), to stream them;
    ``on_step`` after every step with a :class:`SearchStep` of the rows still decoding (those that just ended
    included), with their attention and log-probabilities.

    A greedy search that streams and watches nothing is the model's own where it has one (``model.greedy_search``:
    the same hypotheses, see :class:`~attnkit.models.contract.GenerativeModel`).
    """
    whole = getattr(model, "greedy_search", None)
    if temperature == 0 and whole is not None and prefix is None and on_token is None and on_step is None \
            and not need_weights and (found := whole(state, max_lens)) is not None:
        return found
    if state.vocabulary is not None and (temperature != 0 or prefix is not None):
        raise ValueError("a vocabulary shortlist serves greedy decoding and beam search, not sampling or a prefix")
    dev = model_device(model)
    n, limit = max_lens.size(0), int(max_lens.max())
    rows = torch.arange(n, device=dev)  # the batch row of each sentence still decoding; finished ones leave
    every_row = True  # no sentence has left yet: rows[i] == i, and plain slices index the outputs
    row_limits = max_lens.to(dev)
    prefix = None if prefix is None else prefix.to(dev)
    tokens = torch.full((n,), BOS, dtype=torch.long, device=dev)
    out = torch.full((n, limit), EOS, dtype=torch.long, device=dev)
    step_log_probs = None  # the step's distributions, for on_step
    step_scores, attn_all, steps, width = torch.zeros(n, limit, device=dev), None, 0, 0
    step_and_choose = _search_step(model, greedy_step)
    for t in range(limit):
        if temperature == 0 and (prefix is None or t >= prefix.size(1)):
            tokens, scores, state, attn = step_and_choose(tokens, state, row_limits, t, need_weights)
        else:
            log_probs, state, attn = model.step(tokens, state, need_weights)
            step_log_probs = log_probs
            if prefix is not None and t < prefix.size(1):
                tokens = prefix[rows, t]
            else:
                logits = filter_logits(with_temperature(log_probs, temperature), top_k, top_p)
                probs = torch.softmax(logits, -1)
                if generator is not None and generator.device != probs.device:  # a seed draws the same on any device
                    probs = probs.cpu()
                tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(dev)
            tokens, scores = _end_at_limits(log_probs, tokens, row_limits, t)
        at = (slice(None) if every_row else rows, t)
        step_scores[at] = scores
        out[at] = tokens
        steps = t + 1
        if attn is not None:
            if attn_all is None:  # [N, T, S]; a language model's attention grows by a column a step
                attn_all = attn.new_zeros(n, limit, attn.size(-1) + limit - 1)
            width = max(width, attn.size(-1))
            attn_all[(*at, slice(0, attn.size(-1)))] = attn
        if on_token is not None:
            on_token(out[:, t])
        if on_step is not None:
            live = rows if not every_row else torch.arange(n, device=dev)
            on_step(SearchStep(t, live, tokens, out[live, : t + 1], step_scores[live, : t + 1].sum(1, keepdim=True),
                               attn, step_log_probs))
            step_log_probs = None
        going = [i for i, token in enumerate(tokens.tolist()) if token != EOS]  # one synchronisation a step
        if not going:
            break
        if len(going) < tokens.size(0):  # drop finished sentences, so later steps compute only the live ones
            keep = torch.tensor(going, device=dev)
            state, rows, tokens, row_limits = state.select(keep), rows[keep], tokens[keep], row_limits[keep]
            every_row = False
    return sampled_hypotheses(out[:, :steps].tolist(), step_scores,
                              None if attn_all is None else attn_all[:, :, :width])


def sampled_hypotheses(rows: list[list[int]], step_scores: Tensor, attention: Tensor | None = None) -> list[Hypothesis]:
    """The hypotheses of a search that chose one token a step per row: rows [N][steps] of tokens (a row ends at its
    first EOS), step_scores [N, >= steps] their log-probabilities (zeros past the last step), attention [N, T, S]
    or None."""
    hyps = []
    for i, row in enumerate(rows):
        length = row.index(EOS) if EOS in row else len(row)
        lps = step_scores[i, : length + 1]
        weights = None if attention is None else attention[i, : length + 1]
        hyps.append(Hypothesis(row[:length], float(lps.sum()), weights, lps.tolist()))
    return hyps


def greedy(model, state, max_lens: Tensor, need_weights: bool = False,
           on_step: Callable[[SearchStep], None] | None = None) -> list[Hypothesis]:
    return sample(model, state, max_lens, temperature=0.0, need_weights=need_weights, on_step=on_step)


class BeamStep(NamedTuple):
    """One step of beam search over m sentences of k beams: the next beams and the candidates that ended."""

    state: object  # reordered to the next beams, k consecutive rows per sentence
    tokens: Tensor  # [m k] each next beam's last token
    scores: Tensor  # [m, k] their scores, best first (-inf: a dead beam)
    history: Tensor  # [m k, t + 1] their tokens so far
    rows: Tensor  # [m k] the row (of the step's input) each next beam extends
    ending: Tensor  # [m, 2k] the ranked candidates that end a hypothesis
    candidate_scores: Tensor  # [m, 2k]
    candidate_rows: Tensor  # [m, 2k] the row each candidate extends
    stuck: Tensor  # [m] no candidate goes on
    attention: Tensor | None  # [rows of the step's input, S]


def beam_step(step, tokens: Tensor, state, scores: Tensor, history: Tensor, limits: Tensor, t: int,
              need_weights: bool = False, at_limit: bool = True, *, best=top_extensions) -> BeamStep:
    """A beam search step: ``step`` (a model's) on the beams' last tokens, then the ranking (``best``: the 2k best
    extensions), in one function. tokens [m k] (at ``t == 0``: [m], one row per sentence), scores [m, k],
    history [m k, t], limits [m] (the longest output allowed); ``at_limit``: some sentence reaches its limit at
    this step (else the mask that allows only EOS there is skipped)."""
    log_probs, state, attn = step(tokens, state, need_weights)
    return extend_beams(log_probs, state, attn, scores, history, limits, t, at_limit, best=best)


def extend_beams(log_probs: Tensor, state, attn, scores: Tensor, history: Tensor, limits: Tensor, t: int,
                 at_limit: bool = True, *, best=top_extensions, shift: Tensor | None = None) -> BeamStep:
    """:func:`beam_step`'s ranking of the extensions, after its step gave log_probs [m k, V] (at ``t == 0``:
    [m, V]), ``state`` and ``attn``. An extension's score is its beam's score plus the token's log-probability.
    ``shift`` [m k]: log_probs are logits z, whose log-probabilities are z - shift (shift = logsumexp(z)); the
    shift is then taken from the beams' scores, once a row."""
    m, k = scores.shape
    if t == 0:  # the k beams of a sentence would start the same: one row each took the first step
        state = state.repeat_beams(k)  # k rows per sentence
        attn = None if attn is None else attn.repeat_interleave(k, 0)
    beams, v, dev = 1 if t == 0 else k, log_probs.size(-1), log_probs.device
    log_probs = log_probs.view(m, beams, v)
    if at_limit:  # at the length limit only EOS may follow
        last = (limits <= t + 1)[:, None, None] & (torch.arange(v, device=dev) != EOS)
        log_probs = log_probs.masked_fill(last, float("-inf"))
    n = min(2 * k, beams * v)  # a vocabulary smaller than 2k offers fewer candidates: the rest are dead (-inf)
    base = scores[:, :beams] if shift is None else scores[:, :beams] - shift.view(m, beams)
    top_scores, top_idx = best(base, log_probs, n)  # [m, 2k] of the k * v
    if n < 2 * k:
        top_scores = torch.nn.functional.pad(top_scores, (0, 2 * k - n), value=float("-inf"))
        top_idx = torch.nn.functional.pad(top_idx, (0, 2 * k - n))
    top_beam, top_token = top_idx // v, top_idx % v
    alive, ends = top_scores > float("-inf"), top_token == EOS
    going = alive & ~ends
    # an EOS candidate ends a hypothesis if fewer than k going candidates rank above it
    ending = alive & ends & (going.cumsum(1) - going.long() < k)
    # the first k going candidates of each sentence (fewer: dead beams with score -inf fill the rest)
    rank = torch.arange(2 * k, device=dev)
    pick = torch.where(going, rank, rank + 2 * k).topk(k, dim=1, largest=False).indices  # [m, k], in rank order
    candidate_rows = top_beam + torch.arange(m, device=dev)[:, None] * k
    rows = candidate_rows.gather(1, pick).view(-1)
    tokens = in_vocabulary(top_token.gather(1, pick).view(-1), state)
    scores = top_scores.gather(1, pick).masked_fill(~going.gather(1, pick), float("-inf"))
    # every row stays with its own sentence: the source side of the state is left as it is
    history = torch.cat([history[rows], tokens[:, None]], 1)
    return BeamStep(state.select(rows, same_source=True), tokens, scores, history, rows, ending, top_scores,
                    candidate_rows, ~going.any(1), attn)


@torch.no_grad()
def beam_search(model, state, max_lens: Tensor, beam_size: int = 5, len_penalty: float = 1.0, n_best: int = 1,
                need_weights: bool = False,
                on_step: Callable[[SearchStep], None] | None = None) -> list[list[Hypothesis]]:
    """Batched beam search. Returns, per sentence, the ``n_best`` hypotheses best first.

    Each step ranks the 2k best extensions of a sentence's k beams. An EOS candidate ranked above the k-th non-EOS
    one ends a hypothesis, scored ``sum log p / (length + 1) ** len_penalty`` (the +1 counts EOS:
    :func:`length_normalized`); the first k non-EOS candidates are the next beams. A sentence stops when it holds
    ``beam_size`` finished hypotheses (or has no live candidate left), and is then dropped from the batch, so later
    steps compute only the sentences still searching. The ranking is done on tensors for all sentences at once
    (:func:`beam_step`); Python only sees the hypotheses that end.

    ``on_step`` is called after every step with a :class:`SearchStep`: the next beams of each sentence that was
    searching at this step (those that ended here included), best first, and the hypotheses finished so far.

    A search that streams and watches nothing is the model's own where it has one (``model.beam_search``: the same
    finished hypotheses, see :class:`~attnkit.models.contract.GenerativeModel`).
    """
    whole = getattr(model, "beam_search", None)
    if whole is not None and on_step is None and not need_weights \
            and (found := whole(state, max_lens, beam_size, len_penalty)) is not None:
        return [sorted(f, key=lambda h: -h.score)[:n_best] for f in found]
    n, k, dev = max_lens.size(0), beam_size, model_device(model)
    live = list(range(n))  # sentence id of each remaining block of k rows
    limits, live_limits = max_lens.tolist(), max_lens.to(dev)
    scores = torch.full((n, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive
    history = torch.full((n * k, 0), BOS, dtype=torch.long, device=dev)  # [rows, t] the tokens so far of each beam
    attn_history = None  # [rows, t, S]
    tokens = torch.full((n,), BOS, dtype=torch.long, device=dev)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    step_and_rank = _search_step(model, beam_step)
    for t in range(max(limits)):
        at_limit = any(t + 1 >= limits[s] for s in live)
        r = step_and_rank(tokens, state, scores, history, live_limits, t, need_weights, at_limit)
        # the step's two reads of tensor values, short lists (usually empty)
        ended = r.ending.nonzero().tolist()
        done = set(r.stuck.nonzero().flatten().tolist())
        if ended:
            rows = r.candidate_rows[r.ending].tolist()
            hists = history[rows].tolist()
            for (j, _), row, score, hist in zip(ended, rows, r.candidate_scores[r.ending].tolist(), hists):
                s = live[j]
                if len(finished[s]) < k:
                    a = None
                    if r.attention is not None:
                        a = r.attention[row][None]
                        a = a if attn_history is None else torch.cat([attn_history[row], a])
                    finished[s].append(Hypothesis(hist, length_normalized(score, t + 1, len_penalty), a))
                if len(finished[s]) >= k:
                    done.add(j)
        state, tokens, scores, history = r.state, r.tokens, r.scores, r.history
        if r.attention is not None:
            step_attn = r.attention[r.rows][:, None]
            attn_history = step_attn if attn_history is None else torch.cat([attn_history[r.rows], step_attn], 1)
        if on_step is not None:
            on_step(SearchStep(t, torch.tensor(live), tokens, history, scores,
                               None if r.attention is None else r.attention[r.rows], None, finished,
                               sorted(live[j] for j in done)))
        if done:
            keep = [j for j in range(len(live)) if j not in done]
            live = [live[j] for j in keep]
            if not live:
                break
            keep = torch.tensor(keep, device=dev)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=dev)).view(-1)
            state, tokens, history = state.select(keep_rows), tokens[keep_rows], history[keep_rows]
            scores, live_limits = scores[keep], live_limits[keep]
            attn_history = None if attn_history is None else attn_history[keep_rows]
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


@torch.no_grad()
def generate(model, src, max_lens: Tensor, beam_size: int = 1, len_penalty: float = 1.0, n_best: int = 1,
             need_weights: bool = False, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None,
             on_step: Callable[[SearchStep], None] | None = None,
             vocabulary: Tensor | None = None) -> list[list[Hypothesis]]:
    """Encode ``src`` once, then search: beam search when ``beam_size > 1``, else greedy (``temperature == 0``)
    or sampling. Returns the n-best list of every batch row. No autograd graph is recorded, encoder included.
    ``on_step``: see :class:`SearchStep`. ``vocabulary``: a shortlist, the only target ids [K] the search scores
    (``model.restrict_vocabulary``)."""
    state = model.init_state(model.encode(src.to(model_device(model))))
    if vocabulary is not None:
        state = model.restrict_vocabulary(state, vocabulary)
    if beam_size > 1 and temperature == 0:
        return beam_search(model, state, max_lens, beam_size, len_penalty, n_best, need_weights, on_step=on_step)
    return [[h] for h in sample(model, state, max_lens, temperature, top_k, top_p, generator, need_weights,
                                on_step=on_step)]
