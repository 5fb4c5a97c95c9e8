"""A model family that lives outside attnkit, registered as a user's own would be (docs/extending.md):

    attnkit --plugin tests/plugins/toy_luong.py train toy.toml --run-dir runs/toy

Luong et al.'s (2015) global attention with a dot score over a source of embeddings and learned positions (no
encoder recurrence), a GRU decoder:

    m_j = E_src x_j + P_j                        the memory: one vector per source token
    h_t = GRU(E_tgt y_{t-1}, h_{t-1})            h_0 = 0
    e_tj = h_t . m_j / sqrt(d)                   alpha_t = softmax_j(e_t), zero at padding
    c_t = sum_j alpha_tj m_j
    p(y_t) = softmax(W_o tanh(W_c [c_t; h_t]))

It follows the model contract (:mod:`attnkit.models.contract`) and nothing else of attnkit knows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import attnkit
from attnkit.config import ModelConfig
from attnkit.models.contract import AttentionMaps, DecodingState, GenerativeModel, ModelOutput
from attnkit.nn.loss import label_smoothed_nll
from attnkit.tokens import PAD


@dataclass
class ToyLuongConfig(ModelConfig):
    family: str = "toy_luong"
    d_model: int = 64
    max_positions: int = 128  # learned source positions
    dropout: float = 0.0

    @property
    def width(self) -> int:
        return self.d_model


@dataclass
class ToyState(DecodingState):
    memory: Tensor  # [N, S, d]
    padding: Tensor  # [N, S], True at padding
    h: Tensor  # [N, d]

    @property
    def rows(self) -> int:
        return self.h.size(0)

    @property
    def device(self) -> torch.device:
        return self.h.device

    def select(self, indices: Tensor, same_source: bool = False) -> ToyState:
        return ToyState(self.memory.index_select(0, indices), self.padding.index_select(0, indices),
                        self.h.index_select(0, indices))


class ToyLuong(GenerativeModel):
    capabilities = frozenset({"translate", "score", "attention"})

    def __init__(self, cfg: ToyLuongConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__()
        self.cfg, d = cfg, cfg.d_model
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=PAD)
        self.positions = nn.Embedding(cfg.max_positions, d)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=PAD)
        self.cell = nn.GRUCell(d, d)
        self.combine = nn.Linear(2 * d, d)
        self.output = nn.Linear(d, tgt_vocab_size)
        self.dropout = nn.Dropout(cfg.dropout)

    def encode(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """source [B, S] -> memory [B, S, d] and padding [B, S]."""
        where = torch.arange(source.size(1), device=source.device)
        return self.dropout(self.src_embed(source) + self.positions(where)), source.eq(PAD)

    def init_state(self, memory) -> ToyState:
        states, padding = memory
        return ToyState(states, padding, states.new_zeros(states.size(0), self.cfg.d_model))

    def _attend_and_read(self, y: Tensor, state: ToyState) -> tuple[Tensor, Tensor, ToyState]:
        """y [N, d] -> logits [N, V], alpha [N, S], the next state."""
        h = self.cell(y, state.h)
        e = (state.memory @ h[:, :, None])[:, :, 0] / self.cfg.d_model ** 0.5
        alpha = e.masked_fill(state.padding, float("-inf")).softmax(-1)
        c = (alpha[:, None] @ state.memory)[:, 0]
        logits = self.output(self.dropout(torch.tanh(self.combine(torch.cat([c, h], -1)))))
        return logits, alpha, ToyState(state.memory, state.padding, h)

    def step(self, tokens: Tensor, state: ToyState, need_weights: bool = False):
        logits, alpha, state = self._attend_and_read(self.tgt_embed(tokens), state)
        return F.log_softmax(logits.float(), -1), state, alpha if need_weights else None

    def forward(self, source: Tensor, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0,
                need_weights: bool = False) -> ModelOutput:
        state = self.init_state(self.encode(source))
        y = self.dropout(self.tgt_embed(tgt_in))
        logits, alphas = [], []
        for t in range(tgt_in.size(1)):
            step_logits, alpha, state = self._attend_and_read(y[:, t], state)
            logits.append(step_logits)
            alphas.append(alpha)
        logits = torch.stack(logits, 1)
        attention = AttentionMaps(cross=[torch.stack(alphas, 1)[:, None]]) if need_weights else None
        if targets is None:
            return ModelOutput(logits=logits, attention=attention)
        loss, nll = label_smoothed_nll(logits, targets, label_smoothing, PAD)
        return ModelOutput(loss=loss, nll=nll, logits=logits, attention=attention)


attnkit.register_family(attnkit.Family("toy_luong", ToyLuongConfig, ToyLuong, task="translation", input="text",
                                       alignment=True))
