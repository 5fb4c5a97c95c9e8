"""Image captioners over a CNN feature grid: Show, Attend and Tell (Xu et al. 2015) and a Transformer.

Both read ``features`` [B, L, D]: the L = h*w annotation vectors a_1..a_L of a CNN grid
(7x7x1280 from EfficientNet-Lite0's head), and both speak the common decoding interface
(encode, init_state, step), so attnkit.decode's beam search captions images unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.models.transformer import Memory, Transformer
from attnkit.nn import Dropout, LearnedPositionalEmbedding, make_score


def grid_memory(features: Tensor) -> Memory:
    """features [B, L, D] -> Memory with no padding (every grid cell is real)."""
    return Memory(features, torch.zeros(features.shape[:2], dtype=torch.bool, device=features.device))


@dataclass
class LSTMState:
    memory: Memory
    projected: Tensor  # U a_i of the additive score, computed once per image [B, L, d_attention]
    h: Tensor  # [B, H]
    c: Tensor  # [B, H]

    def select(self, indices: Tensor, same_source: bool = False) -> LSTMState:
        """Reorder the batch; ``same_source``: rows keep their image, so the grid and its projection stay."""
        h, c = self.h.index_select(0, indices), self.c.index_select(0, indices)
        if same_source:
            return LSTMState(self.memory, self.projected, h, c)
        return LSTMState(self.memory.select(indices), self.projected.index_select(0, indices), h, c)

    def repeat_beams(self, k: int) -> LSTMState:
        """Every row becomes ``k`` consecutive rows (its beams)."""
        return self.select(torch.arange(self.h.size(0)).repeat_interleave(k))


class ShowAttendTell(nn.Module):
    """The soft-attention captioner. At each word t, with the previous LSTM state h_{t-1}:

    e_ti = f_att(a_i, h_{t-1})          additive (one tanh layer), or another attnkit.nn score
    alpha_t = softmax(e_t)              where to look
    z_t = beta_t * sum_i alpha_ti a_i   beta_t = sigmoid(f_beta(h_{t-1})), the gating scalar (section 4.2.1)
    h_t, c_t = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))
    p(y_t) = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))      the deep output layer (eq. 7)

    h_0 and c_0 come from the mean annotation vector through two MLPs (section 3.1.2).
    Sizes: word embedding and LSTM both ``d_model``; attention MLP ``d_ff``; features ``d_feature``.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d, dz = cfg.d_model, cfg.d_feature
        self.embed = nn.Embedding(vocab_size, d, padding_idx=0)
        self.init_h = nn.Sequential(nn.Linear(dz, d), nn.Tanh())
        self.init_c = nn.Sequential(nn.Linear(dz, d), nn.Tanh())
        self.score = make_score(cfg.attention_score, d, dz, cfg.d_ff)
        self.f_beta = nn.Linear(d, 1)
        self.lstm = nn.LSTMCell(d + dz, d)
        self.L_h = nn.Linear(d, d)
        self.L_z = nn.Linear(dz, d)
        self.L_o = nn.Linear(d, vocab_size)
        self.dropout = Dropout(cfg.dropout)

    def encode(self, features: Tensor) -> Memory:
        return grid_memory(features)

    def init_state(self, memory: Memory) -> LSTMState:
        mean = memory.states.mean(1)
        projected = self.score.precompute(memory.states) if hasattr(self.score, "precompute") else memory.states
        return LSTMState(memory, projected, self.init_h(mean), self.init_c(mean))

    def _attend(self, state: LSTMState) -> tuple[Tensor, Tensor]:
        """-> context z [B, D] (gated) and weights alpha [B, L]."""
        a = state.memory.states
        if hasattr(self.score, "precompute"):
            e = self.score(state.h[:, None], a, state.projected)[:, 0]
        else:
            e = self.score(state.h[:, None], a)[:, 0]
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

    def forward(self, features: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing: features [B, L, D], tgt_in [B, T] -> logits [B, T, V], alphas [B, T, L]."""
        state = self.init_state(self.encode(features))
        logits, alphas = [], []
        for t in range(tgt_in.size(1)):
            out, state, alpha = self._step(tgt_in[:, t], state)
            logits.append(out)
            alphas.append(alpha)
        return torch.stack(logits, 1), torch.stack(alphas, 1)


class TransformerCaptioner(Transformer):
    """Self-attention over the image grid (the lectures' "self-attention module" on image features),
    feeding the Transformer decoder. The grid cells get a learned position each, like patches."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, n_cells: int = 49):
        super().__init__(cfg, 1, vocab_size)  # the token source embedding is unused
        del self.src_embed
        self.feature_proj = nn.Sequential(nn.Linear(cfg.d_feature, cfg.d_model), nn.LayerNorm(cfg.d_model))
        self.cell_positions = LearnedPositionalEmbedding(cfg.d_model, n_cells)
        self.feature_dropout = Dropout(cfg.dropout)

    def encode(self, features: Tensor, need_weights: bool = False):
        """features [B, L, D] -> Memory over the self-attended grid (and each layer's weights)."""
        x = self.feature_proj(features) + self.cell_positions(features.size(1))
        x = self.feature_dropout(x)
        all_weights = []
        for layer in self.encoder:
            x, w = layer(x, None, need_weights)
            all_weights.append(w)
        memory = grid_memory(self.encoder_norm(x))
        return (memory, all_weights) if need_weights else memory

    def forward(self, features: Tensor, tgt_in: Tensor) -> tuple[Tensor, None]:
        return self.decode_all(tgt_in, self.encode(features))[0], None
