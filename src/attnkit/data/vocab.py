"""A whole-word vocabulary, as captioning papers use: lowercased words, rare ones mapped to <unk>.

With ``pretokenized`` it reads text that a corpus has tokenized already (WikiText): the
whitespace-separated tokens are the words, kept as they are (case, punctuation, ``<unk>``).

It offers the same methods as the SentencePiece :class:`attnkit.data.Tokenizer`, so decoding
and checkpoints treat both alike.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Iterable

from attnkit.data.tokenizer import EOS, UNK
from attnkit.errors import AttnkitError

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]  # ids 0-3, as in every attnkit tokenizer
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lowercased alphanumeric words; punctuation dropped (Karpathy's caption preprocessing)."""
    return _WORD.findall(text.lower())


def _splitter(pretokenized: bool):
    return str.split if pretokenized else words


class WordVocab:
    def __init__(self, path: str | Path, pretokenized: bool = False):
        self.path = Path(path)
        self.words = _splitter(pretokenized)
        try:
            self.itos = self.path.read_text(encoding="utf-8").split("\n")
        except OSError as e:
            raise AttnkitError(f"{self.path}: cannot read vocabulary ({e})") from None
        if self.itos and self.itos[-1] == "":
            self.itos.pop()
        if self.itos[:4] != SPECIALS:
            raise AttnkitError(f"{self.path}:1: a vocabulary starts with {' '.join(SPECIALS)}, one a line")
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(cls, texts: Iterable[str], path: str | Path, min_count: int = 5, pretokenized: bool = False) -> WordVocab:
        """Words seen at least ``min_count`` times, most frequent first; written atomically to ``path``."""
        split = _splitter(pretokenized)
        counts = Counter(w for t in texts for w in split(t))
        # a corpus's own "<unk>" is our UNK, not a second entry
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(SPECIALS + kept) + "\n", encoding="utf-8")
        tmp.replace(path)
        return cls(path, pretokenized)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[self.stoi.get(w, UNK) for w in self.words(t)] for t in texts]

    def pieces(self, text: str) -> list[str]:
        return [w if w in self.stoi else SPECIALS[UNK] for w in self.words(text)]

    def id_to_piece(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.itos[int(i)] for i in ids if int(i) > EOS or int(i) == UNK)
