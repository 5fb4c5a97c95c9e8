"""A convolutional sequence encoder (Gehring et al. 2017, "Convolutional Sequence to Sequence Learning").

Each block is a 1D convolution of kernel k to 2d channels, half of them gating the other half
(the gated linear unit of Dauphin et al. 2017), added to the block's input and scaled so the
variance stays put::

    x <- (x + GLU(conv_k(x))) * sqrt(0.5)

A stack of L centred blocks sees L (k - 1) / 2 positions to each side. ``ConvTransformer`` puts
this encoder in front of the Transformer decoder: family "conv_transformer".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.models.transformer import EncoderDecoder, Memory, TransformerConfig
from attnkit.nn import TokenEmbedding, make_positional
from attnkit.tokens import PAD


@dataclass
class ConvTransformerConfig(TransformerConfig):
    """A convolutional encoder (``n_encoder_layers`` gated convolution blocks of kernel width ``conv_kernel``)
    in place of the Transformer's self-attention encoder; the decoder is the Transformer's."""

    family: str = "conv_transformer"
    conv_kernel: int = 3  # odd: the convolutions are centred


class GatedConv(nn.Module):
    """One block: x [B, S, d] -> [B, S, d].

    Centred by default (k odd: position i sees i - (k-1)/2 .. i + (k-1)/2, an encoder's view);
    ``causal`` pads on the left only (i sees i - (k-1) .. i, a decoder's); ``dilation`` spaces the
    taps (WaveNet) — both for ``attnkit bench complexity``'s path lengths.
    """

    def __init__(self, d: int, kernel_size: int, dropout: float = 0.0, causal: bool = False, dilation: int = 1):
        super().__init__()
        if not causal and kernel_size % 2 == 0:
            raise ValueError(f"a centred convolution needs an odd kernel size, got {kernel_size}")
        self.conv = nn.Conv1d(d, 2 * d, kernel_size, dilation=dilation)
        # Gehring et al. section 3.5: keep the variance of activations through a GLU after dropout
        nn.init.normal_(self.conv.weight, std=math.sqrt(4 * (1 - dropout) / (kernel_size * d)))
        nn.init.zeros_(self.conv.bias)
        reach = dilation * (kernel_size - 1)
        self.padding = (reach, 0) if causal else (reach // 2, reach // 2)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """padding_mask [B, S] (True = pad): those positions are zeroed before the convolution, so they
        read exactly like the zero padding beyond the sentence's end and never leak into real ones."""
        if padding_mask is not None:
            x = x.masked_fill(padding_mask[..., None], 0.0)
        h = F.pad(self.dropout(x).transpose(1, 2), self.padding)  # [B, d, S + reach]
        h = F.glu(self.conv(h), dim=1).transpose(1, 2)
        return (x + h) * math.sqrt(0.5)


class ConvEncoder(nn.Module):
    """``n_layers`` centred gated convolution blocks of width d and kernel k."""

    def __init__(self, d: int, n_layers: int, kernel_size: int, dropout: float = 0.0):
        super().__init__()
        self.blocks = nn.ModuleList(GatedConv(d, kernel_size, dropout) for _ in range(n_layers))

    def forward(self, x: Tensor, padding_mask: Tensor) -> Tensor:
        """x [B, S, d], padding_mask [B, S] -> [B, S, d], zero at padding."""
        for block in self.blocks:
            x = block(x, padding_mask)
        return x.masked_fill(padding_mask[..., None], 0.0)


class ConvTransformer(EncoderDecoder):
    """The convolutional encoder (``n_encoder_layers`` blocks of kernel ``conv_kernel``, width ``d_model``)
    in place of the self-attention encoder; the Transformer's embeddings (with positions, which a
    convolution needs to know where it is in the sentence) and decoder are unchanged."""

    capabilities = frozenset({"translate", "score", "attention", "align"})

    def __init__(self, cfg: ConvTransformerConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = TokenEmbedding(src_vocab_size, d, make_positional(cfg.positional, d, cfg.max_positions),
                                        cfg.dropout, PAD)
        self.encoder = ConvEncoder(d, cfg.n_encoder_layers, cfg.conv_kernel, cfg.dropout)
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.build_decoder(cfg, tgt_vocab_size)
        if cfg.share_embeddings:
            self.tie_source_embedding(src_vocab_size, tgt_vocab_size)

    def encode(self, src: Tensor, need_weights: bool = False) -> Memory:
        """src [B, S] -> Memory [B, S, d_model] (its ``weights`` empty whatever ``need_weights``: convolutions
        have no attention)."""
        padding_mask = src.eq(PAD)
        return Memory(self.encoder_norm(self.encoder(self.src_embed(src), padding_mask)), padding_mask)
