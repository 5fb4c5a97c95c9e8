"""Recurrent encoder-decoders: the "thought vector" model (Cho et al. 2014) and RNNsearch (Bahdanau et al. 2014).

Both read a PAD-padded source [B, S] and follow the model contract (encode, init_state,
step, state.select), so attnkit.decode's greedy, beam search and sampling run them unchanged;
``forward`` is the teacher-forced pass the trainer calls; it returns a ModelOutput (logits [B, T, V], loss).

Sizes: ``embedding_size`` is the word embedding size (and the readout's), ``hidden_size`` the GRU's
(RNNsearch's encoder has ``hidden_size`` units per direction, so its annotations have ``2 hidden_size``);
``n_encoder_layers`` / ``n_decoder_layers`` stack GRUs; ``dropout`` acts on the embeddings,
between stacked GRUs and on the readout; RNNsearch's ``context_dropout`` on its annotations.

Padding never reaches a recurrent state: the encoder runs on packed sequences (each row stops
at its own length), and attention gives padded positions zero weight, so a sentence scores the
same alone as in a padded batch.
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
from attnkit.nn import make_score, masked_softmax
from attnkit.nn.loss import label_smoothed_nll
from attnkit.tokens import PAD


@dataclass
class RNNEncDecConfig(ModelConfig):
    """The RNN encoder-decoder of Cho et al. (2014): a GRU encoder's last state is the "thought vector"."""

    family: str = "rnn_encdec"
    preset: str = ""
    embedding_size: int = 256  # word embeddings (and the readout's width)
    hidden_size: int = 512  # GRU units (the thought vector's width)
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    dropout: float = 0.3  # on the embeddings, between stacked GRUs and on the readout
    share_embeddings: bool = True  # source/target embeddings and output layer tied (needs a joint vocabulary)

    @property
    def width(self) -> int:
        return self.hidden_size


@dataclass
class RNNSearchConfig(RNNEncDecConfig):
    """RNNsearch (Bahdanau et al. 2014): a bidirectional GRU encoder (``hidden_size`` units per direction) and a
    decoder that attends to its annotations; the additive score's hidden layer has ``hidden_size`` units."""

    family: str = "rnnsearch"
    hidden_size: int = 256
    attention_score: str = "additive"  # additive (Bahdanau), general, dot, scaled_dot (Luong)
    context_dropout: float = 0.0  # on the annotations the decoder attends to (and starts from)


@dataclass
class RNNState(RecurrentState):
    """A recurrent decoder's state: every layer's hidden state h [L, B, hidden_size], the encoder's memory,
    and (RNNsearch) the part of the attention score that depends on the source only, computed once."""

    ROW_DIMS: ClassVar[dict[str, int]] = {"h": 1}

    memory: Memory
    h: Tensor
    projected: Tensor | None = None  # [B, S, d_attention]


def run_gru(gru: nn.GRU, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Run ``gru`` over x [B, S, d] packed to ``lengths`` [B], so padding never enters a state.

    -> outputs [B, S, directions * H] (zero at padding), final states [layers * directions, B, H]
    taken at each row's own end (the backward direction's "final" state is the one at position 0).
    """
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, h_n = gru(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
    return out, h_n


class Maxout(nn.Module):
    """``t_j = max(t~_{2j-1}, t~_{2j})`` over a linear map to ``2 d_out`` units (Goodfellow et al. 2013):
    the deep output layer of both papers."""

    def __init__(self, d_in: int, d_out: int, pool: int = 2):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out * pool)
        self.pool = pool

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x)
        return y.view(*y.shape[:-1], -1, self.pool).amax(-1)


class _RNNTranslator(GenerativeModel):
    """What both models share: word embeddings and the deep output

        p(y_i) = softmax(W_o maxout(U_o s_i + V_o E y_{i-1} + C_o c_i))

    with W_o tied to the target embeddings (as the Transformer's output layer is), and the source
    embeddings tied too with ``share_embeddings`` (a joint vocabulary).
    """

    def __init__(self, cfg: RNNEncDecConfig, src_vocab_size: int, tgt_vocab_size: int, d_context: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.embedding_size
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=PAD)
        for embed in (self.src_embed, self.tgt_embed):  # small enough for the tied output's logits at init
            nn.init.normal_(embed.weight, std=d**-0.5)
            with torch.no_grad():
                embed.weight[PAD].zero_()
        if cfg.share_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_embeddings needs a joint vocabulary (equal source and target sizes)")
            self.tgt_embed.weight = self.src_embed.weight
        self.readout = Maxout(d + cfg.hidden_size + d_context, d)
        self.output = nn.Linear(d, tgt_vocab_size)
        self.output.weight = self.tgt_embed.weight
        self.dropout = nn.Dropout(cfg.dropout)

    def _gru(self, d_in: int, layers: int, bidirectional: bool = False) -> nn.GRU:
        return nn.GRU(d_in, self.cfg.hidden_size, layers, batch_first=True, bidirectional=bidirectional,
                      dropout=self.cfg.dropout if layers > 1 else 0.0)

    def _embed_source(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """-> embedded source [B, S, embedding_size] and lengths [B] (at least 1: an all-padding row reads one PAD)."""
        return self.dropout(self.src_embed(src)), src.ne(PAD).sum(1).clamp(min=1)

    def _initial_states(self, proj: nn.Module, summary: Tensor) -> Tensor:
        """summary [B, d] -> an initial state per decoder layer [L, B, hidden_size] through ``proj`` (tanh of a
        linear map)."""
        return proj(summary).view(summary.size(0), self.cfg.n_decoder_layers, -1).transpose(0, 1).contiguous()

    def _logits(self, y: Tensor, s: Tensor, c: Tensor) -> Tensor:
        """y = E y_{i-1}, s = s_i, c = c_i ([..., d]) -> logits [..., V]."""
        return self.output(self.dropout(self.readout(torch.cat([y, s, c], -1))))

    def teacher_forced(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V] and the alignments [B, T, S] (None without attention)."""
        raise NotImplementedError

    def forward(self, source: Tensor, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0,
                need_weights: bool = False) -> ModelOutput:
        """Teacher forcing: source [B, S], tgt_in [B, T] -> logits [B, T, V]; with ``targets`` the label-smoothed
        loss and NLL summed over non-pad targets; with ``need_weights`` the alignment as one cross-attention
        layer of one head."""
        logits, alignment = self.teacher_forced(source, tgt_in)
        attention = None
        if need_weights:
            attention = AttentionMaps(cross=[] if alignment is None else [alignment[:, None]])
        if targets is None:
            return ModelOutput(logits=logits, attention=attention)
        loss, nll = label_smoothed_nll(logits, targets, label_smoothing, PAD)
        return ModelOutput(loss=loss, nll=nll, logits=logits, attention=attention)


class RNNEncDec(_RNNTranslator):
    """Cho et al. (2014): the encoder reads the source into one vector, the decoder writes from it alone.

        c = tanh(V h_N)                      the "thought vector": the encoder's state after the last word
        s_0 = tanh(V' c)
        s_i = GRU([E y_{i-1}; c], s_{i-1})   c enters every step, not only the first
        p(y_i) = softmax(W_o maxout(U_o s_i + V_o E y_{i-1} + C_o c))

    The memory handed to the decoder is that one vector: ``Memory.states`` [B, 1, hidden_size]. The
    encoder is unidirectional and stacked ``n_encoder_layers`` deep; c comes from its top layer.
    """

    capabilities = frozenset({"translate", "score"})

    def __init__(self, cfg: RNNEncDecConfig, src_vocab_size: int, tgt_vocab_size: int):
        super().__init__(cfg, src_vocab_size, tgt_vocab_size, d_context=cfg.hidden_size)
        d, h = cfg.embedding_size, cfg.hidden_size
        self.encoder = self._gru(d, cfg.n_encoder_layers)
        self.summary = nn.Sequential(nn.Linear(h, h), nn.Tanh())
        self.init_h = nn.Sequential(nn.Linear(h, h * cfg.n_decoder_layers), nn.Tanh())
        self.decoder = self._gru(d + h, cfg.n_decoder_layers)

    def encode(self, src: Tensor) -> Memory:
        """src [B, S] -> Memory of one position: the thought vector c [B, 1, hidden_size]."""
        x, lengths = self._embed_source(src)
        _, h_n = run_gru(self.encoder, x, lengths)
        c = self.summary(h_n[-1])  # the top layer, after each row's last real token
        return Memory(c[:, None], torch.zeros(c.size(0), 1, dtype=torch.bool, device=c.device))

    def init_state(self, memory: Memory) -> RNNState:
        return RNNState(memory, self._initial_states(self.init_h, memory.states[:, 0]))

    def _decode(self, tgt_in: Tensor, state: RNNState) -> tuple[Tensor, RNNState]:
        """tgt_in [B, T] -> logits [B, T, V] and the state after the last token. c is fixed, so one
        nn.GRU call runs all T steps (the recurrence itself stays sequential inside it)."""
        y = self.dropout(self.tgt_embed(tgt_in))
        c = state.memory.states.expand(-1, tgt_in.size(1), -1)
        s, h = self.decoder(torch.cat([y, c], -1), state.h)
        return self._logits(y, s, c), RNNState(state.memory, h)

    def teacher_forced(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, None]:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V] and no alignment (there is no attention)."""
        return self._decode(tgt_in, self.init_state(self.encode(src)))[0], None

    def step(self, tokens: Tensor, state: RNNState, need_weights: bool = False):
        """tokens [B] -> (log_probs [B, V], new state, None): there is no attention to show."""
        logits, state = self._decode(tokens[:, None], state)
        return F.log_softmax(logits[:, 0].float(), dim=-1), state, None


class RNNSearch(_RNNTranslator):
    """Bahdanau et al. (2014), "jointly learning to align and translate":

        h_j = [->h_j; <-h_j]                   annotations of a bidirectional GRU encoder
        s_0 = tanh(W_s <-h_1)                  from the backward encoder's first state
        e_ij = a(s_{i-1}, h_j)                 additive: v^T tanh(W s_{i-1} + U h_j), one tanh hidden layer
        alpha_ij = softmax_j(e_ij)             zero at padded positions
        c_i = sum_j alpha_ij h_j
        s_i = GRU([E y_{i-1}; c_i], s_{i-1})
        p(y_i) = softmax(W_o maxout(U_o s_i + V_o E y_{i-1} + C_o c_i))

    ``attention_score`` picks a(.) from attnkit.nn: "additive" (the paper; hidden size hidden_size), Luong's
    "general" (s^T W h_j) or "dot" / "scaled_dot". A dot product needs one size on both sides, and
    the annotations are twice the decoder's: the query is [s; s], so e_ij = s . (->h_j + <-h_j),
    still without parameters. With stacked decoder layers the top one is s.
    """

    capabilities = frozenset({"translate", "score", "attention", "align"})

    def __init__(self, cfg: RNNSearchConfig, src_vocab_size: int, tgt_vocab_size: int):
        d, h = cfg.embedding_size, cfg.hidden_size
        super().__init__(cfg, src_vocab_size, tgt_vocab_size, d_context=2 * h)
        self.encoder = self._gru(d, cfg.n_encoder_layers, bidirectional=True)
        self.init_h = nn.Sequential(nn.Linear(h, h * cfg.n_decoder_layers), nn.Tanh())
        self.dot = cfg.attention_score in ("dot", "scaled_dot")
        self.score = make_score(cfg.attention_score, 2 * h if self.dot else h, 2 * h, h)
        self.cells = nn.ModuleList(nn.GRUCell(d + 2 * h if i == 0 else h, h) for i in range(cfg.n_decoder_layers))
        self.context_dropout = nn.Dropout(cfg.context_dropout)

    def encode(self, src: Tensor) -> Memory:
        """src [B, S] -> Memory: annotations [B, S, 2 hidden_size] (zero at padding) and the padding mask [B, S].

        In training ``context_dropout`` drops annotation units, so the decoder cannot lean on a few of them: on a
        corpus as small as Multi30k, regularised on its embeddings and readout alone, the recipe's model overfits
        within the hour (LIUM's systems drop the context too)."""
        x, lengths = self._embed_source(src)
        annotations, _ = run_gru(self.encoder, x, lengths)
        return Memory(self.context_dropout(annotations), src.eq(PAD))

    def init_state(self, memory: Memory) -> RNNState:
        backward_first = memory.states[:, 0, self.cfg.hidden_size:]  # <-h_1: the backward GRU's state after reading all
        return RNNState(memory, self._initial_states(self.init_h, backward_first),
                        self.score.precompute(memory.states))

    def _attend(self, state: RNNState) -> tuple[Tensor, Tensor]:
        """-> context c_i [B, 2 hidden_size] and weights alpha_i [B, S], from s_{i-1} (the top layer of ``state``)."""
        s = state.h[-1]
        query = torch.cat([s, s], -1) if self.dot else s
        e = self.score(query[:, None], state.memory.states, state.projected)[:, 0]
        alpha = masked_softmax(e, ~state.memory.padding_mask)
        return (alpha[:, None] @ state.memory.states)[:, 0], alpha

    def _recur(self, y: Tensor, state: RNNState) -> tuple[Tensor, Tensor, Tensor, RNNState]:
        """y = E y_{i-1} [B, embedding_size] -> s_i [B, hidden_size], c_i, alpha_i and the new state."""
        c, alpha = self._attend(state)
        x, hs = torch.cat([y, c], -1), []
        for cell, h in zip(self.cells, state.h):
            h = cell(x, h)
            hs.append(h)
            x = self.dropout(h)
        return hs[-1], c, alpha, RNNState(state.memory, torch.stack(hs), state.projected)

    def teacher_forced(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V] and the alignments alpha [B, T, S].

        The recurrence runs step by step (c_i needs s_{i-1}); the readout and the output layer,
        the costly part with a large vocabulary, run once over all T steps.
        """
        state = self.init_state(self.encode(src))
        y = self.dropout(self.tgt_embed(tgt_in))
        states, contexts, alphas = [], [], []
        for t in range(tgt_in.size(1)):
            s, c, alpha, state = self._recur(y[:, t], state)
            states.append(s)
            contexts.append(c)
            alphas.append(alpha)
        return self._logits(y, torch.stack(states, 1), torch.stack(contexts, 1)), torch.stack(alphas, 1)

    def step(self, tokens: Tensor, state: RNNState, need_weights: bool = False):
        """tokens [B] (y_{i-1}) -> (log_probs [B, V], new state, alpha_i [B, S] or None)."""
        y = self.dropout(self.tgt_embed(tokens))
        s, c, alpha, state = self._recur(y, state)
        logits = self._logits(y, s, c)
        return F.log_softmax(logits.float(), dim=-1), state, alpha if need_weights else None
