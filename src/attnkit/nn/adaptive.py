"""Adaptive input embeddings (Baevski & Auli 2019), tied to an adaptive softmax (Grave et al. 2017).

A word vocabulary's embedding is most of a small language model's parameters, and the rare words'
rows hardly ever learn anything. Adaptive inputs split the vocabulary into the adaptive softmax's
clusters (ids most frequent first): the frequent words get d_model-wide embeddings, each rarer cluster
a narrower one (d_model / div_value^(i+1)) projected up to d_model. Tied to the softmax, the input
and the output share every weight: the head's rows embed the frequent words, a tail's output matrix
embeds its words and the tail's own projection (transposed) brings them up to d_model, as the paper's
"tied adaptive input and output with shared projections".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AdaptiveInput(nn.Module):
    """Token ids [...] -> embeddings [..., d_model], sharing ``softmax``'s parameters.

    The padding id's embedding is zero and gets no gradient, as ``nn.Embedding(padding_idx=...)``.
    Building one re-initialises the shared weights for their double use: embedding rows N(0, 1/width)
    (unit variance once scaled by sqrt(d_model), like attnkit's other token embeddings) and Xavier
    projections, which also keep the softmax's logits near unit scale.
    """

    def __init__(self, softmax: nn.AdaptiveLogSoftmaxWithLoss, padding_idx: int | None = None):
        super().__init__()
        self.cutoffs = list(softmax.cutoffs)  # [c_0, ..., c_k, vocab_size]
        self.padding_idx = padding_idx
        # the same Parameter objects, registered here too: checkpoints store each once (safetensors
        # save_model deduplicates shared tensors) and the optimiser sees each once
        self.head = softmax.head.weight  # [c_0 + n_clusters, d_model]; rows below c_0 are words
        self.projections = nn.ParameterList(tail[0].weight for tail in softmax.tail)  # [width_i, d_model]
        self.embeddings = nn.ParameterList(tail[1].weight for tail in softmax.tail)  # [cluster_i size, width_i]
        with torch.no_grad():
            nn.init.normal_(self.head, std=self.head.size(1) ** -0.5)
            for projection, embedding in zip(self.projections, self.embeddings):
                nn.init.xavier_uniform_(projection)
                nn.init.normal_(embedding, std=embedding.size(1) ** -0.5)

    @property
    def embedding_dim(self) -> int:
        return self.head.size(1)

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape(-1)
        out = self.head.new_zeros(flat.numel(), self.embedding_dim)
        in_head = (flat < self.cutoffs[0]).nonzero().squeeze(1)
        out = out.index_copy(0, in_head, F.embedding(flat[in_head], self.head))
        for i, (projection, embedding) in enumerate(zip(self.projections, self.embeddings)):
            lo, hi = self.cutoffs[i], self.cutoffs[i + 1]
            rows = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            out = out.index_copy(0, rows, F.embedding(flat[rows] - lo, embedding) @ projection)
        if self.padding_idx is not None:
            out = out.masked_fill((flat == self.padding_idx)[:, None], 0.0)
        return out.view(*ids.shape, self.embedding_dim)
