"""A faster decoder for any model of the contract: the same ``encode``, ``init_state`` and ``step``, the same
results (tested against the model's own), less work per step.

For the Transformer-decoded families (:class:`~attnkit.models.transformer.EncoderDecoder`):

* **Beam-grouped cross-attention.** Beam search keeps a sentence's k beams as k consecutive rows. The model's
  own state repeats the source side (memory, cross-attention keys and values) k times; here it stays one row
  per sentence, and the k beams attend to it as k queries of one row (:func:`single_query_attention` with
  G = k), so nothing of the source is copied or gathered as beams are reordered.
* **Cache reordering left to the next step.** Reordering beams gathers every layer's self-attention cache; here
  the order is recorded (:class:`ReorderedKVCache`) and applied while the next step appends its own keys and
  values: one copy of the cache where gathering first makes two.
* **Single-query attention kernels** (:mod:`attnkit.fast.attention`) for each step's one query per row.

For every family, the search's choices use :mod:`attnkit.fast.ranking` (chunked argmax and top-k over the
vocabulary). :func:`attnkit.fast.compile.compile_step` compiles a decoder's steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from attnkit.decode.search import extend_beams, in_vocabulary
from attnkit.errors import AttnkitError
from attnkit.fast.attention import single_query_attention
from attnkit.fast.ranking import argmax_rows, best_extensions
from attnkit.fast.shortlist import output_rows, shortlisted_logits, shortlisted_output
from attnkit.models.contract import DecodingState, GenerativeModel, beam_rows, mean_step_attention
from attnkit.models.transformer import EncoderDecoder, Memory
from attnkit.tokens import EOS


@dataclass
class ReorderedKVCache:
    """Keys and values of one attention layer, [B, H, S, d_head], with ``order`` [B'] a row selection not yet
    applied: the next step gathers the rows as it appends its own keys and values."""

    keys: Tensor
    values: Tensor
    order: Tensor | None = None

    @property
    def rows(self) -> int:
        return self.keys.size(0) if self.order is None else self.order.size(0)

    def select(self, indices: Tensor) -> ReorderedKVCache:
        keys, values = self.resolved()
        return ReorderedKVCache(keys.index_select(0, indices), values.index_select(0, indices))

    def reorder(self, indices: Tensor) -> ReorderedKVCache:
        """:meth:`select`, left for the next step to apply."""
        # a fresh tensor, not a view: a compiled step guards on a view's base, and would compile again for it
        order = indices.clone() if self.order is None else self.order.index_select(0, indices)
        return ReorderedKVCache(self.keys, self.values, order)

    def resolved(self) -> tuple[Tensor, Tensor]:
        """(keys, values) with ``order`` applied."""
        if self.order is None:
            return self.keys, self.values
        return self.keys.index_select(0, self.order), self.values.index_select(0, self.order)

    def append(self, keys: Tensor, values: Tensor) -> ReorderedKVCache:
        """These keys and values [B', H, t, d_head] after the cached ones (reordered)."""
        past_keys, past_values = self.resolved()  # compiled, the gather and the cat are one kernel
        return ReorderedKVCache(torch.cat([past_keys, keys], dim=2), torch.cat([past_values, values], dim=2))


@dataclass
class GroupedDecoderState(DecodingState):
    """The Transformer decoder's state with the source side kept once per sentence.

    With ``beams`` > 1 (beam search) the caches hold ``beams`` consecutive rows per source sentence, and the
    memory and cross-attention keys/values one row per sentence, shared by its beams.
    """

    memory: Memory
    memory_kv: list[ReorderedKVCache]
    caches: list[ReorderedKVCache]
    offset: int = 0
    beams: int = 1

    @property
    def rows(self) -> int:
        return self.caches[0].rows

    @property
    def device(self) -> torch.device:
        return self.memory.states.device

    def select(self, indices: Tensor, same_source: bool = False) -> GroupedDecoderState:
        """Reorder, repeat or drop rows. With ``beams`` > 1 the rows must stay in blocks of one sentence's beams,
        as beam search keeps them."""
        caches = [c.reorder(indices) for c in self.caches]  # gathered by the next step, as it appends
        if same_source:
            return self.replaced(self.memory, self.memory_kv, caches, self.offset, self.beams)
        sources = indices if self.beams == 1 else indices[:: self.beams] // self.beams
        return self.replaced(self.memory.select(sources), [kv.select(sources) for kv in self.memory_kv], caches,
                             self.offset, self.beams)

    def repeat_beams(self, k: int) -> GroupedDecoderState:
        """Every row becomes ``k`` rows, its beams; the source side stays one row per sentence."""
        if self.beams != 1:
            raise ValueError("the state already holds beams")
        rows = beam_rows(self.memory.states.size(0), k, self.device)
        return self.replaced(self.memory, self.memory_kv, [c.reorder(rows) for c in self.caches], self.offset, k)

    def replaced(self, memory: Memory, memory_kv: list[ReorderedKVCache], caches: list[ReorderedKVCache], offset: int,
                 beams: int) -> GroupedDecoderState:
        """A state of this kind with these parts (a subclass keeps what it adds)."""
        return GroupedDecoderState(memory, memory_kv, caches, offset, beams)

    def tensors(self) -> list[Tensor]:
        """The state as flat tensors (for ``torch.export``, :mod:`attnkit.fast.aot`): the memory's states and
        padding mask, each layer's cross-attention keys and values, each layer's cache keys and values, and the
        caches' pending row order [rows] (one for all layers, which are reordered together; every row in place if
        none: one graph serves both)."""
        order = self.caches[0].order
        if order is None:
            order = torch.arange(self.caches[0].rows, device=self.caches[0].keys.device)
        return [self.memory.states, self.memory.padding_mask,
                *(x for kv in self.memory_kv for x in (kv.keys, kv.values)),
                *(x for c in self.caches for x in (c.keys, c.values)), order]

    # how many of the last of :meth:`tensors` are not one row per hypothesis but the same for every row
    unbatched = 0

    @classmethod
    def from_tensors(cls, tensors: list[Tensor], beams: int) -> GroupedDecoderState:
        """The state :meth:`tensors` listed. Its offset is the caches' length: exported, a size, not a constant."""
        layers = (len(tensors) - 3) // 4
        memory_kv, caches, order = tensors[2:2 + 2 * layers], tensors[2 + 2 * layers:-1], tensors[-1]
        return cls(Memory(tensors[0], tensors[1]),
                   [ReorderedKVCache(*memory_kv[i:i + 2]) for i in range(0, 2 * layers, 2)],
                   [ReorderedKVCache(*caches[i:i + 2], order) for i in range(0, 2 * layers, 2)], caches[0].size(2),
                   beams)


@dataclass
class ShortlistedState(GroupedDecoderState):
    """The grouped state of a search whose steps score only a shortlist of target tokens
    (:mod:`attnkit.fast.shortlist`): ``shortlist`` [1, K] their ids, ``output`` the output layer's rows for them
    (weight [1, K, d_model], scale [1, K], bias [1, K]), the same for every row of the search."""

    shortlist: Tensor | None = None
    output: tuple[Tensor, ...] = ()

    unbatched = 4

    @property
    def vocabulary(self) -> Tensor:
        return self.shortlist[0]

    def replaced(self, memory: Memory, memory_kv: list[ReorderedKVCache], caches: list[ReorderedKVCache], offset: int,
                 beams: int) -> ShortlistedState:
        return ShortlistedState(memory, memory_kv, caches, offset, beams, self.shortlist, self.output)

    def tensors(self) -> list[Tensor]:
        """The grouped state's tensors, then the shortlist and the output layer's rows for it."""
        return [*super().tensors(), self.shortlist, *self.output]

    @classmethod
    def from_tensors(cls, tensors: list[Tensor], beams: int) -> ShortlistedState:
        base = GroupedDecoderState.from_tensors(tensors[:-cls.unbatched], beams)
        shortlist, *output = tensors[-cls.unbatched:]
        return cls(base.memory, base.memory_kv, base.caches, base.offset, beams, shortlist, tuple(output))


def _grouped_cross_attention(attn, h: Tensor, padding_mask: Tensor, kv: ReorderedKVCache, need_weights: bool,
                             beams: int):
    """Cross-attention of h [sentences * beams, 1, d] to one row of keys and values per sentence: a sentence's
    beams are that many queries of its row. -> (outputs [sentences * beams, 1, d], weights or None)."""
    n, _, d = h.shape
    # the sentence count from a tensor's size, not n // beams: compiled, sizes are symbols, and (m k) // m is k to
    # the compiler, while n // beams stays a division in every index of the attention's loops
    sentences = kv.keys.size(0)
    grouped = h.view(sentences, -1, d)  # [sentences, beams, d]
    if need_weights:
        out, weights, _ = attn(grouped, None, key_padding_mask=padding_mask, memory_kv=kv, need_weights=True)
        # [sentences, H, beams, S] -> [sentences * beams, H, 1, S]
        weights = weights.transpose(1, 2).reshape(n, weights.size(1), 1, weights.size(-1))
        return out.view(n, 1, d), weights
    heads = single_query_attention(attn.project_queries(grouped), kv.keys, kv.values, padding_mask)
    out = attn.out_proj(heads.transpose(1, 2).reshape(sentences, grouped.size(1), d))
    return out.view(n, 1, d), None


def _grouped_layer(layer, x: Tensor, padding_mask: Tensor, kv: ReorderedKVCache, cache: ReorderedKVCache,
                   need_weights: bool, beams: int):
    """:class:`~attnkit.nn.blocks.DecoderLayer`'s forward for one decoding step, with the sentence's beams grouped
    in cross-attention. -> (x, cross-attention weights or None, the extended cache)."""
    s = layer.self_attn(layer.self_res.sublayer_input(x), causal=True, cache=cache)
    x = layer.self_res.add(x, s.output)
    h = layer.cross_res.sublayer_input(x)
    if beams == 1:
        out, weights, _ = layer.cross_attn(h, None, key_padding_mask=padding_mask, memory_kv=kv,
                                           need_weights=need_weights)
    else:
        out, weights = _grouped_cross_attention(layer.cross_attn, h, padding_mask, kv, need_weights, beams)
    x = layer.cross_res.add(x, out)
    x = layer.ffn_res(x, layer.ffn)
    return x, weights, s.cache


def grouped_step(model: EncoderDecoder, tokens: Tensor, state: GroupedDecoderState, need_weights: bool = False):
    """:meth:`EncoderDecoder.step <attnkit.models.transformer.EncoderDecoder.step>` on a
    :class:`GroupedDecoderState`: tokens [N] -> (log_probs [N, V], the next state, attention [N, S] or None); on a
    :class:`ShortlistedState`, log_probs [N, K] over its shortlist."""
    logits, state, attn = grouped_logits(model, tokens, state, need_weights)
    return torch.log_softmax(logits, dim=-1), state, attn


def grouped_logits(model: EncoderDecoder, tokens: Tensor, state: GroupedDecoderState, need_weights: bool = False):
    """:func:`grouped_step` up to the output layer: tokens [N] -> (logits [N, V] or [N, K], fp32, the next state,
    attention [N, S] or None)."""
    x = model.tgt_embed(tokens[:, None], offset=state.offset)
    padding_mask = state.memory.padding_mask
    caches, weights = [], []
    for layer, kv, cache in zip(model.decoder, state.memory_kv, state.caches):
        x, w, cache = _grouped_layer(layer, x, padding_mask, kv, cache, need_weights, state.beams)
        caches.append(cache)
        weights.append(w)
    attn = mean_step_attention(weights)
    h = model.decoder_norm(x[:, 0])
    logits = shortlisted_logits(h, *state.output) if isinstance(state, ShortlistedState) else model.output(h)
    return logits.float(), state.replaced(state.memory, state.memory_kv, caches, state.offset + 1, state.beams), attn


def greedy_step_from_logits(step, tokens: Tensor, state, limits: Tensor, t: int, need_weights: bool = False):
    """:func:`~attnkit.decode.search.greedy_step` over a step that gives its logits z (``step(..., logits=True)``:
    :meth:`FastDecoder.step`). The best token of ``log_softmax(z) = z - logsumexp(z)`` is z's own, and only its
    log-probability is computed (:func:`log_softmax_at`): a compiled step never writes out the rows of
    log-probabilities and reads them back, which takes about a tenth of int8 greedy decoding's time at 64 sentences
    (the Multi30k model, AMD EPYC Zen 5, torch.profiler). tokens [N], limits [N] -> (next tokens [N], their
    log-probabilities [N], state, attention)."""
    logits, state, attn = step(tokens, state, need_weights, logits=True)
    best = argmax_rows(logits)
    positions = best.masked_fill(limits <= t + 1, EOS)  # a row at its length limit ends
    return in_vocabulary(positions, state), log_softmax_at(logits, positions, best), state, attn


def beam_step_from_logits(step, tokens: Tensor, state, scores: Tensor, history: Tensor, limits: Tensor, t: int,
                          need_weights: bool = False, at_limit: bool = True):
    """:func:`~attnkit.decode.search.beam_step` over a step that gives its logits z (``step(..., logits=True)``),
    ranked with the chunked top-k: an extension's score is ``(score - logsumexp(z)) + z_j``, so that a compiled
    step reads each row of logits for its log-sum-exp and its ranking and never writes out the rows of
    log-probabilities. -> :class:`~attnkit.decode.search.BeamStep`"""
    logits, state, attn = step(tokens, state, need_weights, logits=True)
    return extend_beams(logits, state, attn, scores, history, limits, t, at_limit, best=best_extensions,
                        shift=torch.logsumexp(logits, -1))


def log_softmax_at(logits: Tensor, index: Tensor, best: Tensor) -> Tensor:
    """``log_softmax(logits)[n, index[n]]`` without the other entries: (z_i - m) - log sum_j exp(z_j - m),
    m = max_j z_j, read at ``best`` (the rows' argmax, known: no pass of its own). logits [N, V], index [N],
    best [N] -> [N]"""
    m = logits.gather(1, best[:, None])
    shifted = logits.gather(1, index[:, None]) - m
    return (shifted - (logits - m).exp().sum(-1, keepdim=True).log()).squeeze(1)


class FastDecoder(nn.Module):
    """A model of the contract with the fast runtime's decoding: ``encode``, ``init_state`` and ``step`` as the
    model's, with the grouped state for the Transformer-decoded families (``grouped``), and search steps that
    rank with :mod:`attnkit.fast.ranking` (``ranking``). Everything else (``family``, ``capabilities``, ``cfg``,
    ``forward``) is the model's."""

    def __init__(self, model: GenerativeModel, grouped: bool = True, ranking: bool = True):
        super().__init__()
        self.model = model
        self.grouped = grouped and isinstance(model, EncoderDecoder)
        self.ranking = ranking
        self.family, self.capabilities, self.cfg = model.family, model.capabilities, model.cfg
        self._output_rows = None  # the output layer as rows, to gather shortlists' from (made when first asked)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def require(self, capability: str) -> None:
        self.model.require(capability)

    def encode(self, source: Tensor, *args, **kwargs):
        return self.model.encode(source, *args, **kwargs)

    def init_state(self, memory) -> DecodingState:
        if not self.grouped:
            return self.model.init_state(memory)
        memory_kv = [ReorderedKVCache(kv.keys, kv.values) for kv in
                     (layer.cross_attn.project_memory(memory.states) for layer in self.model.decoder)]
        b, h, _, d_head = memory_kv[0].keys.shape
        # empty, not None: every step then has the same kind of input. Separate tensors, as after a reordering:
        # a compiled step guards on which inputs are the same tensor, and would compile once more
        empty = memory_kv[0].keys.new_zeros
        caches = [ReorderedKVCache(empty(b, h, 0, d_head), empty(b, h, 0, d_head)) for _ in self.model.decoder]
        return GroupedDecoderState(memory, memory_kv, caches)

    def restrict_vocabulary(self, state: DecodingState, ids: Tensor) -> ShortlistedState:
        """``state`` whose steps score only the target tokens ``ids`` [K] (sorted, the special tokens first:
        :mod:`attnkit.fast.shortlist`)."""
        if not isinstance(state, GroupedDecoderState):
            raise AttnkitError(f"a shortlist needs a Transformer translation model (this is a {self.family} model)")
        # a tensor of torch's own, whose memory is aligned as a compiled graph assumes: one made from a NumPy array may
        # not be, and a package then copied it at every step
        ids = ids.to(state.device, copy=True)
        if self._output_rows is None:  # the model is not changed after it decodes
            self._output_rows = output_rows(self.model.output)
        return ShortlistedState(state.memory, state.memory_kv, state.caches, state.offset, state.beams, ids.view(1, -1),
                                shortlisted_output(self._output_rows, ids))

    def step(self, tokens: Tensor, state: DecodingState, need_weights: bool = False, logits: bool = False):
        """The model's step; ``logits``: the output layer's logits in place of the log-probabilities (a model that
        gives only log-probabilities gives them: they are their own logits, log_softmax of them being themselves)."""
        if isinstance(state, GroupedDecoderState):
            return (grouped_logits if logits else grouped_step)(self.model, tokens, state, need_weights)
        return self.model.step(tokens, state, need_weights)

    def search_steps(self) -> dict:
        """Greedy and beam search steps over :meth:`step`, ranking with the chunked kernels where ``ranking``."""
        if not self.ranking:
            return {}
        return {"greedy_step": partial(greedy_step_from_logits, self.step),
                "beam_step": partial(beam_step_from_logits, self.step)}
