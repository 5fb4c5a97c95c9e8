"""Greedy decoding, beam search and sampling, written once for every model.

A model offers the decoding interface (see ARCHITECTURE.md)::

    memory = model.encode(src)                  # once per batch
    state = model.init_state(memory)            # caches / recurrent state, with state.select(indices, same_source)
    log_probs, state, attn = model.step(tokens, state, need_weights)   # tokens [N] -> [N, V], attn [N, S] or None

The functions here take the initial ``state`` and never look inside it. ``state.repeat_beams(k)`` makes k
consecutive rows (beams) of every row; ``state.select(indices)`` reorders, repeats or drops rows; with
``same_source=True`` the caller promises that every row keeps its source sentence (beam search reordering
one sentence's beams), so the source side (encoder memory, cross-attention keys and values) need not be
gathered again.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnkit.decode.ranking import argmax_rows, best_extensions

BOS, EOS = 2, 3


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities (beam search: divided by length ** len_penalty)
    attention: Tensor | None = None  # [len(tokens) + 1, S]: one row per output step, EOS included
    log_probs: list[float] = field(default_factory=list)  # sampling: one per output step, EOS included


def model_device(model) -> torch.device:
    """Where ``model`` keeps its weights (the CPU for models without parameters, e.g. onnxruntime's)."""
    parameters = getattr(model, "parameters", None)
    first = next(parameters(), None) if callable(parameters) else None
    return torch.device("cpu") if first is None else first.device


def max_lengths(src_lengths: Tensor, a: float, b: int) -> Tensor:
    """The longest output allowed per sentence: ``a * source length + b`` (fairseq's max_len_a/b)."""
    return (src_lengths.float() * a + b).long().clamp(min=1)


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
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _end_at_limits(log_probs: Tensor, tokens: Tensor, limits: Tensor, t: int) -> tuple[Tensor, Tensor]:
    """tokens [N] chosen at step ``t`` -> (tokens with EOS where a row reaches its limit [N], their log-probs [N])."""
    tokens = tokens.masked_fill(limits <= t + 1, EOS)
    return tokens, log_probs.gather(1, tokens[:, None]).squeeze(1)


def greedy_step(step, tokens: Tensor, state, limits: Tensor, t: int, need_weights: bool = False):
    """A greedy decoding step: ``step`` (a model's) and the choice of its best tokens, in one function, so that
    :func:`compile_step` compiles them into one graph. tokens [N], limits [N] (the longest output allowed per row)
    -> (next tokens [N], their log-probabilities [N], state, attention)."""
    log_probs, state, attn = step(tokens, state, need_weights)
    return *_end_at_limits(log_probs, argmax_rows(log_probs), limits, t), state, attn


def _search_step(model, search_step):
    """``search_step`` with ``model.step`` bound: the compiled version if :func:`compile_step` made one."""
    compiled = getattr(model, "compiled_search_steps", {}).get(search_step.__name__)
    return compiled or partial(search_step, model.step)


@torch.no_grad()
def sample(model, state, max_lens: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None, need_weights: bool = False,
           prefix: Tensor | None = None, on_token: Callable[[Tensor], None] | None = None) -> list[Hypothesis]:
    """Ancestral sampling; ``temperature == 0`` is greedy decoding. One hypothesis per batch row.

    max_lens [N]; ``prefix`` [N, P] forces the first P output tokens (a language model's prompt);
    ``on_token`` is called after every step with the tokens just chosen [N] (EOS once a row ended), to stream them.
    """
    dev = model_device(model)
    n, limit = max_lens.size(0), int(max_lens.max())
    rows = torch.arange(n, device=dev)  # the batch row of each sentence still decoding; finished ones leave
    every_row = True  # no sentence has left yet: rows[i] == i, and plain slices index the outputs
    row_limits = max_lens.to(dev)
    prefix = None if prefix is None else prefix.to(dev)
    tokens = torch.full((n,), BOS, dtype=torch.long, device=dev)
    out = torch.full((n, limit), EOS, dtype=torch.long, device=dev)
    step_scores, attn_all, steps = torch.zeros(n, limit, device=dev), None, 0
    step_and_choose = _search_step(model, greedy_step)
    for t in range(limit):
        if temperature == 0 and (prefix is None or t >= prefix.size(1)):
            tokens, scores, state, attn = step_and_choose(tokens, state, row_limits, t, need_weights)
        else:
            log_probs, state, attn = model.step(tokens, state, need_weights)
            if prefix is not None and t < prefix.size(1):
                tokens = prefix[rows, t]
            else:
                logits = filter_logits(log_probs / temperature, top_k, top_p)
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
            if attn_all is None:
                attn_all = attn.new_zeros(n, limit, attn.size(-1))  # [N, T, S]
            attn_all[at] = attn
        if on_token is not None:
            on_token(out[:, t])
        going = tokens.ne(EOS)
        n_going = int(going.sum())  # one synchronisation a step
        if n_going == 0:
            break
        if n_going < tokens.size(0):  # drop finished sentences, so later steps compute only the live ones
            keep = going.nonzero().squeeze(1)
            state, rows, tokens, row_limits = state.select(keep), rows[keep], tokens[keep], row_limits[keep]
            every_row = False
    hyps = []
    for i, row in enumerate(out[:, :steps].tolist()):
        length = row.index(EOS) if EOS in row else len(row)
        lps = step_scores[i, : length + 1]
        hyps.append(Hypothesis(row[:length], float(lps.sum()), None if attn_all is None else attn_all[i, : length + 1],
                               lps.tolist()))
    return hyps


def greedy(model, state, max_lens: Tensor, need_weights: bool = False) -> list[Hypothesis]:
    return sample(model, state, max_lens, temperature=0.0, need_weights=need_weights)


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
              need_weights: bool = False, at_limit: bool = True) -> BeamStep:
    """A beam search step: ``step`` (a model's) on the beams' last tokens, then the ranking, in one function, so that
    :func:`compile_step` compiles them into one graph. tokens [m k] (at ``t == 0``: [m], one row per sentence),
    scores [m, k], history [m k, t], limits [m] (the longest output allowed); ``at_limit``: some sentence reaches
    its limit at this step (else eager code skips the mask that allows only EOS there)."""
    log_probs, state, attn = step(tokens, state, need_weights)
    m, k = scores.shape
    if t == 0:  # the k beams of a sentence would start the same: one row each took the first step
        state = state.repeat_beams(k)  # k rows per sentence (a Transformer keeps its source side once)
        attn = None if attn is None else attn.repeat_interleave(k, 0)
    beams, v, dev = 1 if t == 0 else k, log_probs.size(-1), log_probs.device
    log_probs = log_probs.view(m, beams, v)
    if torch.compiler.is_compiling() or at_limit:  # at the length limit only EOS may follow
        last = (limits <= t + 1)[:, None, None] & (torch.arange(v, device=dev) != EOS)
        log_probs = log_probs.masked_fill(last, float("-inf"))
    top_scores, top_idx = best_extensions(scores[:, :beams], log_probs, 2 * k)  # [m, 2k] of the k * v
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
    tokens = top_token.gather(1, pick).view(-1)
    scores = top_scores.gather(1, pick).masked_fill(~going.gather(1, pick), float("-inf"))
    # every row stays with its own sentence: the source side of the state is left as it is
    history = torch.cat([history[rows], tokens[:, None]], 1)
    return BeamStep(state.select(rows, same_source=True), tokens, scores, history, rows, ending, top_scores,
                    candidate_rows, ~going.any(1), attn)


@torch.no_grad()
def beam_search(model, state, max_lens: Tensor, beam_size: int = 5, len_penalty: float = 1.0, n_best: int = 1,
                need_weights: bool = False) -> list[list[Hypothesis]]:
    """Batched beam search. Returns, per sentence, the ``n_best`` hypotheses best first.

    Each step ranks the 2k best extensions of a sentence's k beams. An EOS candidate ranked above the
    k-th non-EOS one ends a hypothesis, scored ``sum log p / (length + 1) ** len_penalty`` (the +1 counts
    EOS); the first k non-EOS candidates are the next beams. A sentence stops when it holds ``beam_size``
    finished hypotheses (or has no live candidate left), and is then dropped from the batch, so later steps
    compute only the sentences still searching. The ranking is done on tensors for all sentences at once
    (:func:`beam_step`); Python only sees the hypotheses that end.
    """
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
                    finished[s].append(Hypothesis(hist, score / (t + 1) ** len_penalty, a))
                if len(finished[s]) >= k:
                    done.add(j)
        state, tokens, scores, history = r.state, r.tokens, r.scores, r.history
        if r.attention is not None:
            step_attn = r.attention[r.rows][:, None]
            attn_history = step_attn if attn_history is None else torch.cat([attn_history[r.rows], step_attn], 1)
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


class _OutputProjection(nn.Module):
    """``nn.Linear`` with its weight kept as [d_in, d_out]: ``x @ W^T`` without a transposed operand; or, with
    ``prepack`` (for a frozen compiled model), a oneDNN product with the weight packed once, when compiled."""

    def __init__(self, linear: nn.Linear, prepack: bool = False):
        super().__init__()
        self.prepack = prepack
        weight = linear.weight.detach()
        self.register_buffer("weight", weight.clone() if prepack else weight.t().contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        if self.prepack and torch.compiler.is_compiling():
            # frozen, the packing has only constant inputs, so Inductor runs it once, when it compiles
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)
            return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
        out = x @ (self.weight.t() if self.prepack else self.weight)
        return out if self.bias is None else out + self.bias


@functools.cache
def _register_fake_weight_packing() -> None:
    """Let torch.compile trace ``mkldnn::_reorder_linear_weight``: PyTorch gives it no fake kernel, as Inductor only
    inserts it after tracing. The packed weight is opaque; the product's shape rule reads only its size."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key("mkldnn::_reorder_linear_weight", "Meta"):
        torch.library.register_fake("mkldnn::_reorder_linear_weight")(
            lambda weight, batch_size=None: weight.new_empty(weight.shape))


def compile_step(model, cpp_wrapper: bool = True, freeze: bool = False, pack_output: bool | None = None,
                 ahead_of_time: bool = False):
    """Compile ``model.step``, ``model.encode`` and ``model.init_state`` with ``torch.compile``, for inference
    (CPU or GPU); returns the model, which must not be changed afterwards.

    The output projection's [V, d] matrix is stored transposed, [d, V], unless it is packed (below; a copy either
    way: the model is for inference from then on): at batch 1 a product with it measured 52 against 95
    microseconds for the 6k vocabulary (EPYC).
    Shapes are dynamic (the batch shrinks, the cache grows every step), so one graph serves every step
    after the first two (cache lengths 0 and 1 are compiled apart), and one the encoder, whatever the source
    length. Each graph of the Multi30k model took 17 to 26 s to compile on this CPU, and greedy decoding at
    batch 64 makes six (cache lengths 0, 1 and more; one row left; rows reordered or not). The compiled
    kernels may round differently from eager ones: ``bench/translate_throughput.py`` counts the outputs
    that differ and scores both. Inductor's C++ wrapper (``cpp_wrapper``) calls the kernels from C++
    instead of generated Python: at batch 1, where a step is a few microseconds of arithmetic per kernel,
    ``bench/compile_step.py`` measures it against the default wrapper. Training is not compiled: here it made
    a training step slower.

    Every linear layer's weight [out, in] is stored column-major (the same values and shape, strides (1, out)), so
    that ``F.linear``'s ``x @ W^T`` hands BLAS a contiguous [in, out] matrix rather than a transposed one. On an
    AVX-512 Xeon (one thread, 37 rows) MKL took 34.6 against 39.7 us for [128, 384], 13.9 against 18.2 for
    [128, 128] and 23.2 against 31.9 for [256, 128]; greedy decoding at batch 64 went from 1.67-1.73 to 1.50-1.56 s
    for the 1,000 test sentences (one process, interleaved, compiled and frozen).

    ``freeze`` lets Inductor treat the weights as constants. The output projection may then be a oneDNN product
    with its weight packed once, at compile time (``pack_output``; None: if that measures faster here, on 32 rows).
    Which is faster depends on the machine: on an AMD EPYC packing took the 6k-vocabulary projection of 40 rows
    from 1,103 to 710 microseconds, on the AVX-512 Xeon it was slower than the column-major product at every
    size tried (518 against 486 us at 37 rows, 221 against 179 at 5). The layers' small products stay MKL's: packed
    for oneDNN (what Inductor's freezing does to every linear layer when shapes are dynamic) they were slower on
    both machines: 76 against 62 us for [40, 128] x [128, 384] (EPYC), 50 against 35 for [37, 128] x [128, 384]
    (Xeon). Freezing pays when a step decodes several rows (beam search, batches); at one row packed products were
    slower (greedy at batch 1 on the EPYC: 972-1,190 against 1,241-1,402 tokens/s), and on the Xeon, frozen without
    packing, it measured the same (963-1,009 against 994-1,087), so ``attnkit translate --compile`` freezes
    unless it decodes one sentence greedily.

    ``ahead_of_time``: greedy decoding and beam search run their steps exported and compiled by AOTInductor
    (:mod:`attnkit.decode.aot`), where the model's state allows it (the Transformer's), without the Python that
    torch.compile runs around each call.

    Greedy decoding and beam search call :func:`greedy_step` and :func:`beam_step`, the model's step together with
    the choice of the next tokens, compiled here as one graph each; ``model.step`` alone serves sampling. Against
    the compiled step alone with every linear layer packed, in one process, interleaved (1,000 test sentences in
    batches of 64, three rounds; 200 sentences one by one, two rounds): greedy at batch 64 took 6.38 against
    6.62 s, beam 5 at batch 1 7.77 against 8.89 s (before the constants' guards below, and before
    :func:`~attnkit.decode.ranking.argmax_rows` took its chunked path in compiled graphs too, which cut the fused
    log-softmax-and-argmax kernel from 420 to 251 us).
    """
    # the model is not changed after this, so most checks that its modules' attributes are still the same can go
    options = {"cpp_wrapper": cpp_wrapper, "guard_filter_fn": _keep_identities_and_constants}
    can_pack = freeze and torch.backends.mkldnn.is_available() and model_device(model).type == "cpu"
    output = getattr(model, "output", None)
    if isinstance(output, nn.Linear):
        prepack = can_pack and (_packing_pays(output.weight.detach()) if pack_output is None else pack_output)
        if prepack:
            _register_fake_weight_packing()
        model.output = _OutputProjection(output, prepack)
    _store_column_major(model)
    eager_step = model.step
    # Sizes 0 and 1 are compiled apart (cache lengths 0 and 1, one sentence left), as are greedy and beam steps
    # and cache layouts that differ only in the strides of size-1 dimensions: greedy decoding and beam search
    # at batches 1 and 64 made 10 step graphs, past Dynamo's default limit of 8, above which it runs eager.
    def compile(fn):
        compiled = torch.compile(fn, dynamic=True, options=options, recompile_limit=32)
        return _frozen(compiled) if freeze else compiled

    # greedy decoding and beam search compile the step with their choice of the next tokens (one graph, where the
    # choice alone was some 35 small eager operations a step); model.step itself serves sampling
    model.compiled_search_steps = {fn.__name__: compile(partial(fn, model.step)) for fn in (greedy_step, beam_step)}
    if ahead_of_time:
        from attnkit.decode.aot import AheadOfTimeStep

        model.compiled_search_steps = {name: AheadOfTimeStep(model, eager_step, fn, model.compiled_search_steps[name])
                                       for name, fn in (("greedy_step", greedy_step), ("beam_step", beam_step))}
    for name in ("step", "encode", "init_state"):
        setattr(model, name, compile(getattr(model, name)))
    return model


def _store_column_major(model: nn.Module) -> None:
    """Every ``nn.Linear`` weight [out, in] of ``model`` stored column-major: ``F.linear`` then multiplies by a
    contiguous [in, out] matrix, which BLAS runs faster at a decoding step's few rows (see :func:`compile_step`).
    Slices of the weight (the attention's Q and K/V thirds) are row ranges, which stay plain matrices for BLAS."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.stride(0) != 1:
            module.weight = nn.Parameter(module.weight.detach().t().contiguous().t(), requires_grad=False)


def _packing_pays(weight: Tensor, rows: int = 32, repeats: int = 20) -> bool:
    """Whether oneDNN's packed product ``x @ weight^T`` beats the plain one with ``weight`` [out, in] transposed
    once, on this machine: the better of five timings of ``repeats`` products of ``rows`` rows each."""
    x = weight.new_empty(rows, weight.size(1)).normal_()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    plain = weight.t().contiguous()

    def best(product) -> float:
        product()  # warm-up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeats):
                product()
            times.append(time.perf_counter() - start)
        return min(times)

    return best(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")) < best(lambda: x @ plain)


def _keep_identities_and_constants(guard_entries) -> list[bool]:
    """Dynamo's guards for a compiled model, which is not changed after :func:`compile_step`: of those on its
    modules' attributes, only the identity checks (of the weights, when frozen) and the constants' (flags such as
    ``_OutputProjection.prepack``). Every compiled model shares ``step``'s code, and so the graphs Dynamo keeps for
    it: without the identity checks a second frozen model in the same process ran the first one's graph, whose
    weights are constants; without the constants' a frozen model ran an unfrozen model's graph, which reads the
    output projection's weight in the other layout (both tested). Of ~1,200 guards, Dynamo's cache lookup for a
    5-beam step took 67-77 us with the frozen model's 74 identity checks alone against 117-234 us with all
    (torch.profiler, three runs each); decoding end to end showed no difference beyond this machine's noise."""
    return [e.guard_type in ("ID_MATCH", "CONSTANT_MATCH") or not e.orig_guard.source.is_unspecialized_nn_module()
            for e in guard_entries]


def _frozen(compiled):
    """Run ``compiled`` with Inductor's freezing on. ``torch.compile(options={"freezing": True})`` is not enough:
    Dynamo reads the global setting when it traces (to make the weights graph constants, not inputs), and it
    traces inside a call, whenever a new shape needs a graph; so the setting is on for every call."""
    import torch._inductor.config as inductor_config

    # one patch object: entering it costs ~6 us, making one 18. Inductor would prepack every linear layer for
    # oneDNN (dynamic shapes rule out MKL's packing): only the output projection packs itself (_OutputProjection)
    freezing = inductor_config.patch({"freezing": True, "cpp.weight_prepack": False})

    def call(*args, **kwargs):
        with freezing:
            return compiled(*args, **kwargs)

    return call


@torch.no_grad()
def generate(model, src, max_lens: Tensor, beam_size: int = 1, len_penalty: float = 1.0, n_best: int = 1,
             need_weights: bool = False, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None) -> list[list[Hypothesis]]:
    """Encode ``src`` once, then search: beam search when ``beam_size > 1``, else greedy (``temperature == 0``)
    or sampling. Returns the n-best list of every batch row. No autograd graph is recorded, encoder included."""
    state = model.init_state(model.encode(src.to(model_device(model))))
    if beam_size > 1 and temperature == 0:
        return beam_search(model, state, max_lens, beam_size, len_penalty, n_best, need_weights)
    return [[h] for h in sample(model, state, max_lens, temperature, top_k, top_p, generator, need_weights)]
