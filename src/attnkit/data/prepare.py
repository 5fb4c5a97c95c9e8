"""From a DataConfig to tokenized training and validation pairs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnkit.config import DataConfig
from attnkit.data.corpus import Parallel, read_multi30k, read_parallel, read_tatoeba, resolve_data_dir
from attnkit.data.dates import generate_dates
from attnkit.data.tokenizer import Tokenizer, train_tokenizer
from attnkit.errors import AttnkitError


def dates_split(cfg: DataConfig, split: str, data_dir: str | None = None) -> Parallel:
    """Generated dates: ``data.n_synthetic`` training pairs, 1000 for validation and for test, each split its seed."""
    n = {"train": cfg.n_synthetic, "valid": 1000, "test": 1000}[split]
    return generate_dates(n, seed={"train": 0, "valid": 1, "test": 2}[split])


def multi30k_split(cfg: DataConfig, split: str, data_dir: str | None = None) -> Parallel:
    prefix = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}[split]
    return read_multi30k(resolve_data_dir(data_dir or cfg.data_dir), prefix, cfg.src_lang, cfg.tgt_lang)


def parallel_split(cfg: DataConfig, split: str, data_dir: str | None = None) -> Parallel:
    files = {"train": (cfg.train_src, cfg.train_tgt), "valid": (cfg.valid_src, cfg.valid_tgt)}.get(split)
    if not files or not all(files):
        raise AttnkitError(f"data.format = 'parallel' needs data.{split}_src and data.{split}_tgt")
    return read_parallel(*files)


def load_split(cfg: DataConfig, split: str, data_dir: str | None = None) -> Parallel:
    """``split`` is "train" or "valid" (or "test" for formats that have one), read by the format's reader
    (:mod:`attnkit.registry`)."""
    from attnkit import registry

    limit = {"train": cfg.max_train_pairs, "valid": cfg.max_valid_pairs}.get(split, 0)
    pairs = registry.resolve(registry.data_format(cfg.format).reader)(cfg, split, data_dir)
    if limit:
        pairs = Parallel(pairs.src[:limit], pairs.tgt[:limit], pairs.origin)
    return pairs


def tatoeba_split(cfg: DataConfig, split: str, data_dir: str | None = None) -> Parallel:
    """Tatoeba has no official split: every 50th pair (offset 0) is validation, offset 25 test, the rest train.

    With ``data.long_test_min_words = W > 0`` a fourth split, "test_long", takes every 3rd distinct
    source sentence of at least W words out of the training pairs, with all of its translations.

    Why this serves a BLEU-by-length comparison (``bench/bleu_by_length.py``): the export is ordered
    by the English side's length in characters, shortest first, so taking every 50th pair is a
    systematic sample stratified by length — valid and test follow the corpus's length distribution
    and nothing is cut (``data.max_len`` drops long pairs from training only). No bucket is
    favoured, and every system sees the same sentences.
    But that tail is thin: of deu-eng's 169,813 pairs only 2,253 have 15 or more English words and
    297 have 20 or more, so "test" holds 44 and 5 of them — too few for a bucket's BLEU.
    "test_long" adds several hundred, held out by source sentence so that no long test sentence
    was seen in training under another translation (the pair-level valid/test split does share
    sources with train: Tatoeba often lists one sentence with several translations). Score by
    length on test + test_long: BLEU is computed within each bucket, so how the buckets were
    sampled does not bias it; only the union's overall BLEU is not comparable with test's.
    """
    other = cfg.tgt_lang if cfg.src_lang == "en" else cfg.src_lang
    code = {"de": "deu", "fr": "fra"}.get(other, other)
    path = resolve_data_dir(data_dir or cfg.data_dir) / "tatoeba" / f"{code}-eng.zip"
    pairs = read_tatoeba(path, reverse=cfg.src_lang != "en")
    if split == "test_long" and cfg.long_test_min_words <= 0:
        raise AttnkitError("split 'test_long' needs data.long_test_min_words > 0")
    held_out = _long_sources(pairs, cfg.long_test_min_words) if cfg.long_test_min_words > 0 else set()
    keep = {"valid": lambda i: i % 50 == 0, "test": lambda i: i % 50 == 25,
            "train": lambda i: i % 50 not in (0, 25) and pairs.src[i] not in held_out,
            "test_long": lambda i: i % 50 not in (0, 25) and pairs.src[i] in held_out}[split]
    idx = [i for i in range(len(pairs.src)) if keep(i)]
    return Parallel([pairs.src[i] for i in idx], [pairs.tgt[i] for i in idx], pairs.origin)


def _long_sources(pairs: Parallel, min_words: int) -> set[str]:
    """Every 3rd distinct source sentence of at least ``min_words`` words, in corpus order."""
    long = dict.fromkeys(s for i, s in enumerate(pairs.src) if i % 50 not in (0, 25) and len(s.split()) >= min_words)
    return set(list(long)[1::3])


@dataclass
class Tokenizers:
    src: Tokenizer
    tgt: Tokenizer

    @property
    def joint(self) -> bool:
        return self.src.path == self.tgt.path


def tokenizer_files(directory: Path, joint: bool) -> tuple[Path, Path]:
    if joint:
        return directory / "spm.model", directory / "spm.model"
    return directory / "spm.src.model", directory / "spm.tgt.model"


def build_tokenizers(cfg: DataConfig, train: Parallel, directory: Path) -> Tokenizers:
    """Train SentencePiece on the training pairs only, or load the ones already in ``directory``."""
    src_path, tgt_path = tokenizer_files(directory, cfg.joint_vocab)
    if not src_path.exists():
        if cfg.joint_vocab:
            train_tokenizer(train.src + train.tgt, src_path, cfg.vocab_size, cfg.spm_model_type, cfg.lowercase)
        else:
            train_tokenizer(train.src, src_path, cfg.vocab_size, cfg.spm_model_type, cfg.lowercase)
            train_tokenizer(train.tgt, tgt_path, cfg.vocab_size, cfg.spm_model_type, cfg.lowercase)
    return load_tokenizers(directory)


def load_tokenizers(directory: Path) -> Tokenizers:
    directory = Path(directory)
    for joint in (True, False):
        src_path, tgt_path = tokenizer_files(directory, joint)
        if src_path.exists() and tgt_path.exists():
            tok = Tokenizer(src_path)
            return Tokenizers(tok, tok if joint else Tokenizer(tgt_path))
    raise AttnkitError(f"{directory}: no tokenizer (spm.model, or spm.src.model and spm.tgt.model)")


@dataclass
class Encoded:
    src: list[list[int]]
    tgt: list[list[int]]
    indices: list[int]  # which pairs of the corpus were kept


def encode_pairs(toks: Tokenizers, pairs: Parallel, max_len: int = 0) -> Encoded:
    """Subword ids of each pair; with ``max_len`` pairs longer than it (either side) are dropped."""
    src, tgt = toks.src.encode(pairs.src), toks.tgt.encode(pairs.tgt)
    keep = [i for i in range(len(src)) if not max_len or (len(src[i]) <= max_len and len(tgt[i]) <= max_len)]
    return Encoded([src[i] for i in keep], [tgt[i] for i in keep], keep)
