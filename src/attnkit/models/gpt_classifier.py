"""Fine-tuning a GPT: a classifier or regressor over attnkit's :class:`TransformerLM`, GPT-1's recipe.

Radford et al. (2018, section 3.2 and figure 1) keep the pretrained decoder whole and add only an input format,
a linear layer and an auxiliary objective:

    input   <s> a <e>   or   <s> a $ b <e>             three new tokens: start, delimiter, extract
    h_l     the final states of the decoder            [B, T, d]
    logits  z = W_y dropout(h_l^m) + b_y               h_l^m the state at the extract token <e>; P(y|x) = softmax(z)
    L3 = L2 + lambda L1                                 L2 the task's loss, L1 the language model's on the input

The decoder is causal, so the extract token, last in its row, is the only position that has read the whole
input; padding after it is never seen. The three new ids are vocab, vocab+1 and vocab+2: the token embedding
(and the output layer tied to it) gains three rows, initialised N(0, 0.02^2) as GPT-1's new parameters are, the
pretrained rows kept as they are. GPT-1 uses lambda = 0.5 and dropout 0.1 on the classifier's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.models.classifier import (
    REDUCTIONS,
    SequenceClassifier,
    classification_loss,
    head_class_weights,
    head_labels,
    init_head,
    regression_loss,
)
from attnkit.models.contract import AttentionMaps, ModelOutput
from attnkit.models.lm import LMConfig, TransformerLM
from attnkit.tokens import PAD


@dataclass
class GPTClassifierConfig(LMConfig):
    """A GPT fine-tuned on a task, GPT-1's recipe (Radford et al. 2018, section 3.2): the language model of
    ``pretrained`` (a ``transformer_lm`` checkpoint or run directory whose tokenizer is SentencePiece), its input
    framed with start, delimiter and extract tokens, dropout (``dropout``, as the LM's) and a linear head on the
    extract token's final state; the LM's own loss on the input is added with weight ``lm_weight`` (lambda).
    The LM's sizes and tokenizer are the pretrained run's: a run reads them from its config.toml and records
    them. ``from_scratch``: the same LM shape and tokenizer with freshly initialised weights (what pretraining
    buys, measured)."""

    family: str = "gpt_classifier"
    pretrained: str = ""
    from_scratch: bool = False
    lm_weight: float = 0.5


N_SPECIAL = 3  # start <s>, delimiter $, extract <e>

# --- the input format


def special_ids(vocab_size: int) -> tuple[int, int, int]:
    """The new tokens' ids after an LM vocabulary of ``vocab_size``: (start <s>, delimiter $, extract <e>) =
    (V, V + 1, V + 2)."""
    return vocab_size, vocab_size + 1, vocab_size + 2


def frame(vocab_size: int, first: Sequence[int], second: Sequence[int] | None = None) -> list[int]:
    """GPT-1's traversal-style input (figure 1): ``<s> a <e>``, or for a pair ``<s> a $ b <e>``.

    first a, second b: ids of the LM's vocabulary (0 <= id < V, not PAD) -> the framed ids [m], the extract
    token last.
    """
    start, delimiter, extract = special_ids(vocab_size)
    for name, ids in (("first", first), ("second", second or ())):
        bad = [int(i) for i in ids if not 0 <= int(i) < vocab_size or int(i) == PAD]
        if bad:
            raise AttnkitError(f"{name} sentence: token id {bad[0]} is not a word of the LM's vocabulary "
                               f"(1..{vocab_size - 1}; {PAD} is padding)")
    body = [int(i) for i in first] if second is None else [*map(int, first), delimiter, *map(int, second)]
    return [start, *body, extract]


def collate_framed(rows: Sequence[Sequence[int]], pad_id: int = PAD) -> tuple[Tensor, Tensor, Tensor]:
    """Framed rows (:func:`frame`), padded on the right to the longest -> tokens [B, T], padding_mask [B, T]
    (True = pad) and each row's extract position [B] (its last real token, ``len(row) - 1``)."""
    if not rows:
        raise AttnkitError("collate_framed: the batch has no rows")
    if min(len(r) for r in rows) < 2:
        raise AttnkitError("collate_framed: a framed row holds at least <s> and <e>; frame the ids with frame()")
    longest = max(len(r) for r in rows)
    tokens = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    padding_mask = torch.arange(longest)[None, :] >= lengths[:, None]
    return tokens, padding_mask, lengths - 1


class FramingTokenizer:
    """A language model's SentencePiece tokenizer reading inputs as :class:`GPTClassifier` takes them: each
    sentence (or pair) cut into the LM's subwords, truncated to ``max_len`` ids in all (the three new tokens
    counted; a pair: the longer sentence first), then framed (:func:`frame`). It offers what the classifier's
    batching, serving and explanations ask of a tokenizer, as BERT's :class:`~attnkit.data.WordPiece` does:
    ``example``, ``ids``, ``id_to_piece``, ``pad_id``, ``specials``, ``vocab_size`` (the LM's, before the new
    tokens) and ``max_len``."""

    NAMES = ("<s>", "$", "<e>")

    def __init__(self, tokenizer, max_len: int = 128):
        if max_len < 3:
            raise AttnkitError(f"max_len {max_len}: a framed input needs room for <s>, $ and <e>")
        self.tokenizer, self.max_len, self.pad_id = tokenizer, int(max_len), PAD
        self.path = tokenizer.path

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def specials(self) -> frozenset[int]:
        return frozenset(special_ids(self.vocab_size))

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode([text])[0]

    def example(self, first: str, second: str | None = None) -> tuple[list[int], list[int]]:
        """-> (framed ids, token types): all types 0, since GPT-1 marks a pair's second sentence by the delimiter."""
        from attnkit.data.wordpiece import truncate_pair

        a = self.ids(first)
        if second is None:
            ids = frame(self.vocab_size, a[: self.max_len - 2])
        else:
            ids = frame(self.vocab_size, *truncate_pair(a, self.ids(second), self.max_len - 3))
        return ids, [0] * len(ids)

    def id_to_piece(self, ids) -> list[str]:
        v = self.vocab_size
        return [self.NAMES[int(i) - v] if int(i) >= v else self.tokenizer.id_to_piece([int(i)])[0] for i in ids]


# --- the formulas


def extract_states(states: Tensor, extract: Tensor) -> Tensor:
    """h_l^m: each row's final state at its extract token.

    states [B, T, d], extract [B] (positions) -> [B, d].
    """
    return states[torch.arange(states.size(0), device=states.device), extract]


def lm_targets(tokens: Tensor, vocab_size: int, padding_mask: Tensor | None = None, pad_id: int = PAD) -> Tensor:
    """The next tokens ``u_{t+1}`` the LM predicts from ``u_1..u_t``, with what it must not predict turned into
    ``pad_id``: padding (the mask's, whatever ids it holds) and the new ids (>= V: $ and <e>; <s> is never a next
    token).

    tokens [B, T], padding_mask [B, T] (True = pad; None = none) -> targets [B, T - 1].
    """
    targets = tokens[:, 1:]
    drop = targets >= vocab_size
    if padding_mask is not None:
        drop = drop | padding_mask[:, 1:]
    return targets.masked_fill(drop, pad_id)


def lm_sequence_loss(logits: Tensor, targets: Tensor, pad_id: int = PAD) -> Tensor:
    """L1 of each row, the LM's cross-entropy averaged over its own predicted tokens:
    ``L1_i = (1 / n_i) sum_t -log softmax(z_{i,t})_{u_{i,t+1}}``, over the n_i targets that are not padding
    (a row with none has L1_i = 0).

    logits z [B, T - 1, V'], targets [B, T - 1] -> [B].
    """
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=pad_id, reduction="none")
    counts = targets.ne(pad_id).sum(1).clamp(min=1)
    return nll.sum(1) / counts


def grow_embedding(lm: TransformerLM, n_new: int = N_SPECIAL, std: float = 0.02,
                   generator: torch.Generator | None = None) -> None:
    """Add ``n_new`` rows to the LM's token embedding, in place: rows 0..V-1 are kept, the new rows V..V+n-1 are
    drawn from N(0, std^2). A tied output layer grows with it (it is the same matrix: its softmax spans the new ids,
    which are never targets, so L1 only pushes their probability down); an untied one keeps its V outputs.
    attnkit scales every lookup by sqrt(d_model), so a new row enters at about 0.02 sqrt(d) where a pretrained
    one enters near unit scale: small, as GPT-1's new tokens were beside its own 0.02-scale embeddings."""
    if not isinstance(lm.embed.tokens, nn.Embedding) or not isinstance(lm.output, nn.Linear):
        raise AttnkitError("an adaptive-softmax LM cannot gain the special tokens: fine-tune an LM with "
                           "model.adaptive_softmax = []")
    old = lm.embed.tokens
    tied = lm.output.weight is old.weight
    vocab, d = old.weight.shape
    new = nn.Embedding(vocab + n_new, d, padding_idx=old.padding_idx, device=old.weight.device,
                       dtype=old.weight.dtype)
    with torch.no_grad():
        new.weight[:vocab] = old.weight
        rows = torch.empty(n_new, d, dtype=torch.float32).normal_(0.0, std, generator=generator)
        new.weight[vocab:] = rows.to(new.weight)
    lm.embed.tokens = new
    if tied:
        output = nn.Linear(d, vocab + n_new, bias=False, device=new.weight.device, dtype=new.weight.dtype)
        output.weight = new.weight
        lm.output = output


# --- the model


class GPTClassifier(nn.Module):
    """A pretrained (or new) :class:`TransformerLM`, three new tokens, dropout and a linear head W_y on the final
    state of the extract token: a classifier over ``labels`` or, with ``problem="regression"``, one real score.

    ``lm`` becomes this model's body: its embedding grows by three rows in place (:func:`grow_embedding`).
    ``lm_weight`` is lambda of ``L3 = L2 + lambda L1`` (0 trains on the task alone and skips the LM's softmax).
    ``class_weights`` (classification only) weigh each class's cross-entropy, as in :class:`SequenceClassifier`.
    ``seed`` makes the new weights (embedding rows and head) reproducible without touching torch's global
    generator.
    """

    family: ClassVar[str] = "gpt_classifier"
    capabilities: ClassVar[frozenset[str]] = frozenset({"classify", "attention"})

    def __init__(self, lm: TransformerLM, n_labels: int, dropout: float = 0.1, problem: str = "classification",
                 labels: Sequence[str] | None = None, class_weights: Sequence[float] | Tensor | None = None,
                 lm_weight: float = 0.5, init_std: float = 0.02, seed: int | None = None):
        super().__init__()
        labels = head_labels(n_labels, problem, labels)
        if lm_weight < 0:
            raise AttnkitError(f"lm_weight {lm_weight}: the auxiliary LM loss's weight must be >= 0")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.vocab_size = lm.embed.tokens.weight.size(0) if isinstance(lm.embed.tokens, nn.Embedding) else 0
        grow_embedding(lm, N_SPECIAL, init_std, generator)
        self.lm = lm
        self.n_labels, self.problem, self.labels = n_labels, problem, tuple(labels)
        self.lm_weight = float(lm_weight)
        self.dropout = nn.Dropout(dropout)
        weight = lm.embed.tokens.weight
        self.classifier = init_head(nn.Linear(lm.cfg.d_model, n_labels, device=weight.device, dtype=weight.dtype),
                                    init_std, generator)
        self.register_buffer("class_weights", head_class_weights(class_weights, n_labels, problem), persistent=False)

    @classmethod
    def from_config(cls, cfg: LMConfig, vocab_size: int, n_labels: int = 2, dropout: float = 0.1,
                    problem: str = "classification", labels: Sequence[str] | None = None,
                    class_weights: Sequence[float] | Tensor | None = None, lm_weight: float = 0.5,
                    seed: int | None = None) -> GPTClassifier:
        """A freshly initialised LM of ``cfg`` over ``vocab_size`` words, with the head. ``cls.from_config(cfg,
        **model.head_config())`` rebuilds a saved model's shapes for its state dict."""
        return cls(TransformerLM(cfg, vocab_size), n_labels, dropout, problem, labels, class_weights, lm_weight,
                   seed=seed)

    def head_config(self) -> dict:
        """What rebuilds this model around an LM config (JSON-ready, for a checkpoint's metadata); ``vocab_size`` is
        the LM's own vocabulary, before the three new tokens."""
        return {"vocab_size": self.vocab_size, "n_labels": self.n_labels, "dropout": self.dropout.p,
                "problem": self.problem, "labels": list(self.labels), "lm_weight": self.lm_weight}

    encode_targets = SequenceClassifier.encode_targets

    @property
    def body(self) -> TransformerLM:
        """The Transformer under the head (``.cfg``, ``.layers``): the language model."""
        return self.lm

    @property
    def special_ids(self) -> tuple[int, int, int]:
        """(start <s>, delimiter $, extract <e>)."""
        return special_ids(self.vocab_size)

    def frame(self, first: Sequence[int], second: Sequence[int] | None = None) -> list[int]:
        """``<s> a <e>`` or ``<s> a $ b <e>`` (:func:`frame`) with this model's special ids."""
        return frame(self.vocab_size, first, second)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None,
                targets: Tensor | None = None, need_weights: bool = False, reduction: str = "sum",
                label_smoothing: float = 0.0, extract: Tensor | None = None) -> ModelOutput:
        """tokens [B, T] (framed, padded on the right), padding_mask [B, T] (True = pad; None = no padding) ->
        ModelOutput(logits [B, n_labels], attention, and with targets the loss and nll).

        ``extract`` [B]: each row's extract position (:func:`collate_framed`); by default its last position that is
        not padding.
        ``token_types`` is accepted for :class:`SequenceClassifier`'s signature and ignored: GPT-1 separates the
        sentences of a pair by the delimiter. ``targets``: class ids [B] (long), or scores [B] (float) for
        regression (:meth:`encode_targets`).

        ``loss`` is L3 of each row, ``L2_i + lambda L1_i``, summed over the batch (``reduction="mean"``
        averages): L2 the task's loss (class-weighted and label-smoothed as asked), L1 the LM's cross-entropy
        averaged over the row's predicted tokens (:func:`lm_sequence_loss`), the mean GPT-1's released code
        takes, so that lambda weighs one row's LM loss against its task loss whatever its length. The LM does
        not predict padding or the new ids (:func:`lm_targets`): it is scored on text only. ``nll`` is the
        task's loss alone (no class weights, smoothing or gradient). ``attention.decoder``: each layer's causal
        self-attention [B, H, T, T] when ``need_weights``.
        """
        if reduction not in REDUCTIONS:
            raise AttnkitError(f"reduction {reduction!r}: expected one of {', '.join(REDUCTIONS)}")
        if extract is None:
            last = torch.full((tokens.size(0),), tokens.size(1) - 1, device=tokens.device)
            extract = last if padding_mask is None else last - (~padding_mask).flip(1).int().argmax(1)
        extract = extract.to(tokens.device)
        if not bool((tokens.gather(1, extract[:, None]) == self.special_ids[2]).all()):
            raise AttnkitError(f"a row's last real token is not the extract token <e> (id {self.special_ids[2]}): "
                               "frame each input with frame() and pad on the right")
        if tokens.size(1) > self.lm.cfg.max_positions:
            raise AttnkitError(f"{tokens.size(1)} tokens: the LM reads at most max_positions = "
                               f"{self.lm.cfg.max_positions}")
        states, weights = self.lm.hidden_states(tokens, need_weights, padding_mask)
        logits = self.classifier(self.dropout(extract_states(states, extract)))
        attention = AttentionMaps(decoder=weights) if need_weights else None
        if targets is None:
            return ModelOutput(logits=logits, attention=attention)
        targets = targets.reshape(-1)
        if self.problem == "regression":
            task = regression_loss(logits[:, 0], targets, reduction)
            nll = task.detach()
        else:
            task = classification_loss(logits, targets, self.class_weights, reduction, label_smoothing)
            plain = self.class_weights is None and not label_smoothing
            nll = task.detach() if plain else classification_loss(logits.detach(), targets, None, reduction)
        if not self.lm_weight:
            return ModelOutput(loss=task, nll=nll, logits=logits, attention=attention)
        next_tokens = lm_targets(tokens, self.vocab_size, padding_mask)
        lm = lm_sequence_loss(self.lm.output_logits(states[:, :-1]), next_tokens)
        lm = lm.sum() if reduction == "sum" else lm.mean()
        return ModelOutput(loss=task + self.lm_weight * lm, nll=nll, logits=logits, attention=attention)


def build_gpt_classifier(cfg, vocab_size: int, labels: Sequence[str], problem: str = "classification",
                         class_weights: Sequence[float] | Tensor | None = None) -> GPTClassifier:
    """A freshly initialised GPT classifier (or regressor) of a :class:`~attnkit.config.GPTClassifierConfig` (the
    LM's sizes, dropout, lambda) over an LM vocabulary of ``vocab_size`` (the three new tokens added to it)."""
    n_labels = 1 if problem == "regression" else len(labels)
    return GPTClassifier.from_config(cfg, vocab_size, n_labels, cfg.dropout, problem, list(labels), class_weights,
                                     cfg.lm_weight)
