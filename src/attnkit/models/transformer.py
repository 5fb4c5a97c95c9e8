"""The Transformer encoder-decoder (Vaswani et al. 2017).

:class:`EncoderDecoder` is the decoder side that every Transformer-decoded family shares (target embedding,
masked self-attention + cross-attention layers, tied output layer, decoding steps); each family adds the
encoder it reads its source with: :class:`Transformer` self-attention over token embeddings,
:class:`~attnkit.models.conv.ConvTransformer` convolutions, :class:`~attnkit.models.captioner.TransformerCaptioner`
self-attention over an image grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.models.contract import AttentionMaps, DecodingState, GenerativeModel, ModelOutput, mean_step_attention
from attnkit.nn import DecoderLayer, EncoderLayer, KVCache, TokenEmbedding, make_positional
from attnkit.nn.blocks import init_feed_forward
from attnkit.nn.loss import projected_label_smoothed_nll
from attnkit.tokens import PAD


@dataclass
class EncoderDecoderSizes(ModelConfig):
    """The sizes every Transformer-decoded family shares (the encoder is each family's own)."""

    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024  # the position-wise feed-forward layer's inner width
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0  # inside the FFN; off in the paper, and costly on a CPU (the d_ff-wide tensor)
    activation: str = "relu"
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN
    positional: str = "sinusoidal"  # or "learned" (of the target words; and of the source words where it has them)
    max_positions: int = 1024

    @property
    def width(self) -> int:
        """The model width the "noam" learning-rate schedule scales by."""
        return self.d_model


@dataclass
class TransformerConfig(EncoderDecoderSizes):
    """The Transformer encoder-decoder (Vaswani et al. 2017); ``preset`` "base", "big" (the paper), "small", "tiny"."""

    family: str = "transformer"
    share_embeddings: bool = True  # source/target embeddings and output layer tied (needs a joint vocabulary)


@dataclass
class Memory:
    """What an encoder hands the decoder: states [B, S, d_model] and the source padding mask [B, S] (True = pad);
    ``weights``: each encoder layer's self-attention [B, H, S, S] when the encoder was asked for them (else
    empty)."""

    states: Tensor
    padding_mask: Tensor
    weights: list[Tensor] = field(default_factory=list)

    def select(self, indices: Tensor) -> Memory:
        return Memory(self.states.index_select(0, indices), self.padding_mask.index_select(0, indices),
                      [w.index_select(0, indices) for w in self.weights])


@dataclass
class DecoderState(DecodingState):
    """Everything one decoding step needs: the memory, each layer's cross-attention keys and values of it
    (projected once per sentence), each layer's self-attention cache, and the position of the next token."""

    memory: Memory
    memory_kv: list[KVCache]
    caches: list[KVCache]
    offset: int = 0

    @property
    def rows(self) -> int:
        return self.caches[0].keys.size(0)

    @property
    def device(self) -> torch.device:
        return self.memory.states.device

    def select(self, indices: Tensor, same_source: bool = False) -> DecoderState:
        caches = [c.select(indices) for c in self.caches]
        if same_source:
            return DecoderState(self.memory, self.memory_kv, caches, self.offset)
        return DecoderState(self.memory.select(indices), [kv.select(indices) for kv in self.memory_kv], caches,
                            self.offset)


def encoder_layers(cfg: EncoderDecoderSizes) -> nn.ModuleList:
    """``n_encoder_layers`` self-attention + FFN layers of ``cfg``'s sizes, initialised as the paper's."""
    layers = nn.ModuleList(
        EncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout, cfg.activation_dropout,
                     cfg.activation, cfg.norm_first) for _ in range(cfg.n_encoder_layers))
    init_feed_forward(layers)
    return layers


class EncoderDecoder(GenerativeModel):
    """The Transformer's decoder side: target embedding, decoder layers, (pre-LN) final norm and the output
    layer tied to the target embedding (section 3.4). Subclasses build an encoder and implement
    :meth:`encode` (``need_weights``: also each encoder layer's self-attention weights)."""

    capabilities = frozenset({"score", "attention"})
    projected_loss = staticmethod(projected_label_smoothed_nll)  # the fast runtime installs a fused one

    def build_decoder(self, cfg: EncoderDecoderSizes, tgt_vocab_size: int) -> None:
        d = cfg.d_model
        self.tgt_embed = TokenEmbedding(tgt_vocab_size, d, make_positional(cfg.positional, d, cfg.max_positions),
                                        cfg.dropout, PAD)
        self.decoder = nn.ModuleList(
            DecoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout, cfg.activation_dropout,
                         cfg.activation, cfg.norm_first) for _ in range(cfg.n_decoder_layers))
        # pre-LN leaves the last residual stream unnormalised; the paper's post-LN already ends in a norm
        self.decoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.output = nn.Linear(d, tgt_vocab_size, bias=False)
        self.output.weight = self.tgt_embed.tokens.weight  # tied as in section 3.4
        init_feed_forward(self.decoder)

    def tie_source_embedding(self, src_vocab_size: int, tgt_vocab_size: int) -> None:
        """``share_embeddings``: one matrix for the source and target embeddings and the output layer."""
        if src_vocab_size != tgt_vocab_size:
            raise ValueError("share_embeddings needs a joint vocabulary (equal source and target sizes)")
        self.tgt_embed.tokens.weight = self.src_embed.tokens.weight
        self.output.weight = self.src_embed.tokens.weight

    def decode_all(self, tgt_in: Tensor, memory: Memory, need_weights: bool = False):
        """Teacher forcing: tgt_in [B, T] (BOS + target[:-1]) -> (the decoder's output states [B, T, d_model],
        per-layer self-attention weights [B, H, T, T], per-layer cross-attention weights [B, H, T, S]; weights
        None unless ``need_weights``)."""
        x = self.tgt_embed(tgt_in)
        self_weights, cross_weights = [], []
        for layer in self.decoder:
            out = layer(x, memory.states, memory.padding_mask, need_weights=need_weights)
            x = out.x
            self_weights.append(out.self_weights)
            cross_weights.append(out.cross_weights)
        return self.decoder_norm(x), self_weights, cross_weights

    def forward(self, source: Tensor, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0,
                need_weights: bool = False) -> ModelOutput:
        """Teacher forcing: source [B, S] (or an image grid), tgt_in [B, T].

        With ``targets`` [B, T] the loss and NLL are summed over the non-pad targets and the logits are not kept
        (the loss may make them only where the target is real); without, the logits [B, T, V].
        """
        return self.decoder_forward(self.encode(source, need_weights), tgt_in, targets, label_smoothing, need_weights)

    def decoder_forward(self, memory: Memory, tgt_in: Tensor, targets: Tensor | None = None,
                        label_smoothing: float = 0.0, need_weights: bool = False) -> ModelOutput:
        """The decoder's half of :meth:`forward`, over an encoded ``memory``."""
        hidden, self_weights, cross_weights = self.decode_all(tgt_in, memory, need_weights)
        attention = AttentionMaps(memory.weights, self_weights, cross_weights) if need_weights else None
        if targets is None:
            return ModelOutput(logits=self.output(hidden), attention=attention)
        loss, nll = self.projected_loss(hidden, self.output.weight, targets, label_smoothing, PAD)
        return ModelOutput(loss=loss, nll=nll, attention=attention)

    # --- decoding

    def init_state(self, memory: Memory) -> DecoderState:
        memory_kv = [layer.cross_attn.project_memory(memory.states) for layer in self.decoder]
        b, h, _, d_head = memory_kv[0].keys.shape
        empty = memory_kv[0].keys.new_zeros
        caches = [KVCache(empty(b, h, 0, d_head), empty(b, h, 0, d_head)) for _ in self.decoder]
        return DecoderState(memory, memory_kv, caches)

    def step(self, tokens: Tensor, state: DecoderState, need_weights: bool = False):
        """tokens [B] (the previous outputs) -> (log_probs [B, V], new state, attention).

        ``attention`` is the cross-attention [B, S] averaged over heads and layers, or None.
        """
        x = self.tgt_embed(tokens[:, None], offset=state.offset)
        caches, weights = [], []
        for layer, kv, cache in zip(self.decoder, state.memory_kv, state.caches):
            out = layer(x, None, state.memory.padding_mask, cache=cache, memory_kv=kv, need_weights=need_weights)
            x = out.x
            caches.append(out.cache)
            weights.append(out.cross_weights)
        attn = mean_step_attention(weights)
        logits = self.output(self.decoder_norm(x[:, 0]))
        return F.log_softmax(logits.float(), dim=-1), DecoderState(state.memory, state.memory_kv, caches,
                                                                    state.offset + 1), attn


class Transformer(EncoderDecoder):
    """Self-attention encoder over token embeddings (with positions), then the decoder."""

    capabilities = frozenset({"translate", "score", "attention", "align"})

    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = TokenEmbedding(src_vocab_size, d, make_positional(cfg.positional, d, cfg.max_positions),
                                        cfg.dropout, PAD)
        self.encoder = encoder_layers(cfg)
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.build_decoder(cfg, tgt_vocab_size)
        if cfg.share_embeddings:
            self.tie_source_embedding(src_vocab_size, tgt_vocab_size)

    def encode(self, src: Tensor, need_weights: bool = False) -> Memory:
        """src [B, S] token ids (PAD-padded) -> Memory; with ``need_weights`` it carries each layer's
        self-attention weights [B, H, S, S]."""
        padding_mask = src.eq(PAD)
        x = self.src_embed(src)
        all_weights = []
        for layer in self.encoder:
            out = layer(x, padding_mask, need_weights)
            x = out.x
            all_weights.append(out.self_weights)
        return Memory(self.encoder_norm(x), padding_mask, all_weights if need_weights else [])
