"""A decoder-only Transformer language model (GPT: Radford et al. 2018, 2019) following the model contract.

It is the Transformer's decoder without cross-attention: a stack of causal self-attention
layers (attnkit.nn's EncoderLayer with ``causal=True``), pre-LN by default with a final
LayerNorm, and the output projection tied to the token embedding. With ``adaptive_softmax`` cutoffs the
output is an adaptive softmax instead (Grave et al. 2017): a large word vocabulary costs most of a small
model's compute in its full softmax, and the adaptive one spends full width only on the frequent words.
Tied, its input is then adaptive too (Baevski & Auli 2019, attnkit.nn.AdaptiveInput).

An LM reads no source. Its "memory" only says how many sequences to generate; a prompt is
fed through the cache token by token, as the forced prefix of ``attnkit.decode.sample``.
Every sequence starts with BOS (training puts BOS before each block too), so position 0
always holds the same token and the model can be asked to start from nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.contract import AttentionMaps, DecodingState, GenerativeModel, ModelOutput, mean_step_attention
from attnkit.nn import AdaptiveInput, EncoderLayer, KVCache, TokenEmbedding, make_positional
from attnkit.nn.blocks import init_feed_forward
from attnkit.nn.loss import projected_label_smoothed_nll
from attnkit.tokens import PAD


@dataclass
class LMConfig(ModelConfig):
    """A decoder-only Transformer language model (GPT); ``preset`` "lm_tiny" .. "gpt2_small"."""

    family: str = "transformer_lm"
    preset: str = ""
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_layers: int = 4
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "gelu"
    norm_first: bool = True  # pre-LN, as GPT-2
    layer_norm_eps: float = 1e-5
    positional: str = "learned"
    max_positions: int = 1024
    share_embeddings: bool = True  # input embedding and output layer tied (Press & Wolf 2017), as GPT-2
    # cutoffs of an adaptive softmax (Grave et al. 2017), e.g. [2000, 10000]: the frequent words get a full-width
    # softmax, rarer ones narrower clusters. Empty: one softmax over the whole vocabulary. With share_embeddings
    # the input embedding is adaptive too and shares the softmax's weights.
    adaptive_softmax: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        return self.d_model


@dataclass
class NoMemory:
    """A language model's memory: nothing but the batch size."""

    batch: int

    def select(self, indices: Tensor) -> NoMemory:
        return NoMemory(len(indices))


@dataclass
class LMState(DecodingState):
    """Per-layer self-attention caches [B, H, t, d_head] and the position of the next token."""

    caches: list[KVCache]
    offset: int = 0

    @property
    def rows(self) -> int:
        return self.caches[0].keys.size(0)

    @property
    def device(self) -> torch.device:
        return self.caches[0].keys.device

    def select(self, indices: Tensor, same_source: bool = False) -> LMState:
        return LMState([c.select(indices) for c in self.caches], self.offset)


class TransformerLM(GenerativeModel):
    capabilities = frozenset({"generate", "score", "attention"})
    projected_loss = staticmethod(projected_label_smoothed_nll)  # the fast runtime installs a fused one

    def __init__(self, cfg: LMConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        output, tokens = self._output_layer(cfg, vocab_size)
        self.embed = TokenEmbedding(vocab_size, d, make_positional(cfg.positional, d, cfg.max_positions),
                                    cfg.dropout, PAD, tokens)
        self.layers = nn.ModuleList(
            EncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout, cfg.activation_dropout,
                         cfg.activation, cfg.norm_first, cfg.layer_norm_eps)
            for _ in range(cfg.n_layers))
        # pre-LN leaves the residual stream unnormalised; post-LN already ends in a norm
        self.norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
        self.output = output
        if cfg.share_embeddings and not cfg.adaptive_softmax:
            self.output.weight = self.embed.tokens.weight  # tied (Press & Wolf 2017), as GPT-2
        init_feed_forward(self.layers)

    @staticmethod
    def _output_layer(cfg: LMConfig, vocab_size: int) -> tuple[nn.Module, nn.Module | None]:
        """The output layer, and the input lookup tied to it when that is not a plain embedding."""
        if not cfg.adaptive_softmax:
            return nn.Linear(cfg.d_model, vocab_size, bias=False), None
        if cfg.adaptive_softmax[-1] >= vocab_size:
            raise AttnkitError(f"model.adaptive_softmax = {list(cfg.adaptive_softmax)}: the last cutoff must "
                               f"be below the vocabulary size {vocab_size}")
        # ids are most frequent first (attnkit.data.WordVocab), as the clusters require
        output = nn.AdaptiveLogSoftmaxWithLoss(cfg.d_model, vocab_size, list(cfg.adaptive_softmax), div_value=4.0)
        return output, (AdaptiveInput(output, PAD) if cfg.share_embeddings else None)

    def forward(self, source: Tensor | None, tgt_in: Tensor, targets: Tensor | None = None,
                label_smoothing: float = 0.0, need_weights: bool = False) -> ModelOutput:
        """Teacher forcing: tgt_in [B, T] (BOS + tokens) -> logits [B, T, V]; ``source`` is ignored.

        With an adaptive softmax the "logits" are log-probabilities (a softmax of them is themselves).
        With ``need_weights`` also each layer's self-attention weights [B, H, T, T] (``attention.decoder``).
        With ``targets`` [B, T] the loss and NLL summed over the non-pad targets, as the Transformer does; or the
        adaptive softmax's own path (no smoothing), which never scores the whole vocabulary.
        """
        hidden, all_weights = self.hidden_states(tgt_in, need_weights)
        attention = AttentionMaps(decoder=all_weights) if need_weights else None
        if targets is None:
            return ModelOutput(logits=self.output_logits(hidden), attention=attention)
        if isinstance(self.output, nn.AdaptiveLogSoftmaxWithLoss):
            keep = targets.ne(PAD)
            nll = -self.target_log_probs(hidden[keep], targets[keep]).sum()
            return ModelOutput(loss=nll, nll=nll.detach(), attention=attention)
        loss, nll = self.projected_loss(hidden, self.output.weight, targets, label_smoothing, PAD)
        return ModelOutput(loss=loss, nll=nll, attention=attention)

    def hidden_states(self, tgt_in: Tensor, need_weights: bool = False, padding_mask: Tensor | None = None
                      ) -> tuple[Tensor, list]:
        """tgt_in [B, T] -> the states the output layer reads [B, T, d_model], and each layer's self-attention
        weights [B, H, T, T] (None each without ``need_weights``).

        ``padding_mask`` [B, T] (True = pad; None = none) hides those keys besides the later ones. Padding on the
        right is hidden from every real position by the causal mask already; the mask matters for a position
        hidden inside a row (a fine-tuned classifier's occlusion)."""
        x = self.embed(tgt_in)
        all_weights = []
        for layer in self.layers:
            out = layer(x, padding_mask, need_weights=need_weights, causal=True)
            x = out.x
            all_weights.append(out.self_weights)
        return self.norm(x), all_weights

    def target_log_probs(self, hidden: Tensor, targets: Tensor) -> Tensor:
        """hidden [N, d_model], targets [N] -> log p(targets) [N]; an adaptive softmax scores only the
        targets' own clusters, never the whole vocabulary."""
        if isinstance(self.output, nn.AdaptiveLogSoftmaxWithLoss):
            return self.output(hidden, targets).output
        return F.log_softmax(self.output(hidden).float(), -1).gather(-1, targets[:, None])[:, 0]

    def output_logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., d_model] -> logits [..., V] (log-probabilities with an adaptive softmax)."""
        if isinstance(self.output, nn.AdaptiveLogSoftmaxWithLoss):
            return self.output.log_prob(hidden.flatten(0, -2)).view(*hidden.shape[:-1], -1)
        return self.output(hidden)

    # --- decoding

    def encode(self, src: Tensor) -> NoMemory:
        """src [B, ...]: only its batch size matters."""
        return NoMemory(src.size(0))

    def init_state(self, memory: NoMemory) -> LMState:
        h, d_head = self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        weight = next(self.parameters())  # the model's dtype and device
        empty = weight.new_zeros(memory.batch, h, 0, d_head)
        return LMState([KVCache(empty, empty) for _ in self.layers])

    def step(self, tokens: Tensor, state: LMState, need_weights: bool = False):
        """tokens [B] (the previous outputs) -> (log_probs [B, V], new state, attention).

        ``attention`` is the self-attention of this step over all tokens so far [B, t + 1],
        averaged over heads and layers, or None.
        """
        x = self.embed(tokens[:, None], offset=state.offset)
        caches, weights = [], []
        for layer, cache in zip(self.layers, state.caches):
            out = layer(x, need_weights=need_weights, causal=True, cache=cache)
            x = out.x
            caches.append(out.cache)
            weights.append(out.self_weights)
        attn = mean_step_attention(weights)
        logits = self.output_logits(self.norm(x[:, 0]))
        return F.log_softmax(logits.float(), dim=-1), LMState(caches, state.offset + 1), attn


def build_language_model(cfg: LMConfig, _: int, vocab_size: int) -> TransformerLM:
    """A language model reads no source: its source size is ignored."""
    return TransformerLM(cfg, vocab_size)
