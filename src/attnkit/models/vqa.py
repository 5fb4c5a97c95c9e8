"""Show, Ask, Attend and Answer (Kazemi & Elqursh 2017): the question decides where the model looks in the image.

The one "X, attend and Y" model whose attention query comes from a second input: the same image gets a different
attention map for each question. With the paper's names (section 3):

    phi = CNN(I)                                    the image grid: L = h*w cells of C channels, each l2-normalised
                                                    (times sqrt(C): ``scale_cells``)
    s = LSTM(E q)                                   the question state: the LSTM's last state over its words
    F_c = W_2 relu(W_1 [phi_l ; s])                 attention logits of glimpse c at cell l (two 1x1 convolutions
                                                    over the grid with s tiled over every cell), computed as
        = W_2 relu(W_1^phi phi_l + W_1^s s)         W_1's columns that read the cell and those that read s
    alpha_{c,l} = exp F_{c,l} / sum_k exp F_{c,k}   a softmax over the cells, one map per glimpse c = 1..K
    x_c = sum_l alpha_{c,l} phi_l                   each glimpse: a weighted sum of cell features
    P(a | I, q) = softmax(W_4 relu(W_3 [x_1; ..; x_K; s]))     a classifier over the answers

Two baselines beside it (``attention``), what the lecture's argument needs: ``"pooled"`` replaces the glimpses by
the grid's mean (every alpha_l = 1/L: attention that looks everywhere), ``"none"`` reads the question alone (no
image at all). The grid is the output of a small CNN trained from scratch (``cnn_channels``: one 3x3 convolution,
batch norm, ReLU and 2x2 max-pooling per entry, so 64-pixel images and 3 entries give an 8 x 8 grid).

Inputs: ``images`` [M, 3, S, S] uint8 pixels, ``questions`` [B, T] word ids (PAD after each question's end) and
``image_index`` [B], the image each question asks about: a batch of M images and their B questions runs the CNN and
W_1^phi once per image (about 10 questions ask about each easy-VQA image), the LSTM and W_1^s once per question.
Padding never reaches the question state (the LSTM reads each question packed to its own length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.models.contract import AttentionMaps, ModelOutput
from attnkit.nn.vision import normalize
from attnkit.tokens import PAD

ATTENTIONS = ("glimpses", "pooled", "none")


@dataclass
class ShowAskAttendAnswerConfig(ModelConfig):
    """Show, Ask, Attend and Answer (Kazemi & Elqursh 2017), or one of its two baselines (``attention``)."""

    family: str = "show_ask_attend_answer"
    attention: str = "glimpses"  # glimpses: the paper's; pooled: the grid's mean, no attention; none: no image
    cnn_channels: tuple[int, ...] = (16, 32, 64)  # one conv-BN-ReLU-pool block each: the grid has the last's C
    scale_cells: bool = True  # each l2-normalised cell times sqrt(C), its channels of order one as s's are
    embedding_size: int = 64  # question word embeddings
    hidden_size: int = 128  # the question LSTM's state s
    attention_size: int = 128  # the hidden channels of the attention's first 1x1 convolution
    glimpses: int = 2  # K attention maps
    classifier_size: int = 256  # the answer MLP's hidden layer
    dropout: float = 0.2

    @property
    def width(self) -> int:
        """The model's width, as the noam schedule reads it: the question state's."""
        return self.hidden_size


# --- the formulas


def glimpse_weights(logits: Tensor) -> Tensor:
    """``alpha_{c,l} = exp F_{c,l} / sum_k exp F_{c,k}``: each glimpse's softmax over the grid cells.

    logits F [B, K, L] -> alpha [B, K, L], each row summing to one.
    """
    return logits.softmax(-1)


def glimpses(alpha: Tensor, phi: Tensor) -> Tensor:
    """``x_c = sum_l alpha_{c,l} phi_l``: each glimpse's weighted sum of the cells.

    alpha [B, K, L], phi [B, L, C] -> x [B, K, C].
    """
    return alpha @ phi


def tile_question(s: Tensor, phi: Tensor) -> Tensor:
    """``[phi_l ; s]`` for every cell l: the question state tiled over the grid, beside each cell's features.

    s [B, H], phi [B, L, C] -> [B, L, C + H]. The reference for :func:`joint_hidden`, which never builds it.
    """
    return torch.cat([phi, s.unsqueeze(1).expand(-1, phi.size(1), -1)], dim=-1)


def joint_hidden(cell_part: Tensor, question_part: Tensor) -> Tensor:
    """``relu(W_1 [phi_l ; s] + b_1) = relu(W_1^phi phi_l + (W_1^s s + b_1))``: the attention's hidden layer over
    the tiled question, from W_1's two column blocks, so that the cells' part is computed once per image and the
    question's once per question, and the [B, L, C + H] tiling is never built.

    cell_part W_1^phi phi [B, L, A], question_part W_1^s s + b_1 [B, A] -> [B, L, A].
    """
    return F.relu(cell_part + question_part.unsqueeze(1))


# --- the model


class GridCNN(nn.Module):
    """A small CNN trained from scratch: pixels [B, 3, S, S] -> the grid phi [B, L, C], L = (S / 2^n)^2 cells
    (row-major) for n blocks of a 3x3 convolution, batch norm, ReLU and 2x2 max-pooling.

    Each cell is l2-normalised (the paper's normalisation of the image features) and, with ``scale``, multiplied by
    sqrt(C): a unit vector's channels are about 1/sqrt(C), far smaller than the question state's beside them in
    ``[phi_l ; s]`` and ``[x_1; ..; x_K; s]``, and the layers that must combine the two (is the shape the colour
    the question names?) then learn slowly."""

    def __init__(self, channels: tuple[int, ...], scale: bool = True):
        super().__init__()
        blocks, c_in = [], 3
        for c in channels:
            blocks += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c
        self.blocks = nn.Sequential(*blocks)
        self.channels = c_in
        self.scale = math.sqrt(c_in) if scale else 1.0

    def forward(self, pixels: Tensor) -> Tensor:
        grid = self.blocks(normalize(pixels))  # [B, C, h, w]
        return self.scale * F.normalize(grid.flatten(2).transpose(1, 2), dim=-1)  # [B, L, C], each of norm scale


class ShowAskAttendAnswer(nn.Module):
    """The image grid, the question's LSTM state, K glimpses over the grid computed from both, and an MLP over the
    answers (see the module's docstring). ``answers``: the answer names, the classifier's outputs in order."""

    family: ClassVar[str] = "show_ask_attend_answer"
    capabilities: ClassVar[frozenset[str]] = frozenset({"answer"})
    problem: ClassVar[str] = "classification"

    def __init__(self, cfg: ShowAskAttendAnswerConfig, vocab_size: int, answers: list[str]):
        super().__init__()
        if cfg.attention not in ATTENTIONS:
            raise AttnkitError(f"model.attention = {cfg.attention!r} is not one of {', '.join(ATTENTIONS)}")
        if cfg.glimpses < 1 or not cfg.cnn_channels:
            raise AttnkitError("model.glimpses and model.cnn_channels: at least one each")
        self.cfg, self.answers = cfg, list(answers)
        self.embed = nn.Embedding(vocab_size, cfg.embedding_size, padding_idx=PAD)
        self.lstm = nn.LSTM(cfg.embedding_size, cfg.hidden_size, batch_first=True)
        self.dropout = nn.Dropout(cfg.dropout)
        reads = cfg.hidden_size
        self.cnn = None
        if cfg.attention != "none":
            self.cnn = GridCNN(cfg.cnn_channels, cfg.scale_cells)
            c = self.cnn.channels
            reads += c * (cfg.glimpses if cfg.attention == "glimpses" else 1)
        if cfg.attention == "glimpses":
            # F = W_2 relu(W_1 [phi_l ; s]): 1x1 convolutions over the grid are linear layers over its cells
            self.attention_hidden = nn.Linear(self.cnn.channels + cfg.hidden_size, cfg.attention_size)  # W_1
            self.attention_logits = nn.Linear(cfg.attention_size, cfg.glimpses)  # W_2
        self.classifier = nn.Sequential(nn.Linear(reads, cfg.classifier_size), nn.ReLU(), nn.Dropout(cfg.dropout),
                                        nn.Linear(cfg.classifier_size, len(self.answers)))  # W_3, W_4

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.answers)

    def question_state(self, questions: Tensor) -> Tensor:
        """s: the LSTM's last state over each question's own words. questions [B, T] -> s [B, H]."""
        lengths = questions.ne(PAD).sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.embed(questions), lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)
        return h[-1]

    def attend(self, phi: Tensor, s: Tensor, image_index: Tensor | None = None) -> Tensor:
        """The glimpse weights alpha [B, K, L] for grids phi [M, L, C] and question states s [B, H]; question b
        looks at grid ``image_index[b]`` (None: M = B, grid b)."""
        w_phi, w_s = self.attention_hidden.weight.split([phi.size(-1), s.size(-1)], dim=1)  # W_1 = [W_1^phi W_1^s]
        cells = F.linear(self.dropout(phi), w_phi)  # [M, L, attention_size]
        if image_index is not None:
            cells = cells[image_index]  # [B, L, attention_size]
        hidden = joint_hidden(cells, F.linear(self.dropout(s), w_s, self.attention_hidden.bias))
        return glimpse_weights(self.attention_logits(hidden).transpose(1, 2))  # [B, K, L]

    def forward(self, images: Tensor | None, questions: Tensor, targets: Tensor | None = None,
                label_smoothing: float = 0.0, need_weights: bool = False,
                image_index: Tensor | None = None) -> ModelOutput:
        """images [M, 3, S, S] uint8 (ignored by ``attention = "none"``), questions [B, T] -> logits [B, A].
        ``image_index`` [B]: the image question b asks about, ``images[image_index[b]]``, so that an image asked
        several questions goes through the CNN once; None: one image per question (M = B, in order).
        The attention maps' ``cross`` holds alpha as one layer [B, K, 1, L] (the K glimpses as heads, one query:
        the question), empty for the question-only baseline."""
        s = self.question_state(questions)
        parts, alpha = [s], None
        if self.cnn is not None:
            phi = self.cnn(images)  # [M, L, C]
            mine = (lambda t: t) if image_index is None else (lambda t: t[image_index])  # each question's image
            if self.cfg.attention == "glimpses":
                alpha = self.attend(phi, s, image_index)
                parts.insert(0, glimpses(alpha, mine(phi)).flatten(1))  # [x_1; ..; x_K]
            else:
                alpha = torch.full((s.size(0), 1, phi.size(1)), 1.0 / phi.size(1), device=phi.device)
                parts.insert(0, mine(phi.mean(1)))
        logits = self.classifier(self.dropout(torch.cat(parts, dim=-1)))
        out = ModelOutput(logits=logits)
        if targets is not None:
            out.loss = F.cross_entropy(logits.float(), targets, reduction="sum", label_smoothing=label_smoothing)
            out.nll = F.cross_entropy(logits.float().detach(), targets, reduction="sum")
        if need_weights:
            out.attention = AttentionMaps(cross=[] if alpha is None else [alpha.unsqueeze(2)])
        return out


def build_show_ask_attend_answer(cfg: ShowAskAttendAnswerConfig, vocab_size: int,
                                 answers: list[str]) -> ShowAskAttendAnswer:
    return ShowAskAttendAnswer(cfg, vocab_size, answers)


def answering_model(cfg, vocab, directory=None):
    """A freshly initialised VQA model of ``cfg``'s family for this question vocabulary and answer set
    (:mod:`attnkit.registry`'s task entry)."""
    from attnkit import registry

    return registry.resolve(registry.family(cfg.model.family).build)(cfg.model, vocab.vocab_size, vocab.answers)
