"""Alignments: where each output word looked in the source (Bahdanau et al., figure 3).

RNNsearch has one attention, alpha [T, S], recorded while searching. A Transformer has one
cross-attention per decoder layer and head: the chosen translation is run once more, teacher-forced,
to read them all (the cached step only returns their average).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decode.translate import translate
from attnkit.errors import AttnkitError
from attnkit.tokens import BOS, EOS


@dataclass
class Alignment:
    source: list[str]  # subword pieces, then </s>
    target: list[str]  # the translation's pieces, then </s>
    weights: Tensor  # [len(target), len(source)]: row i is where output i looked
    translation: str
    description: str  # which attention this is


@torch.no_grad()
def align(model, toks, sentence: str, beam_size: int = 5, len_penalty: float = 1.0, max_len_a: float = 1.2,
          max_len_b: int = 10, layer: int | None = None, head: int | None = None) -> Alignment:
    """Translate ``sentence`` (beam search, or greedy with ``beam_size`` 1) and return its attention matrix: the
    cross-attention of the model's teacher-forced pass over its own translation.

    ``layer`` and ``head`` count from 1; without ``layer`` the average over all layers and heads, without
    ``head`` the average over the layer's heads (RNNsearch has one layer of one head: its alignment).
    """
    model.require("align")
    if head is not None and layer is None:
        raise AttnkitError("--head needs --layer")
    [t] = translate(model, toks, [sentence], beam_size=beam_size, len_penalty=len_penalty, max_len_a=max_len_a,
                    max_len_b=max_len_b)
    hyp = t.hypotheses[0]
    source = toks.src.pieces(sentence) + ["</s>"]
    target = toks.tgt.id_to_piece(hyp.tokens) + ["</s>"]
    src = torch.tensor([toks.src.encode([sentence])[0] + [EOS]])
    cross = model(src, torch.tensor([[BOS] + hyp.tokens]), need_weights=True).attention.cross
    weights = torch.stack([w[0] for w in cross])  # [layers, heads, T, S]
    n_layers, n_heads = weights.shape[:2]
    if n_layers == n_heads == 1:
        if layer not in (None, 1) or head not in (None, 1):
            raise AttnkitError(f"--layer and --head choose among a Transformer's cross-attentions; a {model.family} "
                               "model has a single attention")
        return Alignment(source, target, weights[0, 0], t.text[0], "alpha: attention weights")
    if layer is None:
        return Alignment(source, target, weights.mean((0, 1)), t.text[0],
                         f"cross-attention, mean of {n_layers} layers x {n_heads} heads")
    if not 1 <= layer <= n_layers or (head is not None and not 1 <= head <= n_heads):
        raise AttnkitError(f"this model has decoder layers 1..{n_layers} and heads 1..{n_heads}; "
                           f"got layer {layer}" + ("" if head is None else f", head {head}"))
    if head is None:
        return Alignment(source, target, weights[layer - 1].mean(0), t.text[0],
                         f"cross-attention of layer {layer}, mean of {n_heads} heads")
    return Alignment(source, target, weights[layer - 1, head - 1], t.text[0],
                     f"cross-attention of layer {layer}, head {head}")
