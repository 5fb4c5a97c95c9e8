"""One table of what attnkit trains: the model families, the data formats, and the tasks that join them.

A **family** declares its config dataclass, its model class, the task it trains on and what its source is
(subword tokens, an image grid, nothing, or sentences to classify). A **data format** declares the task that
reads it and the unit of its text. A **task** declares how its data is read for training (the trainer's task
class), how a checkpoint's tokenizers are loaded and how a model is sized from them. Code elsewhere asks this
table (``family(name).source == "image"``, ``task_of(cfg).name``) instead of comparing names, so a new family is
one model file, one task and one entry here, plus its faces (CLI, server, explorer).

Entries name classes and functions as ``"module:attribute"`` strings, imported on first use (as Hugging Face's
Auto mappings do): the table sits below the layers it names, so inference never imports training by reading it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from attnkit.errors import AttnkitError

SOURCES = ("tokens", "image", "none", "sentences")


@dataclass(frozen=True)
class Family:
    """``source``: what the model reads. ``tokens``: subwords of a source sentence; ``image``: a CNN grid of an
    image; ``none``: nothing (a language model); ``sentences``: a sentence or a pair, classified.
    ``masks_source``: how source positions are hidden from the model (an intervention): ``"tokens"``, its ids
    become padding, which the encoder hides too; ``"memory"``, the encoder's output is masked as padding is;
    ``""``, they cannot be (no source, or no padding the decoder looks at). ``exports``: the formats
    ``attnkit export --to`` writes it in. ``alignment``: its attention is one distribution over the source per
    output step (Bahdanau et al.'s alignment, Show-Attend-Tell's), not layers of heads."""

    name: str
    config: str  # "module:Class" of its config dataclass
    build: str  # "module:function" (or class) making its model: f(cfg, source size, target vocabulary size), the
    # source size being a source vocabulary, a number of grid cells or 0 (a classifier: f(cfg, vocabulary size,
    # labels, problem))
    task: str  # the name of its task
    source: str
    masks_source: str = ""
    exports: tuple[str, ...] = ()
    alignment: bool = False
    pretrained: str = ""  # a classifier's start (:mod:`attnkit.pretrained`): its pretrained sizes, tokenizer, weights


@dataclass(frozen=True)
class DataFormat:
    """``unit``: what one token of a language model's text is (characters, or the corpus's own words), unless it
    is cut into SentencePiece subwords (``data.lm_tokenizer = "spm"``). ``needs``: the ``[data]`` keys that
    name its files, which a config must set. ``reader``: "module:function" reading a split of it, where its task
    reads formats so. ``metric``: the validation score that ranks checkpoints, where it is not the task's usual
    one (GLUE scores MRPC by F1). ``regression``: its labels are scores, not classes. ``pairs``: its examples are
    sentence pairs."""

    name: str
    task: str
    unit: str = "subwords"
    needs: tuple[str, ...] = ()
    reader: str = ""
    metric: str = ""
    regression: bool = False
    pairs: bool = False


@dataclass(frozen=True)
class Task:
    """``trainer``: the training task class (:mod:`attnkit.train.tasks`); ``tokenizers``: f(cfg, directory) -> a
    checkpoint's tokenizers; ``build``: f(cfg, tokenizers, directory) -> a freshly initialised model."""

    name: str
    trainer: str
    tokenizers: str
    build: str


FAMILIES = {f.name: f for f in (
    Family("transformer", "attnkit.config:TransformerConfig", "attnkit.models.transformer:Transformer",
           "translation", "tokens", masks_source="tokens", exports=("huggingface", "ctranslate2", "onnx")),
    Family("conv_transformer", "attnkit.config:ConvTransformerConfig", "attnkit.models.conv:ConvTransformer",
           "translation", "tokens", masks_source="tokens"),
    Family("rnn_encdec", "attnkit.config:RNNEncDecConfig", "attnkit.models.rnn:RNNEncDec", "translation", "tokens"),
    Family("rnnsearch", "attnkit.config:RNNSearchConfig", "attnkit.models.rnn:RNNSearch", "translation", "tokens",
           masks_source="memory", alignment=True),
    Family("show_attend_tell", "attnkit.config:ShowAttendTellConfig", "attnkit.models:build_show_attend_tell",
           "captioning", "image", alignment=True),
    Family("transformer_captioner", "attnkit.config:TransformerCaptionerConfig",
           "attnkit.models:build_transformer_captioner", "captioning", "image", masks_source="memory"),
    Family("transformer_lm", "attnkit.config:LMConfig", "attnkit.models:build_language_model", "language_model",
           "none"),
    Family("bert_classifier", "attnkit.config:BertClassifierConfig", "attnkit.models.classifier:build_classifier",
           "classification", "sentences", exports=("huggingface", "onnx"), pretrained="attnkit.pretrained:BERT"),
    Family("gpt_classifier", "attnkit.config:GPTClassifierConfig",
           "attnkit.models.gpt_classifier:build_gpt_classifier", "classification", "sentences",
           pretrained="attnkit.pretrained:GPT"),
)}

FORMATS = {f.name: f for f in (
    DataFormat("multi30k", "translation", reader="attnkit.data.prepare:multi30k_split"),
    DataFormat("tatoeba", "translation", reader="attnkit.data.prepare:tatoeba_split"),
    DataFormat("parallel", "translation", reader="attnkit.data.prepare:parallel_split"),
    DataFormat("dates", "translation", reader="attnkit.data.prepare:dates_split"),
    DataFormat("flickr8k", "captioning"),
    DataFormat("tinyshakespeare", "language_model", unit="characters", reader="attnkit.data:read_tinyshakespeare"),
    DataFormat("wikitext2", "language_model", unit="words", reader="attnkit.data:read_wikitext2"),
    DataFormat("sst2", "classification", reader="attnkit.data:read_glue"),
    DataFormat("mrpc", "classification", reader="attnkit.data:read_glue", metric="f1", pairs=True),
    DataFormat("stsb", "classification", reader="attnkit.data:read_glue", regression=True, pairs=True),
    DataFormat("labelled", "classification", needs=("train_file", "valid_file")),
)}

TASKS = {t.name: t for t in (
    Task("translation", "attnkit.train.tasks:TranslationTask", "attnkit.checkpoint:translation_tokenizers",
         "attnkit.checkpoint:translation_model"),
    Task("captioning", "attnkit.train.tasks:CaptionTask", "attnkit.checkpoint:caption_vocabulary",
         "attnkit.checkpoint:captioning_model"),
    Task("language_model", "attnkit.train.tasks:LanguageModelTask", "attnkit.checkpoint:lm_tokenizer",
         "attnkit.checkpoint:language_model"),
    Task("classification", "attnkit.train.tasks:ClassificationTask", "attnkit.checkpoint:classifier_tokenizer",
         "attnkit.checkpoint:classifier_model"),
)}


def resolve(reference: str):
    """The object a ``"module:attribute"`` string names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise AttnkitError(f"model.family = {name!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def data_format(name: str) -> DataFormat:
    if name not in FORMATS:
        raise AttnkitError(f"data.format = {name!r} is not one of {', '.join(FORMATS)}")
    return FORMATS[name]


def task_of(cfg) -> Task:
    """The task of an experiment config: its data format's."""
    return TASKS[data_format(cfg.data.format).task]


def reads_pairs(cfg) -> bool:
    """Whether a classifier of this config reads sentence pairs: its corpus is of pairs, or your own file names a
    second text column (``data.text_pair_column``)."""
    form = data_format(cfg.data.format)
    return form.pairs or (bool(form.needs) and bool(cfg.data.text_pair_column))


def start(name: str):
    """A classifier family's start: what it is fine-tuned from (:mod:`attnkit.pretrained`)."""
    f = family(name)
    if not f.pretrained:
        raise AttnkitError(f"model.family = {name!r} is not fine-tuned from a pretrained model")
    return resolve(f.pretrained)


def formats_of(task: str) -> list[str]:
    return [f.name for f in FORMATS.values() if f.task == task]


def families_of(task: str) -> list[str]:
    return [f.name for f in FAMILIES.values() if f.task == task]
