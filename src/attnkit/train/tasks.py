"""What the training loop trains on. A task owns the data, its batching, its training loss, its validation and
the metric that ranks checkpoints (as fairseq's tasks do).

The Trainer needs, from a task: ``build_model()``; ``lengths(split)`` for bucketing; ``batch(split, indices)``
(a batch with ``.to(device)``); ``loss(model, batch, label_smoothing)`` -> (loss to back-propagate, its
unsmoothed value, the number of ``unit`` it sums over: target tokens, or examples); ``validate(model, device,
max_tokens)`` -> scores named ``valid_*``; ``metrics``, what validation reports (each a :class:`Metric`), and
``metric``, the name of the one that picks the best checkpoint unless ``train.best_metric`` names another; and
``files`` to copy into every checkpoint (tokenizers, vocabularies, labels). What a metric is called and which way is
better is the task's to say: the trainer ranks by these declarations alone.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit import registry
from attnkit.checkpoint import lm_tokenizer_file, load_tokenizers, model_for, write_labels
from attnkit.config import ExperimentConfig
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
    shifted_blocks,
    stream_blocks,
    token_batches,
    train_tokenizer,
    words,
)
from attnkit.data.labelled import Labelled, read_labelled
from attnkit.data.wordpiece import SentenceBatch, collate_sentences
from attnkit.decode import translate
from attnkit.errors import AttnkitError
from attnkit.evaluate import bleu, classification_scores, language_model_scores, regression_scores
from attnkit.models import build_model
from attnkit.train import distributed


@dataclass(frozen=True)
class Metric:
    """A score validation reports as ``valid_<name>``, and which way is better. ``fallback`` names the metric that
    ranks checkpoints where a validation reported none of this one: BLEU needs a beam search that
    ``train.eval_bleu = false`` skips, while the loss is always there."""

    name: str
    higher_is_better: bool
    fallback: str = ""


LOSS = Metric("loss", higher_is_better=False)  # the validation cross-entropy (a regressor's squared error)
BLEU = Metric("bleu", higher_is_better=True, fallback=LOSS.name)
CLASSIFICATION_METRICS = (Metric("accuracy", True), Metric("f1", True), Metric("matthews", True), LOSS)
REGRESSION_METRICS = (Metric("pearson", True), Metric("spearman", True), LOSS)


class GenerationTask:
    """What every generative family shares: teacher-forced cross-entropy over the target tokens, the
    validation loss and perplexity, then the task's own :meth:`scores`."""

    unit = "tokens"
    metric = BLEU.name
    metrics = (BLEU, LOSS)

    def loss(self, model, batch: Batch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, int]:
        out = model(batch.src, batch.tgt_in, targets=batch.tgt_out, label_smoothing=label_smoothing)
        return out.loss, out.nll, batch.n_tokens

    @torch.no_grad()
    def validate(self, model, device: torch.device, max_tokens: int) -> dict:
        total, n = 0.0, 0
        for idx in token_batches(*self.lengths("valid"), max_tokens):
            b = self.batch("valid", idx).to(device)
            total, n = total + float(model(b.src, b.tgt_in, targets=b.tgt_out).nll), n + b.n_tokens
        return {"valid_loss": total / n, "valid_ppl": math.exp(min(total / n, 50)), **self.scores(model)}

    def scores(self, model) -> dict:
        return {}


class TranslationTask(GenerationTask):
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
        hyps = [x.text[0] for x in out]
        return {"valid_bleu": bleu(hyps, self.valid_pairs.tgt, lowercase=self.cfg.data.lowercase).score}


def load_grids(cfg: ExperimentConfig, images: list[Path], rank: int = 0, world: int = 1):
    """[N, L, C] float16 CNN grids of these images, extracted into the feature cache on first use (by rank 0)."""
    from attnkit.data import extract_features
    from attnkit.nn.vision import load_pretrained

    cache = None
    for turn in range(2):  # rank 0 extracts; the others then find everything cached
        if (rank == 0) == (turn == 0):
            cache = extract_features(load_pretrained(cfg.data.image_grid), images, cfg.data.feature_cache,
                                     progress=rank == 0, image_size=cfg.data.image_size)
        distributed.barrier(world)
    grids = cache.load([p.name for p in images])  # [N, C, h, w]
    return grids.flatten(2).transpose(1, 2).contiguous()


class CaptionTask(GenerationTask):
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


class LanguageModelTask(GenerationTask):
    """One stream of text cut into contiguous blocks of ``data.block_size`` tokens: Tiny Shakespeare by
    character, WikiText-2 by the corpus's own words (``<eos>`` ending each line). Each block is one example.

    With ``data.lm_tokenizer = "spm"`` both are cut into SentencePiece subwords instead, one line at a
    time with EOS for the line break, from ``data.spm_model`` if given: one model shared by two corpora
    lets a model pretrained on one be fine-tuned on the other (``train.init_from``).

    The tokenizer is built from the training text only. The trainer reports validation loss and
    perplexity; character models add bits per character.
    """

    metric = LOSS.name
    metrics = (LOSS,)

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None, world: int = 1,
                 rank: int = 0, texts: dict[str, list[str]] | None = None):
        """``texts`` (tests): {"train": [...], "valid": [...]} instead of the corpus files; each item is
        one stretch of text (Tiny Shakespeare: the whole split; WikiText-2: one line with its ``<eos>``)."""
        self.cfg = cfg
        texts = texts or {split: self.read(cfg, split, data_dir) for split in ("train", "valid")}
        if not any(texts["train"]) or not any(texts["valid"]):
            raise AttnkitError(f"{run_dir}: empty training or validation text ({cfg.data.format})")
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
        text = registry.resolve(registry.data_format(cfg.data.format).reader)(data_dir, split)
        return [text] if isinstance(text, str) else text  # one stretch of characters, or lines of words

    @staticmethod
    def lines(cfg: ExperimentConfig, texts: list[str]) -> list[str]:
        """For SentencePiece: the text line by line, without WikiText's written ``<eos>`` (EOS takes its place)."""
        if registry.data_format(cfg.data.format).unit == "characters":
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
                                   cfg.data.spm_model_type, cfg.data.lowercase)
        if registry.data_format(cfg.data.format).unit == "characters":
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
        if registry.data_format(self.cfg.data.format).unit != "characters" or self.cfg.data.lm_tokenizer != "corpus":
            return {}  # the trainer's valid_loss and valid_ppl say it all
        batch_blocks = max(1, self.cfg.train.max_tokens // self.cfg.data.block_size)
        return {"valid_bpc": language_model_scores(model, self.blocks["valid"], batch_blocks, characters=True)["bpc"]}


@dataclass
class LabelledBatch:
    """Sentences (or pairs) as BERT reads them, their targets (class ids [B] long, or scores [B] float) and their
    positions in the dataset."""

    inputs: SentenceBatch
    targets: Tensor
    indices: list[int]

    def to(self, device: torch.device) -> LabelledBatch:
        return LabelledBatch(self.inputs.to(device), self.targets.to(device), self.indices)


def read_labelled_splits(cfg: ExperimentConfig, data_dir: str | None = None) -> tuple[Labelled, Labelled]:
    """(train, dev) of ``data.format``: a GLUE task's train.tsv and dev.tsv, or ``data.train_file`` and
    ``data.valid_file`` read with the ``data.*_column`` names; their first ``data.max_train_pairs`` and
    ``data.max_valid_pairs`` rows (0: all), the label set still the whole training file's."""
    d = cfg.data
    form = registry.data_format(d.format)
    if not form.needs:  # a corpus of its own, in the data directory
        read = registry.resolve(form.reader)
        train, valid = (read(d.format, split, data_dir or d.data_dir or None) for split in ("train", "dev"))
    else:
        train, valid = (read_labelled(path, d.text_column, d.text_pair_column or None, d.label_column,
                                      regression=d.regression) for path in (d.train_file, d.valid_file))
    return train.first(d.max_train_pairs), valid.first(d.max_valid_pairs)


def is_regression(cfg: ExperimentConfig) -> bool:
    """Scores, not classes: a corpus of scores (STS-B), or your own file read with ``data.regression``."""
    form = registry.data_format(cfg.data.format)
    return form.regression or (bool(form.needs) and cfg.data.regression)


class ClassificationTask:
    """Labelled sentences or sentence pairs: a pretrained model fine-tuned with a classifier (or regressor) head.

    What it starts from is its family's (:mod:`attnkit.pretrained`): BERT's encoder and word pieces, or a GPT
    language model and its subwords; the run keeps that tokenizer's files. The label set is the training file's
    (a dev label outside it is an error, naming the file and line), kept in the run's ``labels.json``. Each input
    is cut to ``data.truncate`` tokens; a batch pads only to its longest input. The loss sums over examples;
    validation scores with scikit-learn (accuracy, F1, Matthews) or SciPy (Pearson, Spearman).
    """

    unit = "examples"

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None, world: int = 1,
                 rank: int = 0, splits: tuple[Labelled, Labelled] | None = None):
        """``splits`` (tests): (train, dev) instead of ``data.format``'s files."""
        from attnkit.data import check_labels, label_set

        train, valid = splits or read_labelled_splits(cfg, data_dir)
        self.problem = "regression" if is_regression(cfg) else "classification"
        if self.problem == "classification":
            self.labels = list(train.label_names or label_set(train))
            if len(self.labels) < 2:
                raise AttnkitError(f"{train.origin or 'the training file'}: classification needs at least 2 labels, "
                                   f"not {len(self.labels)}")
            check_labels(valid, self.labels, train.origin or "the training file")
            self.metric = registry.data_format(cfg.data.format).metric or "accuracy"  # GLUE's figure for the task
            self.metrics = CLASSIFICATION_METRICS
        else:
            self.labels, self.metric, self.metrics = ["score"], "spearman", REGRESSION_METRICS
        if valid.labels is None:
            raise AttnkitError(f"{valid.origin}: the validation file has no labels")
        self.start = registry.start(cfg.model.family)
        self.cfg, run_dir = cfg, Path(run_dir)
        self.tokenizer_files = self.start.prepare(cfg, run_dir, write=rank == 0)
        if rank == 0:
            write_labels(run_dir, self.problem, self.labels)
        distributed.barrier(world)
        self.run_dir = run_dir
        self.tokenizer = self.start.tokenizer(cfg, run_dir)
        self.examples, self.targets, self.splits = {}, {}, {"train": train, "valid": valid}
        index = {name: i for i, name in enumerate(self.labels)}
        for split, data in self.splits.items():
            pairs = data.pairs or [None] * len(data.texts)
            self.examples[split] = [self.tokenizer.example(a, b) for a, b in zip(data.texts, pairs)]
            if self.problem == "regression":
                self.targets[split] = torch.tensor(data.labels, dtype=torch.float32)
            else:
                self.targets[split] = torch.tensor([index[label] for label in data.labels], dtype=torch.long)

    @property
    def files(self) -> list[Path]:
        return [self.run_dir / name for name in ("labels.json", *self.tokenizer_files)]

    def class_weights(self) -> list[float] | None:
        """``train.class_weights = "balanced"``: n / (classes * count of the class), scikit-learn's."""
        if self.cfg.train.class_weights == "none":
            return None
        if self.problem == "regression":
            raise AttnkitError("train.class_weights = 'balanced' is for classification; this task is a regression")
        import numpy as np
        from sklearn.utils.class_weight import compute_class_weight

        classes = np.arange(len(self.labels))
        return compute_class_weight("balanced", classes=classes, y=self.targets["train"].numpy()).tolist()

    def build_model(self):
        """The pretrained body with a new head, initialised from ``train.seed``, with this run's dropout."""
        return self.start.model(self.cfg, self.tokenizer, self.labels, self.problem, self.class_weights())

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        # token_batches counts one more per example: the [CLS] the ids already hold stands for it
        return [len(ids) - 1 for ids, _ in self.examples[split]], [0] * len(self.examples[split])

    def batch(self, split: str, indices: list[int]) -> LabelledBatch:
        inputs = collate_sentences([self.examples[split][i] for i in indices], self.tokenizer.pad_id)
        return LabelledBatch(inputs, self.targets[split][indices], list(indices))

    def loss(self, model, batch: LabelledBatch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, int]:
        b = batch.inputs
        out = model(b.tokens, b.padding_mask, b.token_types, targets=batch.targets, label_smoothing=label_smoothing)
        return out.loss, out.nll, len(batch.indices)

    @torch.no_grad()
    def predict(self, model, split: str, device: torch.device, max_tokens: int) -> Tensor:
        """Logits [N, n_labels] of every example of ``split``, in its order."""
        outputs = [None] * len(self.examples[split])
        for idx in token_batches(*self.lengths(split), max_tokens):
            b = self.batch(split, idx).to(device)
            logits = model(b.inputs.tokens, b.inputs.padding_mask, b.inputs.token_types).logits.float().cpu()
            for row, i in enumerate(idx):
                outputs[i] = logits[row]
        return torch.stack(outputs)

    @staticmethod
    def score(problem: str, predictions: list, golds: list, n_labels: int) -> dict[str, float]:
        """The task's metrics but the loss, of predictions against gold answers: class ids (of ``n_labels``) for
        a classifier, scores for a regressor. Validation and ``attnkit evaluate --data`` both score here, so a
        checkpoint's recorded scores and an evaluation of its predictions are the same figures."""
        if problem == "regression":
            return regression_scores(predictions, golds)
        return classification_scores(predictions, golds, n_labels)

    def validate(self, model, device: torch.device, max_tokens: int) -> dict:
        logits = self.predict(model, "valid", device, max_tokens)
        gold = self.targets["valid"]
        if self.problem == "regression":
            predictions = logits[:, 0]
            loss = float(((predictions - gold) ** 2).mean())
        else:
            predictions = logits.argmax(-1)
            loss = float(torch.nn.functional.cross_entropy(logits, gold))
        scores = self.score(self.problem, predictions.tolist(), gold.tolist(), len(self.labels))
        return {"valid_loss": loss, **{f"valid_{k}": v for k, v in scores.items()}}


def restore(cfg: ExperimentConfig, directory: Path):
    """-> (model, tokenizers) from a checkpoint directory's files (the weights are loaded by the caller)."""
    toks = load_tokenizers(cfg, directory)
    return model_for(cfg, toks, directory), toks


def task_class(cfg: ExperimentConfig):
    """The training task of ``cfg``'s data (:mod:`attnkit.registry`)."""
    return registry.resolve(registry.task_of(cfg).trainer)


def make_task(cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None,
              train_pairs: Parallel | None = None, valid_pairs: Parallel | None = None, world: int = 1, rank: int = 0):
    """``cfg``'s training task; ``train_pairs`` and ``valid_pairs`` (translation) stand in for its data files."""
    cls = task_class(cfg)
    if cls is TranslationTask:
        return cls(cfg, run_dir, data_dir, train_pairs, valid_pairs, world, rank)
    return cls(cfg, run_dir, data_dir, world, rank)
