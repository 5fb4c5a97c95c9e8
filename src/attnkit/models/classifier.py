"""Fine-tuning BERT on your own task: a sequence classifier or regressor over :class:`BertEncoder`.

The last step of the lectures: pretrain, then fine-tune. Devlin et al. (2019, section 3 and figure 4) put
one linear layer over a representation of the whole input and train everything on the task's loss:

    cls:   h = tanh(W_p h_[CLS] + b_p)                   BERT's pooler over the final [CLS] state
    mean:  u = sum_t m_t h_t / sum_t m_t                   sentence-transformers' mean over real tokens
    logits z = W dropout(h or u) + b                       [B, n_labels]

``pooling="cls"`` is exactly Hugging Face's ``BertForSequenceClassification``; ``pooling="mean"`` is the
representation all-MiniLM-L6-v2 was trained for (Reimers & Gurevych 2019). Classification trains on the
cross-entropy (optionally class-weighted), regression (``n_labels == 1``) on the squared error.

A single sentence is ``[CLS] a [SEP]`` (token types all 0); a pair is ``[CLS] a [SEP] b [SEP]``, types 0 over
``[CLS] a [SEP]`` and 1 over ``b [SEP]``. :meth:`attnkit.data.WordPiece.sentences` builds either and pads each
batch only to its own longest row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.models.bert import BertConfig, BertEncoder, load_bert, minilm_dir
from attnkit.models.contract import AttentionMaps, ModelOutput


@dataclass
class BertClassifierConfig(BertConfig):
    """BERT fine-tuned on a task (Devlin et al. 2019, section 4): the encoder of ``pretrained`` (a Hugging Face
    directory; empty: the shipped all-MiniLM-L6-v2), a pooled representation, dropout (``dropout``, as BERT's
    hidden layers) and one linear layer over the task's labels, or one score for a regression task. The encoder's
    sizes are the pretrained model's: a run reads them from its config.json and records them."""

    family: str = "bert_classifier"
    pretrained: str = ""
    pooling: str = "cls"  # cls: BERT's pooler over [CLS]; mean: the mean of the final states (sentence-transformers)

POOLINGS = ("cls", "mean")
PROBLEMS = ("classification", "regression")
REDUCTIONS = ("sum", "mean")

# --- the formulas


def cls_pooling(states: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """BERT's pooler: ``h = tanh(W_p h_[CLS] + b_p)``, the final state of the first token through a dense layer.

    states [B, T, d], weight W_p [d, d], bias b_p [d] -> h [B, d].
    """
    return torch.tanh(F.linear(states[:, 0], weight, bias))


def mean_pooling(states: Tensor, padding_mask: Tensor | None) -> Tensor:
    """Mean over real tokens ([CLS] and [SEP] included): ``u = sum_t m_t h_t / max(sum_t m_t, 1e-9)``, m_t = 1 for
    a real token, 0 for padding (sentence-transformers' pooling, without its final normalisation).

    states [B, T, d], padding_mask [B, T] (True = pad; None = no padding) -> u [B, d].
    """
    if padding_mask is None:
        return states.mean(1)
    m = (~padding_mask).unsqueeze(-1).to(states.dtype)
    return (states * m).sum(1) / m.sum(1).clamp(min=1e-9)


def classification_loss(logits: Tensor, targets: Tensor, class_weights: Tensor | None = None,
                        reduction: str = "sum", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy ``l_i = -w_{y_i} log softmax(z_i)_{y_i}`` (w = 1 without class weights), summed over the
    batch, or averaged as torch does: ``sum_i l_i / sum_i w_{y_i}``. With label smoothing eps the target is
    ``(1 - eps) onehot(y_i) + eps / C``.

    logits z [B, C], targets y [B] (class ids), class_weights w [C] -> a scalar.
    """
    weight = None if class_weights is None else class_weights.float()
    return F.cross_entropy(logits.float(), targets, weight=weight, reduction=reduction,
                           label_smoothing=label_smoothing)


def regression_loss(predictions: Tensor, targets: Tensor, reduction: str = "sum") -> Tensor:
    """Squared error ``l_i = (z_i - y_i)^2``, summed over the batch, or averaged (MSE).

    predictions z [B], targets y [B] -> a scalar.
    """
    return F.mse_loss(predictions.float(), targets.float(), reduction=reduction)


# --- the model


def head_labels(n_labels: int, problem: str, labels: Sequence[str] | None = None) -> list[str]:
    """The label names of a head of ``n_labels`` outputs for ``problem``, checked (a regressor has one output,
    a classifier at least two, each label its own name); None names them LABEL_0.. (a regressor's: "score")."""
    if problem not in PROBLEMS:
        raise AttnkitError(f"problem {problem!r}: expected one of {', '.join(PROBLEMS)}")
    if problem == "regression" and n_labels != 1:
        raise AttnkitError(f"regression predicts one score: n_labels must be 1, not {n_labels}")
    if problem == "classification" and n_labels < 2:
        raise AttnkitError(f"classification needs at least 2 labels, not {n_labels}")
    if labels is None:
        labels = ["score"] if problem == "regression" else [f"LABEL_{i}" for i in range(n_labels)]
    labels = [str(name) for name in labels]
    if len(labels) != n_labels or len(set(labels)) != n_labels:
        raise AttnkitError(f"labels {labels}: expected {n_labels} different names")
    return labels


def head_class_weights(class_weights: Sequence[float] | Tensor | None, n_labels: int, problem: str) -> Tensor | None:
    """Class weights as the loss takes them: [n_labels] float32, checked (None: every class weighs 1)."""
    if class_weights is None:
        return None
    if problem == "regression":
        raise AttnkitError("class_weights are for classification, not regression")
    class_weights = torch.as_tensor(class_weights, dtype=torch.float32)
    if class_weights.shape != (n_labels,):
        raise AttnkitError(f"class_weights: expected {n_labels} weights, got shape {tuple(class_weights.shape)}")
    return class_weights


class SequenceClassifier(nn.Module):
    """BERT, a pooled representation, dropout and one linear layer: a classifier over ``labels`` or, with
    ``problem="regression"``, one real-valued score.

    Parameters: ``encoder`` (a :class:`BertEncoder`), ``pooler`` (W_p, b_p; only with ``pooling="cls"``) and
    ``classifier`` (W [n_labels, d], b), the names of Hugging Face's ``BertForSequenceClassification``.
    ``class_weights`` (classification only) weigh each class's cross-entropy; they are a training setting,
    not saved with the weights.
    """

    family: ClassVar[str] = "bert_classifier"
    capabilities: ClassVar[frozenset[str]] = frozenset({"classify", "attention"})

    def __init__(self, encoder: BertEncoder, n_labels: int, pooling: str = "cls", dropout: float = 0.1,
                 problem: str = "classification", labels: Sequence[str] | None = None,
                 class_weights: Sequence[float] | Tensor | None = None):
        super().__init__()
        if pooling not in POOLINGS:
            raise AttnkitError(f"pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
        labels = head_labels(n_labels, problem, labels)
        self.encoder = encoder
        self.n_labels, self.pooling, self.problem, self.labels = n_labels, pooling, problem, tuple(labels)
        d = encoder.cfg.d_model
        self.pooler = nn.Linear(d, d) if pooling == "cls" else None
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d, n_labels)
        self.register_buffer("class_weights", head_class_weights(class_weights, n_labels, problem), persistent=False)
        self.pooler_pretrained = False  # load_pretrained_classifier: W_p, b_p came from the checkpoint

    def head_config(self) -> dict:
        """What rebuilds this model's head around an encoder (JSON-ready, for a checkpoint's metadata)."""
        return {"n_labels": self.n_labels, "pooling": self.pooling, "dropout": self.dropout.p,
                "problem": self.problem, "labels": list(self.labels)}

    @property
    def body(self) -> BertEncoder:
        """The Transformer under the head (``.cfg``, ``.layers``): the encoder."""
        return self.encoder

    def encode_targets(self, values: Sequence[str | int | float]) -> Tensor:
        """Targets for ``forward``: classification takes label names or class ids -> class ids [B] (long);
        regression takes numbers -> [B] (float32)."""
        if self.problem == "regression":
            return torch.tensor([float(v) for v in values], dtype=torch.float32)
        index = {name: i for i, name in enumerate(self.labels)}
        ids = []
        for v in values:
            if isinstance(v, str):
                if v not in index:
                    raise AttnkitError(f"label {v!r} is not one of {', '.join(self.labels)}")
                ids.append(index[v])
            elif int(v) == v and 0 <= int(v) < self.n_labels:
                ids.append(int(v))
            else:
                raise AttnkitError(f"class id {v} is not one of 0..{self.n_labels - 1}")
        return torch.tensor(ids, dtype=torch.long)

    def pool(self, states: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Final states [B, T, d] -> the representation the head reads [B, d] (before dropout)."""
        if self.pooler is not None:
            return cls_pooling(states, self.pooler.weight, self.pooler.bias)
        return mean_pooling(states, padding_mask)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None,
                targets: Tensor | None = None, need_weights: bool = False, reduction: str = "sum",
                label_smoothing: float = 0.0) -> ModelOutput:
        """tokens [B, T], padding_mask [B, T] (True = pad; None = no padding), token_types [B, T] (None = all 0)
        -> ModelOutput(logits [B, n_labels], attention, and with targets the loss and nll).

        ``targets``: class ids [B] (long) for classification, scores [B] (float) for regression; see
        :meth:`encode_targets`. ``loss`` is summed over the batch, as the model contract and attnkit's Trainer want
        (``reduction="mean"`` averages instead, as torch and Hugging Face do); it carries the class weights.
        ``nll`` is the same reduction without class weights, label smoothing and gradient: the cross-entropy, or
        for regression the squared error. ``label_smoothing`` (classification) smooths the training loss.
        ``attention.encoder``: each layer's self-attention [B, H, T, T] when ``need_weights``.
        """
        if reduction not in REDUCTIONS:
            raise AttnkitError(f"reduction {reduction!r}: expected one of {', '.join(REDUCTIONS)}")
        encoded = self.encoder(tokens, padding_mask, token_types, need_weights)
        logits = self.classifier(self.dropout(self.pool(encoded.states, padding_mask)))
        attention = AttentionMaps(encoder=encoded.weights) if need_weights else None
        if targets is None:
            return ModelOutput(logits=logits, attention=attention)
        if self.problem == "regression":
            loss = regression_loss(logits[:, 0], targets.reshape(-1), reduction)
            return ModelOutput(loss=loss, nll=loss.detach(), logits=logits, attention=attention)
        targets = targets.reshape(-1)
        loss = classification_loss(logits, targets, self.class_weights, reduction, label_smoothing)
        plain = self.class_weights is None and not label_smoothing
        nll = loss.detach() if plain else classification_loss(logits.detach(), targets, None, reduction)
        return ModelOutput(loss=loss, nll=nll, logits=logits, attention=attention)


def build_classifier(cfg, vocab_size: int, labels: Sequence[str], problem: str = "classification",
                     class_weights: Sequence[float] | Tensor | None = None) -> SequenceClassifier:
    """A freshly initialised classifier (or regressor: ``problem="regression"``, one label) of a
    :class:`~attnkit.config.BertClassifierConfig` (encoder sizes, pooling, dropout) over ``vocab_size`` pieces."""
    n_labels = 1 if problem == "regression" else len(labels)
    return SequenceClassifier(BertEncoder(cfg, vocab_size), n_labels, cfg.pooling, cfg.dropout, problem,
                              list(labels), class_weights)


# --- from pretrained weights


def init_head(linear: nn.Linear, std: float = 0.02, generator: torch.Generator | None = None) -> nn.Linear:
    """Hugging Face's initialisation of a new layer over BERT: weights ~ N(0, std^2) (``initializer_range``),
    bias 0."""
    with torch.no_grad():
        linear.weight.normal_(0.0, std, generator=generator)
        linear.bias.zero_()
    return linear


def _pretrained_pooler(file: Path) -> tuple[Tensor, Tensor] | None:
    """The pooler's dense layer (W_p, b_p) from a Hugging Face safetensors file, None when it has none."""
    with safe_open(str(file), "pt") as f:
        keys = set(f.keys())
        for prefix in ("pooler.dense.", "bert.pooler.dense."):
            if prefix + "weight" in keys and prefix + "bias" in keys:
                return f.get_tensor(prefix + "weight"), f.get_tensor(prefix + "bias")
    return None


def load_pretrained_classifier(directory: str | Path | None = None, n_labels: int = 2, pooling: str = "cls",
                               dropout: float = 0.1, problem: str = "classification",
                               labels: Sequence[str] | None = None,
                               class_weights: Sequence[float] | Tensor | None = None,
                               seed: int | None = None) -> SequenceClassifier:
    """A classifier over the pretrained BERT of a Hugging Face directory (default all-MiniLM-L6-v2), in eval mode
    (call ``.train()`` to fine-tune).

    The encoder and, with ``pooling="cls"``, BERT's pooler come from the checkpoint (a pooler it lacks is
    initialised as new); the classifier is new: N(0, initializer_range^2) weights (0.02), zero bias. ``seed``
    makes the new weights reproducible without touching torch's global generator.
    """
    directory = Path(directory) if directory is not None else minilm_dir()
    encoder = load_bert(directory)  # checks the files and names what is wrong
    hf = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    std = float(hf.get("initializer_range", 0.02))
    model = SequenceClassifier(encoder, n_labels, pooling, dropout, problem, labels, class_weights)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    init_head(model.classifier, std, generator)
    if model.pooler is not None:
        pretrained = _pretrained_pooler(directory / "model.safetensors")
        if pretrained is None:
            init_head(model.pooler, std, generator)
        else:
            with torch.no_grad():
                model.pooler.weight.copy_(pretrained[0])
                model.pooler.bias.copy_(pretrained[1])
            model.pooler_pretrained = True
    return model.eval()
