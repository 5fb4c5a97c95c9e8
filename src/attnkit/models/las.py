"""Listen, Attend and Spell (Chan et al., ICASSP 2016): a pyramidal BLSTM listens to log-mel frames, an LSTM
speller attends over what it heard and spells characters.

    h = Listen(x)                          pyramidal BLSTMs, each halving time (8x in all)
    s_i = RNN(s_{i-1}, y_{i-1}, c_{i-1})   a 2-layer LSTM
    c_i = AttentionContext(s_i, h)         e_{i,u} = <phi(s_i), psi(h_u)>,  alpha_i = softmax(e_i),  c_i = sum alpha h
    P(y_i | x, y_<i) = CharacterDistribution(s_i, c_i)    an MLP with a softmax

The source is :class:`~attnkit.nn.audio.Frames` (features [B, T, F] and each row's length); padding never
reaches a state (the BLSTMs run on packed sequences, attention gives padded positions no weight), so an utterance
is spelled the same alone as in a padded batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnkit.config import ModelConfig
from attnkit.models.contract import AttentionMaps, GenerativeModel, ModelOutput, RecurrentState
from attnkit.models.transformer import Memory
from attnkit.nn import Score, make_score, masked_softmax
from attnkit.nn.audio import Frames, frame_padding_mask, join_neighbours
from attnkit.nn.loss import label_smoothed_nll
from attnkit.tokens import PAD


@dataclass
class LASConfig(ModelConfig):
    """LAS: ``listener_size`` LSTM units per direction in each of the listener's ``pyramid_layers`` pyramidal
    BLSTMs (time shrinks by 2^pyramid_layers), a 2-layer (``speller_layers``)
    LSTM speller of ``speller_size`` units, attention by ``energy``: "mlp_dot" (the paper's
    <phi(s), psi(h)>, one-layer MLPs of ``attention_size``) or "additive" (Bahdanau's)."""

    family: str = "las"
    preset: str = ""
    listener_size: int = 128
    pyramid_layers: int = 3
    speller_size: int = 256
    speller_layers: int = 2
    embedding_size: int = 64
    attention_size: int = 128
    energy: str = "mlp_dot"  # the attention energy: mlp_dot (the paper's) | additive (Bahdanau's)
    dropout: float = 0.2

    @property
    def width(self) -> int:
        return self.speller_size


class ProjectedDotScore(Score):
    """The paper's attention energy ``e_{i,u} = <phi(s_i), psi(h_u)>``, phi and psi one-layer MLPs (tanh)."""

    def __init__(self, d_query: int, d_key: int, d_hidden: int):
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(d_query, d_hidden), nn.Tanh())
        self.psi = nn.Sequential(nn.Linear(d_key, d_hidden), nn.Tanh())

    def precompute(self, keys: Tensor) -> Tensor:
        return self.psi(keys)

    def forward(self, queries: Tensor, keys: Tensor, projected: Tensor | None = None) -> Tensor:
        """queries [B, T, d_query], keys [B, S, d_key] -> energies [B, T, S]."""
        psi = self.psi(keys) if projected is None else projected
        return self.phi(queries) @ psi.transpose(-1, -2)


def run_lstm(lstm: nn.LSTM, x: Tensor, lengths: Tensor) -> Tensor:
    """x [B, T, D] packed to lengths [B] through ``lstm`` -> outputs [B, T, directions * H], zero at padding."""
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    return pad_packed_sequence(out, batch_first=True, total_length=x.size(1))[0]


class Listener(nn.Module):
    """``pyramid_layers`` pyramidal BLSTMs (eq. 5): ``h^j_i = pBLSTM(h^j_{i-1}, [h^{j-1}_{2i}; h^{j-1}_{2i+1}])``,
    the first over the frames themselves, each halving the time resolution (3 layers: 8x)."""

    def __init__(self, cfg: LASConfig, n_mels: int):
        super().__init__()
        h = cfg.listener_size
        self.pyramid = nn.ModuleList(nn.LSTM(2 * n_mels if j == 0 else 4 * h, h, batch_first=True, bidirectional=True)
                                     for j in range(cfg.pyramid_layers))
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, frames: Frames) -> tuple[Tensor, Tensor]:
        """frames [B, T, F] -> h [B, T / 2^layers, 2 listener_size] and its lengths [B]."""
        x, lengths = frames.features, frames.lengths
        for j, layer in enumerate(self.pyramid):
            x, lengths = join_neighbours(x if j == 0 else self.dropout(x), lengths)
            x = run_lstm(layer, x, lengths)
        return x, lengths


@dataclass
class SpellerState(RecurrentState):
    """The speller between characters: the listener's memory, psi(h) computed once, the LSTM's h and c per layer
    [L, B, H] and the previous context c_{i-1} [B, D]."""

    ROW_DIMS: ClassVar[dict[str, int]] = {"h": 1, "c": 1, "context": 0}

    memory: Memory
    projected: Tensor
    h: Tensor
    c: Tensor
    context: Tensor


class LAS(GenerativeModel):
    """Listen, Attend and Spell: see the module's docstring for the formulas."""

    capabilities = frozenset({"transcribe", "score", "attention"})

    def __init__(self, cfg: LASConfig, n_mels: int, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d_h, d_s = 2 * cfg.listener_size, cfg.speller_size
        self.listener = Listener(cfg, n_mels)
        self.embed = nn.Embedding(vocab_size, cfg.embedding_size, padding_idx=PAD)
        self.speller = nn.ModuleList(nn.LSTMCell((cfg.embedding_size + d_h) if i == 0 else d_s, d_s)
                                     for i in range(cfg.speller_layers))
        if cfg.energy == "mlp_dot":
            self.score = ProjectedDotScore(d_s, d_h, cfg.attention_size)
        else:
            self.score = make_score(cfg.energy, d_s, d_h, cfg.attention_size)
        self.character_distribution = nn.Sequential(nn.Linear(d_s + d_h, d_s), nn.Tanh(), nn.Dropout(cfg.dropout),
                                                    nn.Linear(d_s, vocab_size))
        self.dropout = nn.Dropout(cfg.dropout)

    @property
    def time_reduction(self) -> int:
        """Feature frames per listener frame: 2^pyramid_layers."""
        return 2 ** self.cfg.pyramid_layers

    def memory_lengths(self, lengths: Tensor) -> Tensor:
        """Feature frames [B] -> the listener's frames [B] the speller attends over."""
        for _ in range(self.cfg.pyramid_layers):
            lengths = (lengths // 2).clamp(min=1)
        return lengths

    def encode(self, source: Frames) -> Memory:
        h, lengths = self.listener(source)
        return Memory(h, frame_padding_mask(lengths, h.size(1)))

    def init_state(self, memory: Memory) -> SpellerState:
        b, d_s = memory.states.size(0), self.cfg.speller_size
        zeros = memory.states.new_zeros(self.cfg.speller_layers, b, d_s)
        return SpellerState(memory, self.score.precompute(memory.states), zeros, zeros.clone(),
                            memory.states.new_zeros(b, memory.states.size(-1)))

    def _step(self, tokens: Tensor, state: SpellerState) -> tuple[Tensor, SpellerState, Tensor]:
        """tokens [B] (y_{i-1}) -> logits [B, V], the next state, alpha_i [B, U]."""
        x = torch.cat([self.dropout(self.embed(tokens)), state.context], -1)
        hs, cs = [], []
        for k, cell in enumerate(self.speller):
            h, c = cell(x, (state.h[k], state.c[k]))
            hs.append(h)
            cs.append(c)
            x = self.dropout(h)
        s = hs[-1]
        e = self.score(s[:, None], state.memory.states, state.projected)[:, 0]
        alpha = masked_softmax(e, ~state.memory.padding_mask)
        context = (alpha[:, None] @ state.memory.states)[:, 0]
        logits = self.character_distribution(torch.cat([s, context], -1))
        return logits, SpellerState(state.memory, state.projected, torch.stack(hs), torch.stack(cs), context), alpha

    def step(self, tokens: Tensor, state: SpellerState, need_weights: bool = False):
        logits, state, alpha = self._step(tokens, state)
        return F.log_softmax(logits.float(), -1), state, alpha if need_weights else None

    def forward(self, source: Frames, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0,
                need_weights: bool = False) -> ModelOutput:
        """Teacher forcing: source Frames [B, T, F], tgt_in [B, T'] -> logits [B, T', V]; with ``targets`` the
        label-smoothed loss and NLL summed over the real characters and EOS; with ``need_weights`` the attention
        [B, 1, T', U] over the listener's frames as one cross-attention layer of one head."""
        state = self.init_state(self.encode(source))
        logits, alphas = [], []
        for t in range(tgt_in.size(1)):
            out, state, alpha = self._step(tgt_in[:, t], state)
            logits.append(out)
            alphas.append(alpha)
        logits = torch.stack(logits, 1)
        attention = AttentionMaps(cross=[torch.stack(alphas, 1)[:, None]]) if need_weights else None
        if targets is None:
            return ModelOutput(logits=logits, attention=attention)
        loss, nll = label_smoothed_nll(logits, targets, label_smoothing, PAD)
        return ModelOutput(loss=loss, nll=nll, logits=logits, attention=attention)


def build_las(cfg: LASConfig, n_mels: int, vocab_size: int) -> LAS:
    """A LAS listening to ``n_mels``-band frames, spelling ``vocab_size`` characters."""
    return LAS(cfg, n_mels, vocab_size)
