"""The Transformer encoder-decoder (Vaswani et al. 2017) behind the common decoding interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.nn import DecoderLayer, EncoderLayer, KVCache, TokenEmbedding, make_positional
from attnkit.nn.loss import projected_smoothed_cross_entropy

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # fixed ids, shared with attnkit.data.tokenizer



@dataclass
class Memory:
    """What the encoder hands the decoder: states [B, S, d_model] and the source padding mask [B, S]."""

    states: Tensor
    padding_mask: Tensor

    def select(self, indices: Tensor) -> Memory:
        return Memory(self.states.index_select(0, indices), self.padding_mask.index_select(0, indices))


@dataclass
class DecoderState:
    """Everything one decoding step needs: per-layer self-attention caches and cross-attention keys/values.

    With ``beams`` > 1 (beam search) the caches hold ``beams`` consecutive rows per source sentence, and the
    memory and cross-attention keys/values one row per sentence, shared by its beams.
    """

    memory: Memory
    static_kv: list[KVCache]
    caches: list[KVCache]
    offset: int = 0
    beams: int = 1

    def select(self, indices: Tensor, same_source: bool = False) -> DecoderState:
        """Reorder, repeat or drop rows, e.g. by beam origin. ``same_source``: every row keeps its source
        sentence (beams reordered among themselves), so the memory and cross-attention keys/values stay.
        With ``beams`` > 1 the rows must stay in blocks of one sentence's beams, as beam search keeps them."""
        caches = [c.reorder(indices) for c in self.caches]  # gathered by the next step, as it appends
        if same_source:
            return DecoderState(self.memory, self.static_kv, caches, self.offset, self.beams)
        sources = indices if self.beams == 1 else indices[:: self.beams] // self.beams
        return DecoderState(self.memory.select(sources), [kv.select(sources) for kv in self.static_kv], caches,
                            self.offset, self.beams)

    def tensors(self) -> list[Tensor]:
        """The state as flat tensors (for ``torch.export``, :mod:`attnkit.decode.aot`): the memory's states and
        padding mask, each layer's cross-attention keys and values, each layer's cache keys and values, and the
        caches' pending row order [rows] (one for all layers, which are reordered together; every row in place if
        none: one graph serves both)."""
        order = self.caches[0].order
        if order is None:
            order = torch.arange(self.caches[0].rows, device=self.caches[0].keys.device)
        return [self.memory.states, self.memory.padding_mask,
                *(x for kv in self.static_kv for x in (kv.keys, kv.values)),
                *(x for c in self.caches for x in (c.keys, c.values)), order]

    @classmethod
    def from_tensors(cls, tensors: list[Tensor], beams: int) -> DecoderState:
        """The state :meth:`tensors` listed. Its offset is the caches' length: exported, a size, not a constant."""
        layers = (len(tensors) - 3) // 4
        static, caches, order = tensors[2:2 + 2 * layers], tensors[2 + 2 * layers:-1], tensors[-1]
        return cls(Memory(tensors[0], tensors[1]), [KVCache(*static[i:i + 2]) for i in range(0, 2 * layers, 2)],
                   [KVCache(*caches[i:i + 2], order) for i in range(0, 2 * layers, 2)], caches[0].size(2), beams)

    def repeat_beams(self, k: int) -> DecoderState:
        """Every row becomes ``k`` rows, its beams; the source side stays one row per sentence."""
        if self.beams != 1:
            raise ValueError("the state already holds beams")
        rows = torch.arange(self.memory.states.size(0), device=self.memory.states.device).repeat_interleave(k)
        return DecoderState(self.memory, self.static_kv, [c.reorder(rows) for c in self.caches], self.offset, k)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        layer_args = (d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout, cfg.activation_dropout,
                      cfg.activation, cfg.norm_first)
        self.src_embed = TokenEmbedding(src_vocab_size, d, make_positional(cfg.positional, d, cfg.max_positions),
                                        cfg.dropout, PAD)
        self.tgt_embed = TokenEmbedding(tgt_vocab_size, d, make_positional(cfg.positional, d, cfg.max_positions),
                                        cfg.dropout, PAD)
        if cfg.share_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_embeddings needs a joint vocabulary (equal source and target sizes)")
            self.tgt_embed.tokens.weight = self.src_embed.tokens.weight
        self.encoder = nn.ModuleList(EncoderLayer(*layer_args) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*layer_args) for _ in range(cfg.n_decoder_layers))
        # pre-LN leaves the last residual stream unnormalised; the paper's post-LN already ends in a norm
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.output = nn.Linear(d, tgt_vocab_size, bias=False)
        self.output.weight = self.tgt_embed.tokens.weight  # tied as in section 3.4
        for layer in [*self.encoder, *self.decoder]:
            for lin in (layer.ffn.linear1, layer.ffn.linear2):
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)

    # --- encoder

    def encode(self, src: Tensor, need_weights: bool = False) -> Memory | tuple[Memory, list[Tensor]]:
        """src [B, S] token ids (PAD-padded) -> Memory.

        With ``need_weights`` also returns each layer's self-attention weights [B, H, S, S].
        """
        padding_mask = src.eq(PAD)
        x = self.src_embed(src)
        all_weights = []
        for layer in self.encoder:
            x, w = layer(x, padding_mask, need_weights)
            all_weights.append(w)
        memory = Memory(self.encoder_norm(x), padding_mask)
        return (memory, all_weights) if need_weights else memory

    # --- teacher-forced decoder

    def decode_all(self, tgt_in: Tensor, memory: Memory, need_weights: bool = False, logits: bool = True):
        """tgt_in [B, T] (BOS + target[:-1]) -> logits [B, T, V] (or, without ``logits``, the decoder's output
        states [B, T, d_model] that the output projection takes) and per-layer cross-attention weights."""
        x = self.tgt_embed(tgt_in)
        all_weights = []
        for layer in self.decoder:
            x, w, _ = layer(x, memory.states, memory.padding_mask, need_weights=need_weights)
            all_weights.append(w)
        x = self.decoder_norm(x)
        return (self.output(x) if logits else x), all_weights

    def forward(self, src: Tensor, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0):
        """Teacher forcing: src [B, S], tgt_in [B, T] -> logits [B, T, V].

        With ``targets`` [B, T] returns instead (label-smoothed loss, NLL), each summed over the non-pad targets:
        the training loss, with logits made only for those positions and fused with the loss
        (:func:`~attnkit.nn.loss.projected_smoothed_cross_entropy`).
        """
        memory = self.encode(src)
        if targets is None:
            return self.decode_all(tgt_in, memory)[0]
        states = self.decode_all(tgt_in, memory, logits=False)[0]
        return projected_smoothed_cross_entropy(states, self.output.weight, targets, label_smoothing, PAD)

    # --- the common decoding interface (attnkit.decode)

    def init_state(self, memory: Memory) -> DecoderState:
        static_kv = [layer.cross_attn.project_memory(memory.states) for layer in self.decoder]
        b, h, _, d_head = static_kv[0].keys.shape
        # empty, not None: every step then has the same kind of input. Separate tensors, as after a reordering:
        # a compiled step guards on which inputs are the same tensor, and would compile once more
        empty = static_kv[0].keys.new_zeros
        caches = [KVCache(empty(b, h, 0, d_head), empty(b, h, 0, d_head)) for _ in self.decoder]
        return DecoderState(memory, static_kv, caches)

    def step(self, tokens: Tensor, state: DecoderState, need_weights: bool = False):
        """tokens [B] (the previous outputs) -> (log_probs [B, V], new state, attention).

        ``attention`` is the cross-attention [B, S] averaged over heads and layers, or None.
        """
        x = self.tgt_embed(tokens[:, None], offset=state.offset)
        caches, attn = [], None
        for layer, kv, cache in zip(self.decoder, state.static_kv, state.caches):
            x, w, cache = layer(x, None, state.memory.padding_mask, cache=cache,
                                static_kv=kv, need_weights=need_weights, beams=state.beams)
            caches.append(cache)
            if w is not None:
                attn = w[:, :, 0].mean(1) if attn is None else attn + w[:, :, 0].mean(1)
        if attn is not None:
            attn = attn / len(self.decoder)
        logits = self.output(self.decoder_norm(x[:, 0]))
        return F.log_softmax(logits.float(), dim=-1), DecoderState(state.memory, state.static_kv, caches,
                                                                    state.offset + 1, state.beams), attn
