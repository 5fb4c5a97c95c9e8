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

from collections.abc import Callable
from dataclasses import dataclass, field

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
    for t in range(limit):
        log_probs, state, attn = model.step(tokens, state, need_weights)
        if prefix is not None and t < prefix.size(1):
            tokens = prefix[rows, t]
        elif temperature == 0:
            tokens = argmax_rows(log_probs)
        else:
            logits = filter_logits(log_probs / temperature, top_k, top_p)
            probs = torch.softmax(logits, -1)
            if generator is not None and generator.device != probs.device:  # a seed draws the same on any device
                probs = probs.cpu()
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(dev)
        tokens = tokens.masked_fill(row_limits <= t + 1, EOS)  # force an end
        at = (slice(None) if every_row else rows, t)
        step_scores[at] = log_probs.gather(1, tokens[:, None]).squeeze(1)
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


@torch.no_grad()
def beam_search(model, state, max_lens: Tensor, beam_size: int = 5, len_penalty: float = 1.0, n_best: int = 1,
                need_weights: bool = False) -> list[list[Hypothesis]]:
    """Batched beam search. Returns, per sentence, the ``n_best`` hypotheses best first.

    Each step ranks the 2k best extensions of a sentence's k beams. An EOS candidate ranked above the
    k-th non-EOS one ends a hypothesis, scored ``sum log p / (length + 1) ** len_penalty`` (the +1 counts
    EOS); the first k non-EOS candidates are the next beams. A sentence stops when it holds ``beam_size``
    finished hypotheses (or has no live candidate left), and is then dropped from the batch, so later steps
    compute only the sentences still searching. The ranking is done on tensors for all sentences at once;
    Python only sees the hypotheses that end.
    """
    n, k, dev = max_lens.size(0), beam_size, model_device(model)
    live = list(range(n))  # sentence id of each remaining block of k rows
    limits = max_lens.tolist()
    scores = torch.full((n, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive
    history = torch.full((n * k, 0), BOS, dtype=torch.long, device=dev)  # [rows, t] the tokens so far of each beam
    attn_history = None  # [rows, t, S]
    tokens = torch.full((n,), BOS, dtype=torch.long, device=dev)
    finished: list[list[Hypothesis]] = [[] for _ in range(n)]
    rank = torch.arange(2 * k, device=dev)
    for t in range(max(limits)):
        log_probs, state, attn = model.step(tokens, state, need_weights)
        if t == 0:  # the k beams of a sentence would start the same: one row each took the first step
            state = state.repeat_beams(k)  # k rows per sentence (a Transformer keeps its source side once)
            attn = None if attn is None else attn.repeat_interleave(k, 0)
        beams = 1 if t == 0 else k  # rows of log_probs per sentence
        m, v = len(live), log_probs.size(-1)
        log_probs = log_probs.view(m, beams, v)
        last = [t + 1 >= limits[s] for s in live]
        if any(last):  # at the length limit only EOS may follow
            not_eos = torch.arange(v, device=dev) != EOS
            log_probs = log_probs.masked_fill(torch.tensor(last, device=dev)[:, None, None] & not_eos, float("-inf"))
        top_scores, top_idx = best_extensions(scores[:, :beams], log_probs, 2 * k)  # [m, 2k] of the k * v
        top_beam, top_token = top_idx // v, top_idx % v
        alive, ends = top_scores > float("-inf"), top_token == EOS
        going = alive & ~ends
        # an EOS candidate ends a hypothesis if fewer than k going candidates rank above it
        ending = alive & ends & (going.cumsum(1) - going.long() < k)
        # the step's two reads of tensor values, short lists (usually empty)
        ended = ending.nonzero().tolist()
        done = set((~going.any(1)).nonzero().flatten().tolist())
        if ended:
            rows = (top_beam[ending] + ending.nonzero()[:, 0] * k).tolist()
            hists = history[rows].tolist()
            for (j, _), row, score, hist in zip(ended, rows, top_scores[ending].tolist(), hists):
                s = live[j]
                if len(finished[s]) < k:
                    a = None
                    if attn is not None:
                        a = attn[row][None] if attn_history is None else torch.cat([attn_history[row],
                                                                                    attn[row][None]])
                    finished[s].append(Hypothesis(hist, score / (t + 1) ** len_penalty, a))
                if len(finished[s]) >= k:
                    done.add(j)
        # the first k going candidates of each sentence (fewer: dead beams with score -inf fill the rest)
        pick = torch.where(going, rank, rank + 2 * k).topk(k, dim=1, largest=False).indices  # [m, k], in rank order
        scores = top_scores.gather(1, pick).masked_fill(~going.gather(1, pick), float("-inf"))
        rows = (top_beam.gather(1, pick) + torch.arange(m, device=dev)[:, None] * k).view(-1)
        tokens = top_token.gather(1, pick).view(-1)
        if done:
            keep = [j for j in range(m) if j not in done]
            live = [live[j] for j in keep]
            if not live:
                break
            keep = torch.tensor(keep, device=dev)
            scores, rows, tokens = scores[keep], rows.view(m, k)[keep].view(-1), tokens.view(m, k)[keep].view(-1)
            state = state.select(rows)
        else:  # every row stays with its own sentence: the source side of the state is left as it is
            state = state.select(rows, same_source=True)
        history = torch.cat([history[rows], tokens[:, None]], dim=1)
        if attn is not None:
            step_attn = attn[rows][:, None]
            attn_history = step_attn if attn_history is None else torch.cat([attn_history[rows], step_attn], 1)
    return [sorted(f, key=lambda h: -h.score)[:n_best] for f in finished]


class _OutputProjection(nn.Module):
    """``nn.Linear`` with its weight kept as [d_in, d_out]: ``x @ W^T`` without a transposed operand."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        out = x @ self.weight_t
        return out if self.bias is None else out + self.bias


def compile_step(model, cpp_wrapper: bool = True, freeze: bool = False):
    """Compile ``model.step``, ``model.encode`` and ``model.init_state`` with ``torch.compile``, for inference
    (CPU or GPU); returns the model, which must not be changed afterwards.

    The output projection's [V, d] matrix is stored transposed, [d, V] (a copy: the model is for inference
    from then on): at batch 1 a product with it measured 52 against 95 microseconds for the 6k vocabulary.
    Shapes are dynamic (the batch shrinks, the cache grows every step), so one graph serves every step
    after the first two (cache lengths 0 and 1 are compiled apart), and one the encoder, whatever the source
    length. Compiling took 35 to 40 s on first use for the Multi30k model on this CPU. The compiled
    kernels may round differently from eager ones: ``bench/translate_throughput.py`` counts the outputs
    that differ and scores both. Inductor's C++ wrapper (``cpp_wrapper``) calls the kernels from C++
    instead of generated Python: at batch 1, where a step is a few microseconds of arithmetic per kernel,
    ``bench/compile_step.py`` measures it against the default wrapper. Training is not compiled: here it made
    a training step slower.

    ``freeze`` lets Inductor treat the weights as constants and prepack every linear layer for oneDNN. That
    pays when a step decodes several rows (beam search, batches): the 6k-vocabulary projection of 5 rows took
    97 against 197 microseconds, and decoding 640 test sentences in batches of 64 went from 7,367-8,477 to
    8,275-9,388 tokens/s (greedy) and from 2,123-2,830 to 2,742-3,100 (beam 5). At one row the packed
    products are slower (greedy at batch 1: 972-1,190 against 1,241-1,402 tokens/s), so ``attnkit translate
    --compile`` freezes unless it decodes one sentence greedily.
    """
    # the model is not changed after this, so the checks that its modules' attributes are still the same
    # can go: a batch-1 step then took 0.44 to 0.47 ms against 0.48 to 0.51 ms (four runs each)
    skip_module_guards = _keep_weight_identity if freeze else torch.compiler.skip_guard_on_all_nn_modules_unsafe
    options = {"cpp_wrapper": cpp_wrapper, "guard_filter_fn": skip_module_guards}
    if isinstance(getattr(model, "output", None), nn.Linear):
        model.output = _OutputProjection(model.output)
    # Sizes 0 and 1 are compiled apart (cache lengths 0 and 1, one sentence left), as are greedy and beam steps
    # and cache layouts that differ only in the strides of size-1 dimensions: greedy decoding and beam search
    # at batches 1 and 64 made 10 step graphs, past Dynamo's default limit of 8, above which it runs eager.
    for name in ("step", "encode", "init_state"):
        compiled = torch.compile(getattr(model, name), dynamic=True, options=options, recompile_limit=32)
        setattr(model, name, _frozen(compiled) if freeze else compiled)
    return model


def _keep_weight_identity(guard_entries) -> list[bool]:
    """Dynamo's guards for a frozen model: none on its modules' attributes but the identity of its weights.
    Frozen, the weights are constants of the graph, and two models share ``step``'s code: without the identity
    checks a second frozen model in the same process ran the first one's graph (tested). The weights' checks are
    74 of the ~1,200 guards; Dynamo's cache lookup for a 5-beam step took 67-77 us with them alone against
    117-234 us with all (torch.profiler, three runs each), though decoding end to end showed no difference
    beyond this machine's noise (interleaved in one process, where both copies shared ``step``'s cache entries:
    352 against 362 tokens/s at beam 5, batch 1)."""
    return [e.guard_type == "ID_MATCH" or not e.orig_guard.source.is_unspecialized_nn_module() for e in guard_entries]


def _frozen(compiled):
    """Run ``compiled`` with Inductor's freezing on. ``torch.compile(options={"freezing": True})`` is not enough:
    Dynamo reads the global setting when it traces (to make the weights graph constants, not inputs), and it
    traces inside a call, whenever a new shape needs a graph; so the setting is on for every call."""
    import torch._inductor.config as inductor_config

    freezing = inductor_config.patch(freezing=True)  # one patch object: entering it costs ~6 us, making one 18

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
