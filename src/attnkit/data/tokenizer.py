"""SentencePiece subword models (Kudo & Richardson 2018): train and load, joint or separate.

Ids 0-3 are fixed for every tokenizer: PAD, UNK, BOS, EOS.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from attnkit.errors import AttnkitError
from attnkit.tokens import BOS, EOS, PAD, UNK


class Tokenizer:
    """A SentencePiece model: text <-> ids, without BOS/EOS (the batcher adds those)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError) as e:
            raise AttnkitError(f"{self.path}: not a readable SentencePiece model ({e})") from None
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (PAD, UNK, BOS, EOS):
            raise AttnkitError(f"{self.path}: special ids must be pad=0 unk=1 bos=2 eos=3")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode(texts)

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(text, out_type=str)

    def id_to_piece(self, ids: Iterable[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([int(i) for i in ids if i > EOS])


def train_tokenizer(texts: Iterable[str], path: str | Path, vocab_size: int, model_type: str = "unigram",
                    lowercase: bool = False) -> Tokenizer:
    """Train a SentencePiece model on ``texts`` and write it to ``path`` (a ``.model`` file). With ``lowercase`` its
    normalisation folds case (``nmt_nfkc_cf``), kept in the model: every text it encodes is lowercased first, so
    what a model trained on its pieces writes is lowercased too."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size, model_type=model_type,
            normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
            pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS, character_coverage=1.0,
            hard_vocab_limit=False,  # a small corpus may hold fewer pieces than asked for
            input_sentence_size=2_000_000, shuffle_input_sentence=True, num_threads=2, minloglevel=2,
        )
    except RuntimeError as e:  # e.g. a vocabulary smaller than the corpus's character set
        detail = str(e).split("] ")[-1].strip()
        raise AttnkitError(f"{path}: cannot train SentencePiece (vocab_size={vocab_size}): {detail}") from None
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)
    return Tokenizer(path)
