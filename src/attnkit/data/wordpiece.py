"""BERT's WordPiece tokenizer (Devlin et al. 2019; Wu et al. 2016), read from a pretrained ``vocab.txt``.

Two stages, as BERT's own code does them:
  basic:      clean control characters, space out CJK ideographs, lowercase and strip accents
              (uncased models), split on whitespace and on every punctuation character;
  wordpiece:  cut each word greedily into the longest vocabulary pieces, left to right; pieces
              after the first carry "##"; a word that cannot be cut becomes [UNK].

Unlike attnkit's own tokenizers, the ids are the pretrained vocabulary's ([PAD] 0, [UNK] 100,
[CLS] 101, [SEP] 102 in BERT's), and ``encode`` adds [CLS] ... [SEP] as BERT expects; ``sentences``
batches single sentences or pairs with their token types.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.errors import AttnkitError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_WORD_CHARS = 100  # longer "words" (URLs, base64) are [UNK] outright, as in BERT


def _is_punctuation(ch: str) -> bool:
    """Unicode punctuation, plus every non-alphanumeric printable ASCII character ("$", "^", "`", ...)."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    """CJK Unified Ideographs (not Hangul, Hiragana or Katakana, which are written with spaces)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _clean(text: str) -> str:
    out = []
    for ch in text:
        if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
            out.append(" ")
        elif ord(ch) in (0, 0xFFFD) or unicodedata.category(ch).startswith("C"):
            continue  # control and format characters
        elif _is_cjk(ord(ch)):
            out.append(f" {ch} ")
        else:
            out.append(ch)
    return "".join(out)


def basic_tokenize(text: str, lowercase: bool = True) -> list[str]:
    """-> words and punctuation marks, e.g. "Don't!" -> ["don", "'", "t", "!"] (lowercased)."""
    words = []
    for word in unicodedata.normalize("NFC", _clean(text)).split():
        if lowercase:  # uncased BERT strips accents too: "Héllo" -> "hello"
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
        current = []
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
    return words


@dataclass
class SentenceBatch:
    """BERT's inputs for a batch: tokens [B, T] (``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, then [PAD]),
    token_types [B, T] (0 sentence A, 1 sentence B, 0 at padding), padding_mask [B, T] (True = pad). T is the
    longest row of this batch."""

    tokens: Tensor
    token_types: Tensor
    padding_mask: Tensor

    def to(self, device: torch.device | str) -> SentenceBatch:
        return SentenceBatch(self.tokens.to(device), self.token_types.to(device), self.padding_mask.to(device))

    def __len__(self) -> int:
        return self.tokens.size(0)


def truncate_pair(first: list[int], second: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Hugging Face's "longest_first" cut of a pair to ``budget`` pieces (its fast tokenizer's): a shorter side
    that fits in half the budget is kept whole and the longer side (the second on a tie) takes the rest;
    otherwise the shorter side keeps half, rounded down, and the longer side the rest. Pieces are cut from the
    end."""
    if len(first) + len(second) <= budget:
        return first, second
    swap = len(first) <= len(second)
    longer, shorter = (second, first) if swap else (first, second)
    n_short = min(len(shorter), budget // 2)
    longer, shorter = longer[: budget - n_short], shorter[:n_short]
    return (shorter, longer) if swap else (longer, shorter)


def collate_sentences(examples: Sequence[tuple[list[int], list[int]]], pad_id: int = 0) -> SentenceBatch:
    """(ids, token types) examples (:meth:`WordPiece.example`) -> one :class:`SentenceBatch`, padded to its longest
    example only (dynamic padding: a batch of short sentences stays short)."""
    if not examples:
        raise AttnkitError("no sentences to batch")
    width = max(len(ids) for ids, _ in examples)
    tokens = torch.full((len(examples), width), pad_id, dtype=torch.long)
    types = torch.zeros_like(tokens)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    for row, (ids, typ) in enumerate(examples):
        tokens[row, : len(ids)] = torch.tensor(ids)
        types[row, : len(typ)] = torch.tensor(typ)
        mask[row, : len(ids)] = False
    return SentenceBatch(tokens, types, mask)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise AttnkitError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


class WordPiece:
    def __init__(self, path: str | Path, lowercase: bool = True, max_len: int = 512):
        """``path``: a ``vocab.txt``, one piece a line, the line number its id. ``max_len`` counts [CLS] and [SEP]."""
        self.path = Path(path)
        try:
            self.itos = self.path.read_text(encoding="utf-8").split("\n")
        except OSError as e:
            raise AttnkitError(f"{self.path}: cannot read the WordPiece vocabulary ({e})") from None
        if self.itos and self.itos[-1] == "":
            self.itos.pop()
        self.stoi = {p: i for i, p in enumerate(self.itos)}
        missing = [t for t in SPECIAL_TOKENS if t not in self.stoi]
        if missing:
            raise AttnkitError(f"{self.path}: not a BERT vocabulary (no {', '.join(missing)})")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = (self.stoi[t] for t in SPECIAL_TOKENS[:4])
        self.lowercase, self.max_len = lowercase, max_len
        # special tokens written in the text stay whole: "a [MASK] b"
        self._specials = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")

    @classmethod
    def from_pretrained(cls, directory: str | Path, max_len: int | None = None) -> WordPiece:
        """A Hugging Face model directory: ``vocab.txt``, with the casing of ``tokenizer_config.json`` and the
        sentence-transformers length limit of ``sentence_bert_config.json`` when present (``max_len`` when
        given)."""
        directory = Path(directory)
        tokenizer, sentence = (_read_json(directory / name) for name in ("tokenizer_config.json",
                                                                          "sentence_bert_config.json"))
        # sentence_bert_config's own do_lower_case is an extra step before this tokenizer: not ours
        max_len = max_len or sentence.get("max_seq_length") or min(tokenizer.get("model_max_length", 512), 512)
        return cls(directory / "vocab.txt", tokenizer.get("do_lower_case", True), int(max_len))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def _wordpieces(self, word: str) -> list[str]:
        if len(word) > MAX_WORD_CHARS:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:  # the longest piece in the vocabulary, from ``start``
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.stoi:
                    break
                end -= 1
            else:
                return ["[UNK]"]  # some part has no piece: the whole word is unknown
            pieces.append(piece)
            start = end
        return pieces

    def pieces(self, text: str) -> list[str]:
        """Word pieces without [CLS]/[SEP]: "unaffable" -> ["una", "##ffa", "##ble"]."""
        out = []
        for part in self._specials.split(text):
            if part in SPECIAL_TOKENS:
                out.append(part)
            else:
                out += [p for w in basic_tokenize(part, self.lowercase) for p in self._wordpieces(w)]
        return out

    @property
    def specials(self) -> frozenset[int]:
        """The ids an input holds that are not its text: [CLS] and [SEP]."""
        return frozenset((self.cls_id, self.sep_id))

    def ids(self, text: str) -> list[int]:
        """The ids of :meth:`pieces` (no [CLS]/[SEP], not cut)."""
        return [self.stoi.get(p, self.unk_id) for p in self.pieces(text)]

    def encode(self, texts: list[str]) -> list[list[int]]:
        """-> [CLS] pieces [SEP] ids per text, cut to ``max_len``."""
        return [self.example(text)[0] for text in texts]

    def example(self, first: str, second: str | None = None) -> tuple[list[int], list[int]]:
        """One input as (ids, token types): ``[CLS] a [SEP]`` with types 0, or ``[CLS] a [SEP] b [SEP]`` with
        types 0 up to the first [SEP] and 1 after it. Cut to ``max_len`` pieces in all (a pair: longest first)."""
        a = self.ids(first)
        if second is None:
            ids = [self.cls_id, *a[: self.max_len - 2], self.sep_id]
            return ids, [0] * len(ids)
        a, b = truncate_pair(a, self.ids(second), self.max_len - 3)
        return [self.cls_id, *a, self.sep_id, *b, self.sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)

    def sentences(self, first: Sequence[str], second: Sequence[str] | None = None) -> SentenceBatch:
        """Single sentences (``second`` None) or pairs (``first[i]``, ``second[i]``) -> one padded batch."""
        if second is not None and len(second) != len(first):
            raise AttnkitError(f"{len(first)} first sentences but {len(second)} second sentences")
        pairs = [None] * len(first) if second is None else second
        return collate_sentences([self.example(a, b) for a, b in zip(first, pairs)], self.pad_id)

    def batch(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """-> ids [B, S] padded with [PAD], and the padding mask [B, S] (True = pad)."""
        b = self.sentences(texts)
        return b.tokens, b.padding_mask

    def id_to_piece(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def decode(self, ids: list[int]) -> str:
        """Pieces joined back into words ("##" pieces glued on); special tokens dropped."""
        skip = {self.pad_id, self.cls_id, self.sep_id}
        return " ".join(self.itos[int(i)] for i in ids if int(i) not in skip).replace(" ##", "")
