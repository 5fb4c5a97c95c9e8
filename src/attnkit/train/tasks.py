"""What the training loop trains on. A task owns the data, its batching and its task-specific scores.

The Trainer only needs, from a task: ``build_model()``, ``lengths(split)`` for bucketing,
``batch(split, indices)`` -> :class:`attnkit.data.Batch`, ``scores(model)`` for validation beyond the loss
(BLEU, ...), and ``files`` to copy into every checkpoint (tokenizers, vocabularies). The loss is the model's
(``model(batch.src, batch.tgt_in, targets=batch.tgt_out).loss``), the same call for every family.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from attnkit.checkpoint import lm_tokenizer_file, load_tokenizers, model_for
from attnkit.config import LM_FORMATS, ExperimentConfig
from attnkit.data import (
    EOS,
    Batch,
    CharTokenizer,
    Parallel,
    Tokenizer,
    WordVocab,
    block_batch,
    build_tokenizers,
    collate,
    encode_pairs,
    load_split,
    read_tinyshakespeare,
    read_wikitext2,
    shifted_blocks,
    stream_blocks,
    train_tokenizer,
    words,
)
from attnkit.decode import translate
from attnkit.errors import AttnkitError
from attnkit.evaluate import bleu, language_model_scores
from attnkit.models import build_model
from attnkit.train import distributed


class TranslationTask:
    """Sentence pairs: SentencePiece subwords trained on the training side, BLEU on validation."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None,
                 train_pairs: Parallel | None = None, valid_pairs: Parallel | None = None, world: int = 1,
                 rank: int = 0):
        self.cfg = cfg
        train_pairs = train_pairs or load_split(cfg.data, "train", data_dir)
        self.valid_pairs = valid_pairs or load_split(cfg.data, "valid", data_dir)
        if not train_pairs.src or not self.valid_pairs.src:
            raise AttnkitError(f"empty training or validation data ({train_pairs.origin or cfg.data.format})")
        if rank == 0:  # one rank trains the tokenizer; the others load it
            build_tokenizers(cfg.data, train_pairs, run_dir)
        distributed.barrier(world)
        self.toks = build_tokenizers(cfg.data, train_pairs, run_dir)
        self.data = {"train": encode_pairs(self.toks, train_pairs, cfg.data.max_len),
                     "valid": encode_pairs(self.toks, self.valid_pairs)}

    @property
    def files(self) -> list[Path]:
        return sorted({self.toks.src.path, self.toks.tgt.path})


    def build_model(self):
        return build_model(self.cfg.model, self.toks.src.vocab_size, self.toks.tgt.vocab_size)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        d = self.data[split]
        return [len(s) for s in d.src], [len(t) for t in d.tgt]

    def batch(self, split: str, indices: list[int]) -> Batch:
        d = self.data[split]
        return collate([d.src[i] for i in indices], [d.tgt[i] for i in indices], indices)

    def scores(self, model) -> dict:
        t, d = self.cfg.train, self.cfg.decode
        if not t.eval_bleu:
            return {}
        out = translate(model, self.toks, self.valid_pairs.src, beam_size=t.eval_beam, len_penalty=d.len_penalty,
                        max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        return {"valid_bleu": bleu([x.text[0] for x in out], self.valid_pairs.tgt).score}


def load_grids(cfg: ExperimentConfig, images: list[Path], rank: int = 0, world: int = 1):
    """[N, L, C] float16 CNN grids of these images, extracted into the feature cache on first use (by rank 0)."""
    from attnkit.data import extract_features
    from attnkit.nn.vision import load_pretrained

    cache = None
    for turn in range(2):  # rank 0 extracts; the others then find everything cached
        if (rank == 0) == (turn == 0):
            cache = extract_features(load_pretrained(cfg.data.image_grid), images, cfg.data.feature_cache,
                                     progress=rank == 0)
        distributed.barrier(world)
    grids = cache.load([p.name for p in images])  # [N, C, h, w]
    return grids.flatten(2).transpose(1, 2).contiguous()


class CaptionTask:
    """Flickr8k: each training example is (image, one of its captions); the source is the image's CNN grid.

    The grids are extracted once into ``data.feature_cache`` and held in memory as float16.
    Validation adds caption BLEU-1..4 of beam-searched captions against all references.
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None, world: int = 1,
                 rank: int = 0):
        from attnkit.data import WordVocab, read_flickr8k

        self.cfg = cfg
        self.splits = {}
        for split, name, limit in (("train", "train", cfg.data.max_train_pairs),
                                   ("valid", "dev", cfg.data.max_valid_pairs)):
            c = read_flickr8k(data_dir or cfg.data.data_dir or None, name)
            if limit:  # a slice of the images, for quick runs
                c = type(c)(c.images[:limit], c.captions[:limit], c.origin)
            self.splits[split] = c
        vocab_path = Path(run_dir) / "vocab.txt"
        if rank == 0 and not vocab_path.exists():  # built from training captions only
            WordVocab.build([c for caps in self.splits["train"].captions for c in caps], vocab_path,
                            cfg.data.min_word_count)
        distributed.barrier(world)
        self.vocab = WordVocab(vocab_path)
        self.grids = {split: load_grids(cfg, c.images, rank, world) for split, c in self.splits.items()}
        self.examples = {}  # split -> (image index per example, caption ids per example)
        for split, c in self.splits.items():
            image, ids = [], []
            for i, caps in enumerate(c.captions):
                for tokens in self.vocab.encode(caps):
                    image.append(i)
                    ids.append(tokens[: cfg.decode.max_caption_len])
            self.examples[split] = (image, ids)

    @property
    def files(self) -> list[Path]:
        return [self.vocab.path]


    @property
    def n_cells(self) -> int:
        return self.grids["train"].size(1)

    def build_model(self):
        return build_model(self.cfg.model, self.n_cells, self.vocab.vocab_size)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        _, ids = self.examples[split]
        return [0] * len(ids), [len(t) for t in ids]  # the grid has a fixed size: bucket by caption length

    def batch(self, split: str, indices: list[int]) -> Batch:
        image, ids = self.examples[split]
        b = collate([[] for _ in indices], [ids[i] for i in indices], indices)
        b.src = self.grids[split][[image[i] for i in indices]].float()
        return b

    def scores(self, model) -> dict:
        from attnkit.decode import caption
        from attnkit.evaluate import caption_bleu

        if not self.cfg.train.eval_bleu:
            return {}
        d = self.cfg.decode
        out = caption(model, self.vocab, self.grids["valid"], beam_size=self.cfg.train.eval_beam,
                      len_penalty=d.len_penalty, max_len=d.max_caption_len)
        refs = [[" ".join(words(c)) for c in caps] for caps in self.splits["valid"].captions]
        scores = caption_bleu([c.text[0] for c in out], refs)
        return {f"valid_{k}": v for k, v in scores.items()} | {"valid_bleu": scores["bleu4"]}


class LanguageModelTask:
    """One stream of text cut into contiguous blocks of ``data.block_size`` tokens: Tiny Shakespeare by
    character, WikiText-2 by the corpus's own words (``<eos>`` ending each line). Each block is one example.

    With ``data.lm_tokenizer = "spm"`` both are cut into SentencePiece subwords instead, one line at a
    time with EOS for the line break, from ``data.spm_model`` if given: one model shared by two corpora
    lets a model pretrained on one be fine-tuned on the other (``train.init_from``).

    The tokenizer is built from the training text only. The trainer reports validation loss and
    perplexity; character models add bits per character.
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None, world: int = 1,
                 rank: int = 0, texts: dict[str, list[str]] | None = None):
        """``texts`` (tests): {"train": [...], "valid": [...]} instead of the corpus files; each item is
        one stretch of text (Tiny Shakespeare: the whole split; WikiText-2: one line with its ``<eos>``)."""
        self.cfg = cfg
        texts = texts or {split: self.read(cfg, split, data_dir) for split in ("train", "valid")}
        if not any(texts["train"]) or not any(texts["valid"]):
            raise AttnkitError(f"empty training or validation text ({cfg.data.format})")
        path = Path(run_dir) / self.tokenizer_file(cfg)
        if rank == 0 and not path.exists():  # one rank builds the tokenizer; a resumed run keeps its own
            self.build_tokenizer(cfg, texts["train"], path)
        distributed.barrier(world)
        self.tokenizer = self.load_tokenizer(cfg, Path(run_dir))
        self.blocks, self.streams = {}, {}
        for split, limit in (("train", cfg.data.max_train_pairs), ("valid", cfg.data.max_valid_pairs)):
            stream = torch.tensor(self.encode(cfg, self.tokenizer, texts[split]), dtype=torch.long)
            blocks = stream_blocks(stream, cfg.data.block_size)
            self.blocks[split] = blocks[:limit] if limit else blocks
            self.streams[split] = stream[: self.blocks[split].numel()]

    @staticmethod
    def read(cfg: ExperimentConfig, split: str, data_dir: str | None = None) -> list[str]:
        data_dir = data_dir or cfg.data.data_dir or None
        if cfg.data.format == "tinyshakespeare":
            return [read_tinyshakespeare(data_dir, split)]
        return read_wikitext2(data_dir, split)

    @staticmethod
    def lines(cfg: ExperimentConfig, texts: list[str]) -> list[str]:
        """For SentencePiece: the text line by line, without WikiText's written ``<eos>`` (EOS takes its place)."""
        if cfg.data.format == "tinyshakespeare":
            return [line for text in texts for line in text.split("\n")]
        return [line.removesuffix("<eos>").rstrip() for line in texts]

    @staticmethod
    def encode(cfg: ExperimentConfig, tokenizer, texts: list[str]) -> list[int]:
        """The whole split as one stream of ids."""
        if cfg.data.lm_tokenizer == "spm":
            return [i for ids in tokenizer.encode(LanguageModelTask.lines(cfg, texts)) for i in (*ids, EOS)]
        return [i for ids in tokenizer.encode(texts) for i in ids]

    @staticmethod
    def tokenizer_file(cfg: ExperimentConfig) -> str:
        return lm_tokenizer_file(cfg)

    @staticmethod
    def build_tokenizer(cfg: ExperimentConfig, train: list[str], path: Path):
        if cfg.data.lm_tokenizer == "spm":
            if cfg.data.spm_model:  # a copy in the run dir: the run stays self-contained
                source = Path(cfg.data.spm_model)
                if not source.is_file():
                    raise AttnkitError(f"data.spm_model = {cfg.data.spm_model!r}: no such file")
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, path)
                return Tokenizer(path)
            return train_tokenizer(LanguageModelTask.lines(cfg, train), path, cfg.data.vocab_size,
                                   cfg.data.spm_model_type)
        if cfg.data.format == "tinyshakespeare":
            return CharTokenizer.build("".join(train), path)
        return WordVocab.build(train, path, min_count=1, pretokenized=True)  # WikiText has its own <unk>s

    @staticmethod
    def load_tokenizer(cfg: ExperimentConfig, directory: Path):
        return load_tokenizers(cfg, directory)

    @property
    def files(self) -> list[Path]:
        return [self.tokenizer.path]


    def build_model(self):
        return build_model(self.cfg.model, 0, self.tokenizer.vocab_size)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        # token_batches counts one more for BOS/EOS; a block's BOS takes the place of its last input token
        n = self.blocks[split].size(0)
        return [0] * n, [self.cfg.data.block_size - 1] * n

    def batch(self, split: str, indices: list[int]) -> Batch:
        if split != "train":
            return block_batch(self.blocks[split], indices)
        # each training batch cuts the stream at its own offset, a function of its indices only (the same on
        # every rank and after a resume); batches are composed afresh each epoch, so the windows change too
        offset = hash(tuple(indices)) % self.cfg.data.block_size  # ints hash alike in every process
        blocks = shifted_blocks(self.streams["train"], indices, self.cfg.data.block_size, offset)
        b = block_batch(blocks, list(range(len(indices))))
        return Batch(b.src, b.tgt_in, b.tgt_out, list(indices))

    def scores(self, model) -> dict:
        if self.cfg.data.format != "tinyshakespeare" or self.cfg.data.lm_tokenizer != "corpus":
            return {}  # the trainer's valid_loss and valid_ppl say it all
        batch_blocks = max(1, self.cfg.train.max_tokens // self.cfg.data.block_size)
        return {"valid_bpc": language_model_scores(model, self.blocks["valid"], batch_blocks, characters=True)["bpc"]}


def restore(cfg: ExperimentConfig, directory: Path):
    """-> (model, tokenizers) from a checkpoint directory's files (the weights are loaded by the caller)."""
    toks = load_tokenizers(cfg, directory)
    return model_for(cfg, toks), toks


def task_class(cfg: ExperimentConfig):
    if cfg.data.format in LM_FORMATS:
        return LanguageModelTask
    return CaptionTask if cfg.data.format == "flickr8k" else TranslationTask


def make_task(cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None,
              train_pairs: Parallel | None = None, valid_pairs: Parallel | None = None, world: int = 1, rank: int = 0):
    if task_class(cfg) is CaptionTask:
        return CaptionTask(cfg, run_dir, data_dir, world, rank)
    if task_class(cfg) is LanguageModelTask:
        return LanguageModelTask(cfg, run_dir, data_dir, world, rank)
    return TranslationTask(cfg, run_dir, data_dir, train_pairs, valid_pairs, world, rank)
