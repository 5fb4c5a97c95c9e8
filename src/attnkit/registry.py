"""One table of what attnkit trains and reads: model families, input kinds, data formats, and the tasks that join
them.

A **family** is one model module and one entry here: its config dataclass (defined beside the model), its
builder, the task it trains on, its tokenizer loader (its task's unless it has its own), the **input kind** it
reads and the output it writes. An **input kind** (:mod:`attnkit.kinds`) owns everything the faces need to know
about one kind of input (reading it from a command line, Python or HTTP, its positions on an attention map, its
limits, an example, its OpenAPI schema). A **data format** names the task that reads it; a **task** how its data
is read for training, how a checkpoint's tokenizers are loaded and how a model is sized from them.

Code elsewhere asks this table (``family(name).input``, ``kind_of(name)``, ``task_of(cfg)``) instead of
comparing names, so a new family is one module and one :func:`register_family` call, also from outside the
package (``attnkit --plugin my_family.py train ...`` or ``ATTNKIT_PLUGINS``), as fairseq's ``--user-dir`` and
Hugging Face's ``AutoConfig.register`` allow (docs/extending.md).

Entries may name classes and functions as ``"module:attribute"`` strings, imported on first use (as Hugging
Face's Auto mappings do): the table sits below the layers it names, so inference never imports training by
reading it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from attnkit.errors import AttnkitError

DEFAULT_FAMILY = "transformer"  # what a config naming no family trains
OUTPUTS = ("text", "label")  # what a family writes: text (decoded token by token), or a label / score
PLUGINS = "ATTNKIT_PLUGINS"  # the environment variable naming plug-in files or modules, os.pathsep-separated


@dataclass(frozen=True)
class Family:
    """A model family. ``config``: its config dataclass (a subclass of :class:`attnkit.config.ModelConfig`) or
    ``"module:Class"``; ``build``: f(cfg, source size, target vocabulary size) -> the model, the source size
    being a source vocabulary, a number of grid cells or 0 (a classifier's: f(cfg, vocabulary size, labels,
    problem)); ``task``: the name of its task; ``input``: the name of its input kind; ``output``: "text" or
    "label"; ``tokenizers``: f(cfg, directory) -> a checkpoint's tokenizers, where not its task's.

    ``masks_source``: how source positions are hidden from the model (an intervention): ``"tokens"``, its ids
    become padding, which the encoder hides too; ``"memory"``, the encoder's output is masked as padding is;
    ``""``, they cannot be. ``exports``: the formats ``attnkit export --to`` writes it in. ``alignment``: its
    attention is one distribution over the source per output step (Bahdanau et al.'s alignment,
    Show-Attend-Tell's), not layers of heads. ``pretrained``: a classifier's start (:mod:`attnkit.pretrained`).
    ``legacy_names``: {a key as attnkit 0.1's checkpoints named it: this family's name for it}; ``in_0_1``: attnkit
    0.1 wrote checkpoints of it, which load today (tests/test_old_checkpoints.py holds one of each)."""

    name: str
    config: str | type
    build: str | object
    task: str
    input: str
    output: str = "text"
    tokenizers: str | object = ""
    masks_source: str = ""
    exports: tuple[str, ...] = ()
    alignment: bool = False
    pretrained: str = ""
    legacy_names: Mapping[str, str] = field(default_factory=dict)
    in_0_1: bool = False  # attnkit 0.1 wrote checkpoints of it (one [model] table for every family: legacy_names)

    @property
    def decodes(self) -> bool:
        """Whether it writes text token by token (a decoder), rather than a label or a score (a classifier)."""
        return self.output == OUTPUTS[0]


@dataclass(frozen=True)
class DataFormat:
    """``unit``: what one token of a language model's text is (characters, or the corpus's own words), unless it
    is cut into SentencePiece subwords (``data.lm_tokenizer = "spm"``). ``needs``: the ``[data]`` keys that
    name its files, which a config must set. ``reader``: "module:function" reading a split of it, where its task
    reads formats so. ``metric``: the validation score that ranks checkpoints, where it is not the task's usual
    one (GLUE scores MRPC by F1). ``regression``: its labels are scores, not classes. ``pairs``: its examples are
    sentence pairs. ``example``: a first input for the explorer, where its sources are not English sentences."""

    name: str
    task: str
    unit: str = "subwords"
    needs: tuple[str, ...] = ()
    reader: str = ""
    metric: str = ""
    regression: bool = False
    pairs: bool = False
    example: str = ""


@dataclass(frozen=True)
class Task:
    """``trainer``: the training task class (:mod:`attnkit.train.tasks`); ``tokenizers``: f(cfg, directory) -> a
    checkpoint's tokenizers; ``build``: f(cfg, tokenizers, directory) -> a freshly initialised model."""

    name: str
    trainer: str
    tokenizers: str
    build: str


_ENCDEC_0_1 = {"d_model": "embedding_size", "d_ff": "hidden_size"}

_FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("transformer", "attnkit.models.transformer:TransformerConfig", "attnkit.models.transformer:Transformer",
           "translation", "text", masks_source="tokens", exports=("huggingface", "ctranslate2", "onnx"), in_0_1=True),
    Family("conv_transformer", "attnkit.models.conv:ConvTransformerConfig", "attnkit.models.conv:ConvTransformer",
           "translation", "text", masks_source="tokens", in_0_1=True),
    Family("rnn_encdec", "attnkit.models.rnn:RNNEncDecConfig", "attnkit.models.rnn:RNNEncDec", "translation", "text",
           legacy_names=_ENCDEC_0_1, in_0_1=True),
    Family("rnnsearch", "attnkit.models.rnn:RNNSearchConfig", "attnkit.models.rnn:RNNSearch", "translation", "text",
           masks_source="memory", alignment=True, legacy_names=_ENCDEC_0_1, in_0_1=True),
    Family("show_attend_tell", "attnkit.models.captioner:ShowAttendTellConfig",
           "attnkit.models.captioner:build_show_attend_tell", "captioning", "image", alignment=True,
           legacy_names={"d_model": "hidden_size", "d_ff": "attention_size"}, in_0_1=True),
    Family("transformer_captioner", "attnkit.models.captioner:TransformerCaptionerConfig",
           "attnkit.models.captioner:build_transformer_captioner", "captioning", "image", masks_source="memory",
           in_0_1=True),
    Family("transformer_lm", "attnkit.models.lm:LMConfig", "attnkit.models.lm:build_language_model",
           "language_model", "prompt", legacy_names={"n_decoder_layers": "n_layers"}, in_0_1=True),
    Family("bert_classifier", "attnkit.models.classifier:BertClassifierConfig",
           "attnkit.models.classifier:build_classifier", "classification", "sentences", output="label",
           exports=("huggingface", "onnx"), pretrained="attnkit.pretrained:BERT"),
    Family("gpt_classifier", "attnkit.models.gpt_classifier:GPTClassifierConfig",
           "attnkit.models.gpt_classifier:build_gpt_classifier", "classification", "sentences", output="label",
           pretrained="attnkit.pretrained:GPT"),
    Family("show_ask_attend_answer", "attnkit.models.vqa:ShowAskAttendAnswerConfig",
           "attnkit.models.vqa:build_show_ask_attend_answer", "answering", "image_question", output="label"),
    Family("las", "attnkit.models.las:LASConfig", "attnkit.models.las:build_las", "speech", "speech",
           masks_source="memory", alignment=True),
    Family("speech_transformer", "attnkit.models.speech_transformer:SpeechTransformerConfig",
           "attnkit.models.speech_transformer:build_speech_transformer", "speech", "speech", masks_source="memory"),
)}

_KINDS: dict[str, object] = {
    "text": "attnkit.kinds.text:TEXT",
    "image": "attnkit.kinds.image:IMAGE",
    "prompt": "attnkit.kinds.prompt:PROMPT",
    "sentences": "attnkit.kinds.sentences:SENTENCES",
    "image_question": "attnkit.kinds.image_question:IMAGE_QUESTION",
    "speech": "attnkit.kinds.speech:SPEECH",
}

_FORMATS: dict[str, DataFormat] = {f.name: f for f in (
    DataFormat("multi30k", "translation", reader="attnkit.data.prepare:multi30k_split"),
    DataFormat("tatoeba", "translation", reader="attnkit.data.prepare:tatoeba_split"),
    DataFormat("parallel", "translation", reader="attnkit.data.prepare:parallel_split"),
    DataFormat("dates", "translation", reader="attnkit.data.prepare:dates_split", example="July 20, 1969"),
    DataFormat("flickr8k", "captioning"),
    DataFormat("tinyshakespeare", "language_model", unit="characters", reader="attnkit.data:read_tinyshakespeare"),
    DataFormat("wikitext2", "language_model", unit="words", reader="attnkit.data:read_wikitext2"),
    DataFormat("sst2", "classification", reader="attnkit.data:read_glue"),
    DataFormat("mrpc", "classification", reader="attnkit.data:read_glue", metric="f1", pairs=True),
    DataFormat("stsb", "classification", reader="attnkit.data:read_glue", regression=True, pairs=True),
    DataFormat("labelled", "classification", needs=("train_file", "valid_file")),
    DataFormat("easy_vqa", "answering", reader="attnkit.data.vqa:easy_vqa_split"),
    DataFormat("vqa", "answering", needs=("train_file", "valid_file"), reader="attnkit.data.vqa:read_vqa_split"),
    DataFormat("fsdd_digits", "speech", unit="characters", reader="attnkit.data.speech:read_fsdd_digits"),
    DataFormat("spoken_multi30k", "speech", unit="characters",
               reader="attnkit.data.spoken_multi30k:read_spoken_multi30k"),
    DataFormat("speech_list", "speech", unit="characters", needs=("train_file", "valid_file"),
               reader="attnkit.data.speech:read_list_split"),
)}

_TASKS: dict[str, Task] = {t.name: t for t in (
    Task("translation", "attnkit.train.tasks:TranslationTask", "attnkit.checkpoint:translation_tokenizers",
         "attnkit.checkpoint:translation_model"),
    Task("captioning", "attnkit.train.tasks:CaptionTask", "attnkit.checkpoint:caption_vocabulary",
         "attnkit.checkpoint:captioning_model"),
    Task("language_model", "attnkit.train.tasks:LanguageModelTask", "attnkit.checkpoint:lm_tokenizer",
         "attnkit.checkpoint:language_model"),
    Task("classification", "attnkit.train.tasks:ClassificationTask", "attnkit.checkpoint:classifier_tokenizer",
         "attnkit.checkpoint:classifier_model"),
    Task("answering", "attnkit.train.vqa:AnswerTask", "attnkit.data.vqa:question_vocab",
         "attnkit.models.vqa:answering_model"),
    Task("speech", "attnkit.train.speech:SpeechTask", "attnkit.checkpoint:speech_tokenizer",
         "attnkit.checkpoint:speech_model"),
)}

# the fast runtime's tricks (attnkit.fast.use), by the name ``train.fast`` gives them: each installs itself on a model
_TRICKS: dict[str, str] = {name: f"attnkit.fast.runtime:install_{name}" for name in (
    "dropout16", "fused_loss", "fused_attention", "decoding_attention", "onednn_linear")}

# read-only views: an entry is added through register_family / register_kind / register_format only
FAMILIES: Mapping[str, Family] = MappingProxyType(_FAMILIES)
KINDS: Mapping[str, object] = MappingProxyType(_KINDS)
FORMATS: Mapping[str, DataFormat] = MappingProxyType(_FORMATS)
TASKS: Mapping[str, Task] = MappingProxyType(_TASKS)
TRICKS: Mapping[str, str] = MappingProxyType(_TRICKS)


def resolve(reference):
    """The object a ``"module:attribute"`` string names; anything else is that object itself."""
    if not isinstance(reference, str):
        return reference
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


def register_family(entry: Family, replace: bool = False) -> Family:
    """Add a model family (or, with ``replace``, change one). Its task and input kind must be registered; its
    config dataclass must carry ``family = entry.name`` as its default. A one-line error otherwise. Returns the
    entry."""
    if entry.name in _FAMILIES and not replace:
        raise AttnkitError(f"register_family: a family named {entry.name!r} is registered already")
    if entry.task not in _TASKS:
        raise AttnkitError(f"register_family({entry.name!r}): task {entry.task!r} is not one of {', '.join(_TASKS)}")
    if entry.input not in _KINDS:
        raise AttnkitError(f"register_family({entry.name!r}): input {entry.input!r} is not one of "
                           f"{', '.join(_KINDS)}")
    if entry.output not in OUTPUTS:
        raise AttnkitError(f"register_family({entry.name!r}): output {entry.output!r} is not one of "
                           f"{', '.join(OUTPUTS)}")
    if not isinstance(entry.config, str) and getattr(entry.config(), "family", None) != entry.name:
        raise AttnkitError(f"register_family({entry.name!r}): its config's family field must default to "
                           f"{entry.name!r}")
    _FAMILIES[entry.name] = entry
    return entry


def register_kind(kind, replace: bool = False):
    """Add an input kind (an :class:`attnkit.kinds.InputKind`, or ``"module:attribute"`` naming one)."""
    name = kind.name if not isinstance(kind, str) else None
    if name is None:
        raise AttnkitError("register_kind: give the kind itself (an attnkit.kinds.InputKind)")
    if name in _KINDS and not replace:
        raise AttnkitError(f"register_kind: an input kind named {name!r} is registered already")
    _KINDS[name] = kind
    return kind


def register_format(entry: DataFormat, replace: bool = False) -> DataFormat:
    """Add a data format of a registered task."""
    if entry.name in _FORMATS and not replace:
        raise AttnkitError(f"register_format: a data format named {entry.name!r} is registered already")
    if entry.task not in _TASKS:
        raise AttnkitError(f"register_format({entry.name!r}): task {entry.task!r} is not one of {', '.join(_TASKS)}")
    _FORMATS[entry.name] = entry
    return entry


def load_plugins(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Import the plug-ins ``ATTNKIT_PLUGINS`` names (Python files or module names, os.pathsep-separated), each
    once: each registers its families and kinds when imported. Returns what was imported."""
    loaded = []
    for item in filter(None, environ.get(PLUGINS, "").split(os.pathsep)):
        path = Path(item)
        name = f"attnkit_plugin_{path.stem}" if item.endswith(".py") else item
        if name in sys.modules:
            continue
        if item.endswith(".py"):
            if not path.is_file():
                raise AttnkitError(f"{PLUGINS}: {item}: no such file")
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            try:
                importlib.import_module(item)
            except ModuleNotFoundError as e:
                raise AttnkitError(f"{PLUGINS}: {item}: no such module ({e.name})") from None
        loaded.append(item)
    return loaded


def _unknown(what: str, name, known) -> AttnkitError:
    hint = f" (a plug-in's: name its file with --plugin or {PLUGINS})" if what == "model.family" else ""
    return AttnkitError(f"{what} = {name!r} is not one of {', '.join(known)}{hint}")


def describe_unknown_family(name) -> str:
    """"model.family = 'x' is not one of ..." with where a plug-in's family comes from."""
    return str(_unknown("model.family", name, _FAMILIES))


def family(name: str) -> Family:
    if name not in _FAMILIES:
        raise _unknown("model.family", name, _FAMILIES)
    return _FAMILIES[name]


def kind(name: str):
    """The input kind named ``name`` (an :class:`attnkit.kinds.InputKind`)."""
    if name not in _KINDS:
        raise _unknown("input kind", name, _KINDS)
    found = resolve(_KINDS[name])
    _KINDS[name] = found
    return found


def kinds() -> list:
    """Every registered input kind, resolved, in the order they were registered."""
    return [kind(name) for name in list(_KINDS)]


def kind_of(family_name: str):
    """The input kind a family reads."""
    return kind(family(family_name).input)


def config_class(family_name: str) -> type:
    """A family's config dataclass."""
    return resolve(family(family_name).config)


def model_configs() -> dict[str, type]:
    """Every family's config dataclass, by family name."""
    return {name: config_class(name) for name in _FAMILIES}


def data_format(name: str) -> DataFormat:
    if name not in _FORMATS:
        raise _unknown("data.format", name, _FORMATS)
    return _FORMATS[name]


def task_of(cfg) -> Task:
    """The task of an experiment config: its data format's."""
    return _TASKS[data_format(cfg.data.format).task]


def tokenizers_of(cfg):
    """The function loading a checkpoint's tokenizers: the family's own, else its task's."""
    f = family(cfg.model.family)
    return resolve(f.tokenizers or task_of(cfg).tokenizers)


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
    return [f.name for f in _FORMATS.values() if f.task == task]


def families_of(task: str) -> list[str]:
    return [f.name for f in _FAMILIES.values() if f.task == task]
