"""The model contract: what every family offers, declared once, so that decoding, training, serving and the
plots are written once.

A generating model (:class:`GenerativeModel`) offers::

    memory = model.encode(source)                        # once per batch: token ids [B, S] or image grids [B, L, D]
    state = model.init_state(memory)                     # a DecodingState: caches, recurrent state, the memory
    log_probs, state, attention = model.step(tokens, state, need_weights)   # tokens [N] -> [N, V], [N, S] or None
    state = model.restrict_vocabulary(state, ids)        # optional: steps score only ids [K], log_probs [N, K]
    out = model(source, tgt_in, targets=tgt_out)         # teacher forcing -> ModelOutput(loss, nll, logits, attention)

and its state offers ``select(indices)`` (reorder, repeat or drop rows) and ``repeat_beams(k)`` (every row
becomes k consecutive rows, its beams), both through :func:`beam_rows` and ``index_select`` on the state's
own device. ``capabilities`` says what the family can do (translate, generate, caption, score, attention,
align), so callers ask, never probe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn


@dataclass
class AttentionMaps:
    """Every attention of one teacher-forced pass, per layer, each [B, H, T_query, T_key].

    ``encoder``: the encoder's self-attention (source over source); ``decoder``: the decoder's masked
    self-attention (target over target so far; a language model's only attention); ``cross``: the decoder's
    attention over the source (RNNsearch's alignment and Show-Attend-Tell's image attention are one layer
    of one head).
    """

    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)

    @property
    def self_attention(self) -> list[Tensor]:
        """The input's attention over itself: an encoder's, or a decoder-only model's masked self-attention."""
        return self.encoder or self.decoder


@dataclass
class ModelOutput:
    """What ``model(source, tgt_in, targets=..., need_weights=...)`` returns, for every family.

    ``loss``: the training objective summed over target tokens (label-smoothed NLL, plus any penalty the
    model's paper adds), None without targets. ``nll``: ``-log p(targets)`` summed, without gradient.
    ``logits``: [B, T, V] (None when only the loss was asked for and the model never made them).
    ``attention``: :class:`AttentionMaps` when ``need_weights``.
    """

    loss: Tensor | None = None
    nll: Tensor | None = None
    logits: Tensor | None = None
    attention: AttentionMaps | None = None


def beam_rows(rows: int, k: int, device: torch.device) -> Tensor:
    """The indices that make every row of a batch ``k`` consecutive rows: [rows * k] = 0,0,..,1,1,.. on
    ``device`` (where the state lives: an index on another device would fail or copy every step)."""
    return torch.arange(rows, device=device).repeat_interleave(k)


class DecodingState:
    """A decoder's state between steps. Subclasses implement :meth:`select` and :attr:`rows`/:attr:`device`.

    ``select(indices, same_source)``: ``same_source`` is the caller's promise that every row keeps its source
    sentence (beam search reordering a sentence's beams); a state may use it to leave its source side alone.
    """

    @property
    def rows(self) -> int:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    @property
    def vocabulary(self) -> Tensor | None:
        """The target token ids [K] that a step's log-probabilities [N, K] range over, in order, the special tokens
        first (a shortlist: :meth:`GenerativeModel.restrict_vocabulary`); None: the whole vocabulary, by id."""
        return None

    def select(self, indices: Tensor, same_source: bool = False) -> DecodingState:
        raise NotImplementedError

    def repeat_beams(self, k: int) -> DecodingState:
        """Every row becomes ``k`` consecutive rows (its beams)."""
        return self.select(beam_rows(self.rows, k, self.device))


class RecurrentState(DecodingState):
    """A recurrent decoder's state (a dataclass): its source side, ``memory`` and what is computed from it once
    (:attr:`SOURCE`, kept as it is when a search reorders a sentence's own beams), and its recurrent tensors, each
    with its batch dimension (:attr:`ROW_DIMS`, the first of which gives :attr:`rows` and :attr:`device`)."""

    SOURCE: ClassVar[tuple[str, ...]] = ("memory", "projected")
    ROW_DIMS: ClassVar[dict[str, int]] = {}

    @property
    def rows(self) -> int:
        name, dim = next(iter(self.ROW_DIMS.items()))
        return getattr(self, name).size(dim)

    @property
    def device(self) -> torch.device:
        return getattr(self, next(iter(self.ROW_DIMS))).device

    def select(self, indices: Tensor, same_source: bool = False) -> RecurrentState:
        changes = {name: getattr(self, name).index_select(dim, indices) for name, dim in self.ROW_DIMS.items()}
        if not same_source:
            for name in self.SOURCE:
                x = getattr(self, name)
                # a tensor [B, ...], or the memory (which selects its own rows), or None
                changes[name] = x if x is None else x.index_select(0, indices) if isinstance(x, Tensor) \
                    else x.select(indices)
        return dataclasses.replace(self, **changes)


class GenerativeModel(nn.Module):
    """The base of every family that generates a sequence token by token."""

    capabilities: ClassVar[frozenset[str]] = frozenset()

    @property
    def family(self) -> str:
        """The family's name, as its config (``cfg``) names it (:mod:`attnkit.registry`)."""
        return self.cfg.family

    def encode(self, source: Tensor):
        raise NotImplementedError

    def init_state(self, memory) -> DecodingState:
        raise NotImplementedError

    def step(self, tokens: Tensor, state: DecodingState,
             need_weights: bool = False) -> tuple[Tensor, DecodingState, Tensor | None]:
        """tokens [N] (the previous outputs) -> (log-probabilities [N, V], the next state, attention [N, S] over
        the source (or the tokens so far, for a language model) averaged over heads and layers, or None)."""
        raise NotImplementedError

    def forward(self, source: Tensor | None, tgt_in: Tensor, targets: Tensor | None = None,
                label_smoothing: float = 0.0, need_weights: bool = False) -> ModelOutput:
        raise NotImplementedError

    def restrict_vocabulary(self, state: DecodingState, ids: Tensor) -> DecodingState:
        """``state`` whose steps score only the target tokens ``ids`` [K] (sorted, the special tokens first), their
        log-probabilities renormalized over them (:attr:`DecodingState.vocabulary`): a vocabulary shortlist. A
        model offers it where its decoder has one (the fast runtime's, for the Transformer)."""
        from attnkit.errors import AttnkitError

        raise AttnkitError(f"a {self.family} model's decoder has no vocabulary shortlist")

    def search_steps(self) -> dict:
        """Search steps (:func:`attnkit.decode.search.greedy_step`, ``beam_step``) that this model runs in place of
        the plain ones, by name: none for a model; the fast runtime's decoders offer compiled ones."""
        return {}

    def greedy_search(self, state: DecodingState, max_lens: Tensor) -> list | None:
        """A whole greedy search (:func:`attnkit.decode.search.sample` at temperature 0, nothing streamed or
        watched) that this model runs in place of the step-by-step one, with the same hypotheses; None where it has
        none for this search: none for a model; the fast runtime's compiled decoders run one sentence's."""
        return None

    def beam_search(self, state: DecodingState, max_lens: Tensor, beam_size: int, len_penalty: float) -> list | None:
        """A whole beam search (:func:`attnkit.decode.search.beam_search`, nothing streamed or watched) that this
        model runs in place of the step-by-step one: each sentence's finished hypotheses, in the order that search
        finds them; None where it has none for this search (as :meth:`greedy_search`)."""
        return None

    def require(self, capability: str) -> None:
        """A one-line error unless this family can ``capability``."""
        if capability not in self.capabilities:
            from attnkit.errors import AttnkitError

            can = ", ".join(sorted(self.capabilities)) or "nothing"
            raise AttnkitError(f"a {self.family} model cannot {capability} (it can: {can})")


def mean_step_attention(weights: list[Tensor | None]) -> Tensor | None:
    """One decoding step's attention [N, S] from each layer's weights [N, H, 1, S]: the mean over heads and layers
    (None when the step was not asked for its weights)."""
    if not weights or weights[0] is None:
        return None
    total = weights[0][:, :, 0].mean(1)
    for w in weights[1:]:
        total = total + w[:, :, 0].mean(1)
    return total / len(weights)


def device_of(model: nn.Module) -> torch.device:
    """Where ``model`` keeps its weights (the CPU for models without parameters)."""
    first = next(model.parameters(), None) if isinstance(model, nn.Module) else None
    return torch.device("cpu") if first is None else first.device
