"""Why a classifier decided: attention rollout and occlusion over its input's word pieces.

    rollout (Abnar & Zuidema 2020):  A~_l = (mean_h A_l,h + I) / 2,  rows renormalised to sum to 1
                                     R = A~_L A~_(L-1) ... A~_1          R[i, j]: how much of position j reaches i
    occlusion (Zeiler & Fergus 2014): delta_t = f(x) - f(x without piece t)
    log-odds:                        f(x) = log(p_k / (1 - p_k)) = log p_k - log sum_(j != k) p_j

For a classifier ``f`` is the log-odds of the label k predicted for the whole input; for a regressor, its score.
Log-odds, not the probability: a confident prediction's probability saturates (0.9993 moves to 0.9991 whatever is
hidden), its log-odds do not (7.3 moves to 7.1, or to 2.0 for the word it rests on), so the pieces stay comparable
across sentences and confidences. A piece is taken out by hiding it from every attention (as padding is hidden), so
nothing stands in its place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.data.wordpiece import WordPiece, collate_sentences


def log_odds(logits: Tensor, k: int) -> Tensor:
    """The log-odds of label ``k``, ``log p_k - log(1 - p_k)``, from logits [..., K] -> [...], computed from the
    log-softmax so that a probability near 1 keeps its digits (``1 - p_k`` is never formed). For two labels, the
    difference of their logits."""
    log_p = logits.float().log_softmax(-1)
    others = torch.cat([log_p[..., :k], log_p[..., k + 1:]], -1)
    return log_p[..., k] - others.logsumexp(-1)


def attention_rollout(weights: list[Tensor], padding_mask: Tensor | None = None) -> Tensor:
    """Attention rollout: the heads of each layer averaged, the residual connection added as the identity
    (``A~ = (A + I) / 2``, rows renormalised), the layers multiplied from the first up.

    weights: per layer [B, H, T, T] (queries x keys); padding_mask [B, T] (True = pad; its rows and columns stay
    0) -> R [B, T, T] (queries x input positions; each real row sums to 1).
    """
    rollout = None
    for w in weights:
        a = w.float().mean(1)  # [B, T, T]
        eye = torch.eye(a.size(-1), dtype=a.dtype, device=a.device).expand_as(a)
        if padding_mask is not None:
            real = (~padding_mask).to(a.dtype)
            eye = eye * real.unsqueeze(1) * real.unsqueeze(2)
        a = (a + eye) / 2
        a = a / a.sum(-1, keepdim=True).clamp(min=1e-12)
        rollout = a if rollout is None else a @ rollout
    return rollout


@dataclass
class Explanation:
    """One input explained. ``pieces``: its word pieces, [CLS] and [SEP] included; ``token_types`` [T];
    ``value``: the predicted label's probability (a regressor's score); ``occlusion`` [T]: how much hiding each
    piece lowers the predicted label's log-odds (a regressor's score), f(x) minus f without the piece (0 at [CLS]
    and [SEP], never taken out); ``attention``: per layer [H, T, T]; ``rollout`` [T, T]."""

    pieces: list[str]
    token_types: list[int]
    label: str
    value: float
    occlusion: list[float]
    attention: list[Tensor]
    rollout: Tensor


@torch.no_grad()
def explain(model, tokenizer: WordPiece, text: str, pair: str | None = None) -> Explanation:
    """The prediction for one input (a sentence, or a pair), every layer x head of its self-attention, the rollout
    and the occlusion of every piece (one batch of T inputs, each with one piece hidden)."""
    ids, types = tokenizer.example(text, pair)
    b = collate_sentences([(ids, types)], tokenizer.pad_id)
    out = model(b.tokens, b.padding_mask, b.token_types, need_weights=True)
    weights = [w[0].float() for w in out.attention.self_attention]
    rollout = attention_rollout([w.unsqueeze(0) for w in weights])[0]
    n = len(ids)
    hidden = torch.eye(n, dtype=torch.bool)  # row t hides piece t
    specials = torch.tensor([i in tokenizer.specials for i in ids])
    hidden[:, specials] = False
    occluded = model(b.tokens.expand(n, n), hidden, b.token_types.expand(n, n)).logits.float()
    logits = out.logits[0].float()
    if model.problem == "regression":
        value, label = float(logits[0]), model.labels[0]
        deltas = logits[0] - occluded[:, 0]
    else:
        k = int(logits.argmax())
        value, label = float(logits.softmax(-1)[k]), model.labels[k]
        deltas = log_odds(logits, k) - log_odds(occluded, k)
    deltas = torch.where(specials, torch.zeros(n), deltas)
    return Explanation(tokenizer.id_to_piece(ids), types, label, value, deltas.tolist(), weights, rollout)
