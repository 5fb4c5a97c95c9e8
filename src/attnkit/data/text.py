"""Language-model text: a character tokenizer, Tiny Shakespeare and WikiText-2, contiguous blocks.

A language-model corpus is one stream of token ids. Training cuts it into contiguous
blocks of ``block_size`` tokens; a block is one example, predicted from BOS plus the
block shifted right, so every token of the stream is a target exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from attnkit.data.batching import Batch
from attnkit.data.corpus import read_lines, resolve_data_dir
from attnkit.data.tokenizer import BOS, EOS, PAD, UNK
from attnkit.data.vocab import SPECIALS
from attnkit.errors import AttnkitError

UNK_CHAR = "\u2047"  # how an unknown character decodes ("⁇", as SentencePiece shows its <unk>)


class CharTokenizer:
    """One id per character of the training text, after the four special ids (PAD, UNK, BOS, EOS).

    The same methods as :class:`attnkit.data.Tokenizer`; saved as JSON (characters include
    newlines and spaces, which a one-per-line file could not hold).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            chars = json.loads(self.path.read_text(encoding="utf-8"))["chars"]
        except OSError as e:
            raise AttnkitError(f"{self.path}: cannot read the character vocabulary ({e})") from None
        except (json.JSONDecodeError, KeyError, TypeError):
            raise AttnkitError(f"{self.path}: not a character vocabulary (JSON with a \"chars\" list)") from None
        self.itos = SPECIALS + chars
        self.stoi = {c: i for i, c in enumerate(chars, len(SPECIALS))}

    @classmethod
    def build(cls, text: str, path: str | Path) -> CharTokenizer:
        """The characters of ``text`` in code-point order; written atomically to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"chars": sorted(set(text))}, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)
        return cls(path)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[self.stoi.get(c, UNK) for c in t] for t in texts]

    def pieces(self, text: str) -> list[str]:
        return [c if c in self.stoi else SPECIALS[UNK] for c in text]

    def id_to_piece(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return "".join(UNK_CHAR if int(i) == UNK else self.itos[int(i)] for i in ids if int(i) > EOS or int(i) == UNK)


# --- corpora


def read_tinyshakespeare(data_dir: str | Path | None, split: str) -> str:
    """``tinyshakespeare/input.txt``: the first 90% of its characters are "train", the last 10% "valid"."""
    path = resolve_data_dir(data_dir) / "tinyshakespeare" / "input.txt"
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise AttnkitError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise AttnkitError(f"{path}: invalid UTF-8 at byte {e.start}") from None
    if split not in ("train", "valid"):
        raise AttnkitError(f"tinyshakespeare has splits train and valid, not {split!r}")
    if not text:
        raise AttnkitError(f"{path}: an empty file, with no text to train or validate on")
    cut = int(len(text) * 0.9)
    return text[:cut] if split == "train" else text[cut:]


def read_wikitext2(data_dir: str | Path | None, split: str) -> list[str]:
    """``wikitext-2/{train,valid}.txt`` (already tokenized): each line with ``<eos>`` appended, as the
    literature counts it (blank lines too), so perplexities compare with published ones."""
    path = resolve_data_dir(data_dir) / "wikitext-2" / f"{split}.txt"
    lines = read_lines(path)
    if not lines:
        raise AttnkitError(f"{path}: an empty file, with no text to {'train' if split == 'train' else 'validate'} on")
    return [f"{line} <eos>" for line in lines]


# --- the stream as blocks


def stream_blocks(stream: Tensor, block_size: int) -> Tensor:
    """A stream of ids [N] cut into contiguous blocks [ceil(N / block_size), block_size]; the last is PAD-padded."""
    n_blocks = -(-stream.numel() // block_size)
    blocks = torch.full((n_blocks * block_size,), PAD, dtype=torch.long)
    blocks[: stream.numel()] = stream
    return blocks.view(n_blocks, block_size)


def block_batch(blocks: Tensor, indices: list[int]) -> Batch:
    """Blocks [N, T] as a teacher-forcing batch: tgt_out the blocks, tgt_in BOS + each block but its last token.

    A language model has no source: ``src`` is empty [B, 0].
    """
    out = blocks[indices]
    tgt_in = torch.cat([torch.full((out.size(0), 1), BOS, dtype=torch.long), out[:, :-1]], dim=1)
    return Batch(src=out.new_zeros(out.size(0), 0), tgt_in=tgt_in, tgt_out=out, indices=list(indices))


def shifted_blocks(stream: Tensor, indices: list[int], block_size: int, offset: int) -> Tensor:
    """Blocks ``indices`` of the stream cut ``offset`` tokens later than ``stream_blocks`` cuts it: [B, block_size].

    Training with a fresh offset per batch shows each epoch other windows of the text (nanoGPT samples
    random windows for the same reason); the tail past the stream's end is PAD.
    """
    starts = offset + torch.tensor(indices, dtype=torch.long) * block_size
    padded = torch.cat([stream, torch.full((block_size + offset,), PAD, dtype=torch.long)])
    return padded[starts[:, None] + torch.arange(block_size)]
