"""Image captioners over a CNN feature grid: Show, Attend and Tell (Xu et al. 2015) and a Transformer.

Both read ``features`` [B, L, D]: the L = h*w annotation vectors a_1..a_L of a CNN grid
(7x7x1280 from EfficientNet-Lite0's head), and both follow the model contract
(:mod:`attnkit.models.contract`), so attnkit.decode's beam search captions images unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.models.contract import AttentionMaps, GenerativeModel, ModelOutput, RecurrentState
from attnkit.models.transformer import EncoderDecoder, EncoderDecoderSizes, Memory, encoder_layers
from attnkit.nn import LearnedPositionalEmbedding, make_score
from attnkit.nn.loss import label_smoothed_nll
from attnkit.tokens import PAD


@dataclass
class TransformerCaptionerConfig(EncoderDecoderSizes):
    """Self-attention over an image grid of ``d_feature``-channel cells (each cell a learned position), then the
    Transformer decoder."""

    family: str = "transformer_captioner"
    n_encoder_layers: int = 2
    d_feature: int = 1280


@dataclass
class ShowAttendTellConfig(ModelConfig):
    """Show, Attend and Tell (Xu et al. 2015): an LSTM that attends to an image grid of ``d_feature``-channel cells."""

    family: str = "show_attend_tell"
    preset: str = ""
    hidden_size: int = 512  # the LSTM state and the word embeddings
    attention_size: int = 512  # the additive score's hidden layer
    d_feature: int = 1280
    attention_score: str = "additive"  # additive, general, dot, scaled_dot
    attention_penalty: float = 1.0  # lambda of the doubly stochastic regulariser (eq. 14)
    dropout: float = 0.5

    @property
    def width(self) -> int:
        return self.hidden_size


def grid_memory(features: Tensor) -> Memory:
    """features [B, L, D] -> Memory with no padding (every grid cell is real)."""
    return Memory(features, torch.zeros(features.shape[:2], dtype=torch.bool, device=features.device))


@dataclass
class LSTMState(RecurrentState):
    """The captioner's state: the image grid, its projection U a_i for the additive score (computed once per image,
    [B, L, d_attention]) and the LSTM's h and c [B, H]."""

    ROW_DIMS: ClassVar[dict[str, int]] = {"h": 0, "c": 0}

    memory: Memory
    projected: Tensor
    h: Tensor
    c: Tensor


class ShowAttendTell(GenerativeModel):
    """The soft-attention captioner. At each word t, with the previous LSTM state h_{t-1}:

    e_ti = f_att(a_i, h_{t-1})          additive (one tanh layer), or another attnkit.nn score
    alpha_t = softmax(e_t)              where to look
    z_t = beta_t * sum_i alpha_ti a_i   beta_t = sigmoid(f_beta(h_{t-1})), the gating scalar (section 4.2.1)
    h_t, c_t = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))
    p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))      the deep output layer (eq. 7)

    h_0 and c_0 come from the mean annotation vector through two MLPs (section 3.1.2). Training adds the
    doubly stochastic penalty (eq. 14) to the loss: ``lambda * sum_i (1 - sum_t alpha_ti)^2``.
    Sizes: word embedding and LSTM both ``hidden_size``; attention MLP ``attention_size``; features ``d_feature``.
    """

    capabilities = frozenset({"caption", "score", "attention"})

    def __init__(self, cfg: ShowAttendTellConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d, dz = cfg.hidden_size, cfg.d_feature
        self.embed = nn.Embedding(vocab_size, d, padding_idx=0)
        self.init_h = nn.Sequential(nn.Linear(dz, d), nn.Tanh())
        self.init_c = nn.Sequential(nn.Linear(dz, d), nn.Tanh())
        self.score = make_score(cfg.attention_score, d, dz, cfg.attention_size)
        self.f_beta = nn.Linear(d, 1)
        self.lstm = nn.LSTMCell(d + dz, d)
        self.L_h = nn.Linear(d, d)
        self.L_z = nn.Linear(dz, d)
        self.L_o = nn.Linear(d, vocab_size)
        self.dropout = nn.Dropout(cfg.dropout)

    def encode(self, features: Tensor) -> Memory:
        return grid_memory(features)

    def init_state(self, memory: Memory) -> LSTMState:
        mean = memory.states.mean(1)
        return LSTMState(memory, self.score.precompute(memory.states), self.init_h(mean), self.init_c(mean))

    def _attend(self, state: LSTMState) -> tuple[Tensor, Tensor]:
        """-> context z [B, D] (gated) and weights alpha [B, L]."""
        a = state.memory.states
        e = self.score(state.h[:, None], a, state.projected)[:, 0]
        alpha = torch.softmax(e, dim=-1)
        beta = torch.sigmoid(self.f_beta(state.h))
        return beta * (alpha[:, None] @ a)[:, 0], alpha

    def _step(self, tokens: Tensor, state: LSTMState) -> tuple[Tensor, LSTMState, Tensor]:
        """tokens [B] -> logits [B, V], new state, alpha [B, L]."""
        y = self.embed(tokens)
        z, alpha = self._attend(state)
        h, c = self.lstm(torch.cat([self.dropout(y), z], -1), (state.h, state.c))
        logits = self.L_o(self.dropout(y + self.L_h(self.dropout(h)) + self.L_z(z)))
        return logits, LSTMState(state.memory, state.projected, h, c), alpha

    def step(self, tokens: Tensor, state: LSTMState, need_weights: bool = False):
        logits, state, alpha = self._step(tokens, state)
        return F.log_softmax(logits.float(), -1), state, alpha if need_weights else None

    def teacher_forced(self, features: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """features [B, L, D], tgt_in [B, T] -> logits [B, T, V], alphas [B, T, L]."""
        state = self.init_state(self.encode(features))
        logits, alphas = [], []
        for t in range(tgt_in.size(1)):
            out, state, alpha = self._step(tgt_in[:, t], state)
            logits.append(out)
            alphas.append(alpha)
        return torch.stack(logits, 1), torch.stack(alphas, 1)

    def attention_penalty(self, alphas: Tensor, targets: Tensor) -> Tensor:
        """``lambda * sum_i (1 - sum_t alpha_ti)^2`` over the real words (Xu et al. eq. 14): every cell gets about
        one word's worth of attention. alphas [B, T, L], targets [B, T] -> a scalar."""
        coverage = (alphas * targets.ne(PAD).unsqueeze(-1)).sum(1)  # [B, L]
        return self.cfg.attention_penalty * ((1.0 - coverage) ** 2).sum()

    def forward(self, source: Tensor, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0,
                need_weights: bool = False) -> ModelOutput:
        """Teacher forcing: source (image grids) [B, L, D], tgt_in [B, T] -> logits [B, T, V]; with ``targets``
        the loss (label-smoothed NLL plus the attention penalty) and NLL, summed over the real words."""
        logits, alphas = self.teacher_forced(source, tgt_in)
        attention = AttentionMaps(cross=[alphas[:, None]]) if need_weights else None
        if targets is None:
            return ModelOutput(logits=logits, attention=attention)
        loss, nll = label_smoothed_nll(logits, targets, label_smoothing, PAD)
        if self.cfg.attention_penalty > 0:
            loss = loss + self.attention_penalty(alphas, targets)
        return ModelOutput(loss=loss, nll=nll, logits=logits, attention=attention)


class TransformerCaptioner(EncoderDecoder):
    """Self-attention over the image grid (the lectures' "self-attention module" on image features),
    feeding the Transformer decoder. The grid cells get a learned position each, like patches."""

    capabilities = frozenset({"caption", "score", "attention"})

    def __init__(self, cfg: TransformerCaptionerConfig, vocab_size: int, n_cells: int = 49):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.feature_proj = nn.Sequential(nn.Linear(cfg.d_feature, d), nn.LayerNorm(d))
        self.cell_positions = LearnedPositionalEmbedding(d, n_cells)
        self.feature_dropout = nn.Dropout(cfg.dropout)
        self.encoder = encoder_layers(cfg)
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.build_decoder(cfg, vocab_size)

    def encode(self, features: Tensor, need_weights: bool = False) -> Memory:
        """features [B, L, D] -> Memory over the self-attended grid; with ``need_weights`` it carries each
        layer's self-attention [B, H, L, L]."""
        x = self.feature_proj(features) + self.cell_positions(features.size(1))
        x = self.feature_dropout(x)
        all_weights = []
        for layer in self.encoder:
            out = layer(x, None, need_weights)
            x = out.x
            all_weights.append(out.self_weights)
        memory = grid_memory(self.encoder_norm(x))
        return replace(memory, weights=all_weights) if need_weights else memory


def build_show_attend_tell(cfg: ShowAttendTellConfig, _: int, vocab_size: int) -> ShowAttendTell:
    """Show, Attend and Tell attends over any number of grid cells: the count is not part of the model."""
    return ShowAttendTell(cfg, vocab_size)


def build_transformer_captioner(cfg: TransformerCaptionerConfig, n_cells: int, vocab_size: int) -> TransformerCaptioner:
    """Each of the ``n_cells`` grid cells has a learned position."""
    return TransformerCaptioner(cfg, vocab_size, n_cells=n_cells)
