"""Vocabulary maps: for each source token, the target tokens that may translate it, so that decoding a batch scores
only the union of its tokens' candidates (:mod:`attnkit.fast.shortlist`).

The file is CTranslate2's vocabulary map (``vmap.txt``), one rule a line, pieces separated by spaces::

    <source n-gram> TAB <target piece> <target piece> ...

A line whose n-gram is empty lists the target pieces that are always candidates. The same file serves attnkit
(``attnkit translate --shortlist``) and a CTranslate2 export (``use_vmap``).

:func:`build_vocabulary_map` makes one from a parallel corpus: the most frequent target tokens, and for each source
token its most likely translations under IBM Model 1 (Brown et al. 1993), whose lexical table p(t | s) is fitted by
expectation-maximisation:

    E-step:  c(t, s) = sum over sentence pairs, over t_j = t and s_i = s, of  p(t | s) / sum_{i'} p(t | s_i')
    M-step:  p(t | s) = c(t, s) / sum_t' c(t', s)

every source sentence with an empty token (NULL) that target tokens with no counterpart align to.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.data.tokenizer import Tokenizer
from attnkit.errors import AttnkitError
from attnkit.tokens import BOS, EOS, PAD, UNK

SPECIAL = (PAD, UNK, BOS, EOS)
# a shortlist's length is padded to a multiple of this (with the lowest ids not yet in it): matrix kernels run whole
# vector widths, and the graphs of a search see fewer distinct lengths
MULTIPLE = 8


class VocabularyMap:
    """``rules``: source n-gram (a tuple of ids) -> its candidate target ids; ``always``: the target ids that are
    candidates for every batch."""

    def __init__(self, rules: dict[tuple[int, ...], np.ndarray], always: np.ndarray, target_size: int):
        self.target_size = target_size
        self.rules = {gram: ids[ids < target_size] for gram, ids in rules.items()}
        self.always = np.asarray(always, dtype=np.int64)
        self.always = self.always[self.always < target_size]
        self.longest = max((len(k) for k in rules), default=1)
        # the rules of single tokens as one array: source token s's candidates are targets[starts[s]:starts[s + 1]]
        # (a batch's are gathered at once: a dictionary lookup a token took most of a sentence's shortlist)
        single = {gram[0]: ids for gram, ids in self.rules.items() if len(gram) == 1}
        counts = np.zeros(max(single, default=-1) + 1, dtype=np.int64)
        for source, ids in single.items():
            counts[source] = len(ids)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._targets = np.concatenate([single[s] for s in sorted(single)] or [np.zeros(0, dtype=np.int64)])
        self._fixed = np.zeros(target_size, dtype=bool)  # the special tokens and the always-candidates
        self._fixed[[i for i in SPECIAL if i < target_size]] = True
        self._fixed[self.always] = True

    def candidates(self, sources: list[list[int]]) -> Tensor:
        """The shortlist of a batch of source sentences (token ids): [K] target ids, sorted, the special tokens
        first, K a multiple of :data:`MULTIPLE` (or the whole vocabulary, if smaller)."""
        chosen = self._fixed.copy()
        tokens = np.unique(np.fromiter(itertools.chain.from_iterable(sources), dtype=np.int64))
        tokens = tokens[(tokens >= 0) & (tokens < len(self._starts) - 1)]
        starts, counts = self._starts[tokens], self._starts[tokens + 1] - self._starts[tokens]
        # the positions starts[j] .. starts[j] + counts[j] - 1 of every token j, in one array
        chosen[self._targets[np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())]] = True
        for source in sources if self.longest > 1 else ():
            for n in range(2, self.longest + 1):
                for i in range(len(source) - n + 1):
                    ids = self.rules.get(tuple(source[i:i + n]))
                    if ids is not None:
                        chosen[ids] = True
        missing = -int(chosen.sum()) % MULTIPLE
        if missing:  # the lowest ids not in it (fewer where that is the whole vocabulary)
            chosen[np.flatnonzero(~chosen)[:missing]] = True
        return torch.from_numpy(np.flatnonzero(chosen))

    @classmethod
    def read(cls, path: str | Path, source: Tokenizer, target: Tokenizer) -> VocabularyMap:
        """Read a vocabulary map written with these tokenizers' pieces. A rule whose n-gram holds a piece the source
        tokenizer lacks can never apply and is left out; a target piece the target tokenizer lacks is an error."""
        path = Path(path)
        rules: dict[tuple[int, ...], np.ndarray] = {}
        always = np.zeros(0, dtype=np.int64)
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                if "\t" not in line:
                    raise AttnkitError(f"{path}:{number}: expected '<source n-gram> TAB <target pieces>'")
                key, values = line.split("\t", 1)
                ids = []
                for piece in values.split():
                    i = target.sp.piece_to_id(piece)
                    if i == UNK and piece != target.sp.id_to_piece(UNK):
                        raise AttnkitError(f"{path}:{number}: {piece!r} is not a piece of the target vocabulary")
                    ids.append(i)
                ids = np.unique(np.asarray(ids, dtype=np.int64))
                if not key:
                    always = np.union1d(always, ids)
                    continue
                gram = tuple(source.sp.piece_to_id(p) for p in key.split(" "))
                if all(i != UNK or p == source.sp.id_to_piece(UNK) for i, p in zip(gram, key.split(" "))):
                    rules[gram] = ids
        return cls(rules, always, target.vocab_size)

    def write(self, path: str | Path, source: Tokenizer, target: Tokenizer) -> None:
        """Write the map in CTranslate2's format (the always-candidates first), whole or not at all."""
        path = Path(path)
        lines = ["\t" + " ".join(target.id_to_piece(self.always))]
        lines += [" ".join(source.id_to_piece(gram)) + "\t" + " ".join(target.id_to_piece(ids))
                  for gram, ids in sorted(self.rules.items())]
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        partial.replace(path)


def ibm1(sources: list[list[int]], targets: list[list[int]], source_size: int, target_size: int,
         iterations: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IBM Model 1's lexical table p(t | s) fitted on these sentence pairs (token ids), as the pairs that
    co-occur: (source ids [P], target ids [P], p [P]); source id ``source_size`` is NULL."""
    null = source_size
    pair_codes, positions, offset = [], [], 0
    for s, t in zip(sources, targets):
        if not t:
            continue
        s = np.asarray([*s, null], dtype=np.int64)
        t = np.asarray(t, dtype=np.int64)
        pair_codes.append((s[None, :] * target_size + t[:, None]).ravel())  # [|t| * |s|], target-major
        positions.append(np.repeat(np.arange(offset, offset + len(t)), len(s)))
        offset += len(t)
    if not pair_codes:
        raise AttnkitError("a vocabulary map needs at least one sentence pair with a target")
    codes, cell_position = np.concatenate(pair_codes), np.concatenate(positions)
    pairs, cell_pair = np.unique(codes, return_inverse=True)
    pair_source, pair_target = pairs // target_size, pairs % target_size
    table = np.ones(len(pairs))  # uniform p(t | s) over the targets each s co-occurs with, up to a constant
    for _ in range(iterations):
        p = table[cell_pair]
        posterior = p / np.bincount(cell_position, p, minlength=offset)[cell_position]
        counts = np.bincount(cell_pair, posterior, minlength=len(pairs))
        table = counts / np.bincount(pair_source, counts, minlength=source_size + 1)[pair_source]
    return pair_source, pair_target, table


def build_vocabulary_map(sources: list[list[int]], targets: list[list[int]], source_size: int, target_size: int,
                         per_source: int = 20, frequent: int = 100, iterations: int = 5) -> VocabularyMap:
    """A vocabulary map from a parallel corpus: for each source token its ``per_source`` most likely translations
    under IBM Model 1 (:func:`ibm1`), and always the ``frequent`` most frequent target tokens with NULL's
    ``per_source`` most likely ones (the words that translate nothing in particular)."""
    pair_source, pair_target, p = ibm1(sources, targets, source_size, target_size, iterations)
    order = np.lexsort((-p, pair_source))  # by source, most likely first
    pair_source, pair_target = pair_source[order], pair_target[order]
    starts = np.flatnonzero(np.r_[True, pair_source[1:] != pair_source[:-1]])
    ranked = {int(pair_source[start]): pair_target[start:end] for start, end in zip(starts, [*starts[1:], len(order)])}
    counts = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for t in targets]), minlength=target_size)
    counts[list(SPECIAL)] = 0
    most_frequent = np.argsort(-counts, kind="stable")[:frequent]
    always = np.union1d(most_frequent[counts[most_frequent] > 0], ranked.pop(source_size, [])[:per_source])
    # each source token's places go to translations not already always there (IBM Model 1 ranks frequent target
    # words high for every source word)
    rules = {(s,): np.sort(targets_of[~np.isin(targets_of, always)][:per_source]) for s, targets_of in ranked.items()}
    return VocabularyMap(rules, always, target_size)


__all__ = ["MULTIPLE", "VocabularyMap", "build_vocabulary_map", "ibm1"]
