"""Typed configuration: dataclasses loaded from TOML with ``--set key=value`` overrides.

One system only. Every experiment is an :class:`ExperimentConfig`; a TOML file maps
its tables (``[model]``, ``[data]``, ``[train]``, ``[decode]``) onto the nested
dataclasses. Unknown keys and values of the wrong type are rejected with a one-line
error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

from attnkit import registry
from attnkit.errors import AttnkitError

# --- the model families: one dataclass each, defined beside its model and named by its registry entry


@dataclass
class ModelConfig:
    """What every family's config dataclass starts with: ``family`` names its registry entry
    (:mod:`attnkit.registry`), ``preset`` fills its fields first (:data:`PRESETS`). Each family's own fields mean
    one thing; checkpoints written by attnkit 0.1, which kept one [model] table for every family, named some of
    them otherwise (its entry's ``legacy_names``)."""

    family: str = ""
    preset: str = ""


def _default_model() -> ModelConfig:
    return registry.config_class(registry.DEFAULT_FAMILY)()


@dataclass
class DataConfig:
    # multi30k | tatoeba | parallel | dates | flickr8k | tinyshakespeare | wikitext2 (generation);
    # sst2 | mrpc | stsb (GLUE) | labelled (your own CSV, TSV or JSONL) (classification and regression)
    format: str = "multi30k"
    data_dir: str = ""  # empty: --data-dir, then $ATTNKIT_DATA, then ../shared/data
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_prefix: str = "train"
    valid_prefix: str = "val"
    test_prefix: str = "test_2016_flickr"
    train_src: str = ""  # format = "parallel": explicit files (plain or .gz)
    train_tgt: str = ""
    valid_src: str = ""
    valid_tgt: str = ""
    max_train_pairs: int = 0  # 0: all (captioning: images; language models: blocks;
                              # classification: the first rows of each file)
    max_valid_pairs: int = 0
    vocab_size: int = 8000
    joint_vocab: bool = True
    spm_model_type: str = "unigram"  # unigram | bpe | char
    lowercase: bool = False  # SentencePiece folds case (nmt_nfkc_cf): the model reads and writes lowercased text
    max_len: int = 128  # longer training pairs (in subwords) are dropped
    n_synthetic: int = 20000  # format = "dates": generated pairs
    long_test_min_words: int = 0  # format = "tatoeba": hold out long sources as split "test_long" (0: off)
    # format = "flickr8k" (captioning)
    image_grid: str = "head"  # EfficientNet-Lite0 grid: "head" (7x7x1280) or "stage6" (14x14x112), ...
    image_size: int = 224  # the encoder's input side: images are resized (bicubic) to it; the head grid's side
                           # is image_size / 32 rounded up (320: 10x10)
    feature_cache: str = "runs/features"  # CNN grids are computed once per image and encoder, kept here
    min_word_count: int = 5  # rarer caption words become <unk>
    # language models (tinyshakespeare: characters; wikitext2: the corpus's words): the text is one stream
    block_size: int = 256  # tokens per training example, cut contiguously from the stream
    lm_tokenizer: str = "corpus"  # corpus: characters (tinyshakespeare), words (wikitext2); spm: SentencePiece
    spm_model: str = ""  # lm_tokenizer = "spm": use this SentencePiece model (e.g. one shared with pretraining)
    # format = "labelled": your own files (CSV / TSV with a header row, or JSONL) and the columns to read
    train_file: str = ""
    valid_file: str = ""
    text_column: str = "text"
    text_pair_column: str = ""  # empty: single sentences; else the second sentence of a pair
    label_column: str = "label"
    regression: bool = False  # labels are real-valued scores (one output), not class names
    truncate: int = 128  # classification: a longer input is cut to this many word pieces ([CLS], [SEP] counted)
    image_dir: str = ""  # format = "vqa": where the files' images are (empty: beside each file)
    # speech (fsdd_digits: spoken digit strings; spoken_multi30k: synthesised captions; speech_list: your
    # path<TAB>transcript files): log-mel features
    sample_rate: int = 8000  # what the model hears: other rates are resampled to it, lower ones refused
    n_mels: int = 40
    max_audio_seconds: float = 30.0  # a longer utterance is refused
    held_out_speaker: str = ""  # fsdd_digits: that speaker's recordings are the test set, the others' train and valid
    max_digits: int = 10  # fsdd_digits: recordings per string, 1 to this
    freq_masks: int = 1  # SpecAugment in training: this many bands of up to freq_mask mel channels,
    freq_mask: int = 6
    time_masks: int = 2  # and this many stretches of up to time_mask frames, set to zero
    time_mask: int = 15
    # spoken_multi30k: Multi30k's English captions spoken by espeak-ng (attnkit.data.spoken_multi30k), each in a
    # voice ("language+variant", `espeak-ng --voices`), rate (words a minute) and pitch (0-99) drawn from these
    voices: tuple[str, ...] = ("en-us+m1", "en-us+f2", "en-gb+m3", "en-gb+f4", "en-gb-scotland+m2", "en-029+f1")
    held_out_voice: str = "en-gb-x-rp+f3"  # never in training: test2016 spoken by it is a split of its own
    speaking_rates: tuple[int, int] = (140, 200)
    pitches: tuple[int, int] = (30, 70)
    renditions: int = 1  # ways each training caption is spoken (validation and test: one)
    synthesis_seed: int = 0  # draws each caption's voice, rate and pitch
    speech_cache: str = "runs/speech"  # synthesised audio is kept here, made once


@dataclass
class TrainConfig:
    seed: int = 1
    max_tokens: int = 4096  # per batch, counting padded source or target tokens, whichever is larger
    batch_size: int = 0  # examples per batch at most (0: as many as max_tokens allows)
    update_freq: int = 1  # gradient accumulation
    max_steps: int = 10000
    max_epochs: int = 0  # 0: no limit
    max_minutes: float = 0.0  # 0: no limit; a wall-clock budget for the training loop
    # with max_minutes: the schedule's last step (cosine, linear) is where max_minutes end at the speed measured by
    # the end of warmup, never past max_steps, and the run ends there; kept in checkpoints, so a resumed run keeps it
    fit_schedule: bool = False
    lr: float = 7e-4
    schedule: str = "inverse_sqrt"  # noam | inverse_sqrt | cosine | linear | constant
    optimizer: str = "adam"  # adam (weight_decay as L2 in the gradient) | adamw (decoupled, Loshchilov & Hutter)
    warmup_steps: int = 4000
    min_lr: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 1.0  # 0: off
    label_smoothing: float = 0.1
    log_every: int = 50
    eval_every: int = 1000  # steps between validation loss/BLEU; 0: each epoch only
    eval_bleu: bool = True
    eval_beam: int = 1
    save_every: int = 1000
    keep_last: int = 5
    average_last: int = 0  # average this many last checkpoints at the end (0: off)
    init_from: str = ""  # fine-tuning: a checkpoint (or run dir) whose weights start this run; same tokenizer
    # what ranks checkpoints for "best" and early stopping: "" the task's own, or another its validation reports,
    # by name (the task declares them, attnkit.train.tasks; the trainer refuses a name its task does not report)
    best_metric: str = ""
    patience: int = 0  # stop after this many validations without a better best_metric (0: never)
    class_weights: str = "none"  # classification: none | balanced (n / (classes * count), scikit-learn's)
    threads: int = 0  # 0: the command line picks (attnkit.threads: idle cores); Python code keeps torch's
    # the fast runtime's tricks the model trains with (attnkit.fast.use), by name; [] trains the core as it reads
    fast: tuple[str, ...] = ("dropout16", "fused_loss", "fused_attention", "decoding_attention", "onednn_linear")
    parallel: str = "ddp"  # under torchrun: ddp (replicas) | fsdp (parameters, gradients, Adam moments sharded)
    device: str = "auto"  # auto (CUDA when there is one) | cpu | cuda; under torchrun, GPU LOCAL_RANK
    # fp32 | bf16 | fp16: mixed precision (autocast; fp16 with loss scaling) on CUDA; on a CPU bf16 only, where it
    # has AVX512_BF16 or AMX (elsewhere refused: bf16 matrix products there are tens of times slower than fp32);
    # auto: bf16 where the hardware has bf16 matrix instructions (that CPU, a CUDA GPU that supports bf16), else fp32
    precision: str = "fp32"
    tensorboard: bool = False
    progress: bool = True


@dataclass
class DecodeConfig:
    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    max_caption_len: int = 30  # captioners: the longest caption generated
    batch_size: int = 64
    max_source_tokens: int = 1024  # a longer source sentence (in subwords) is refused with one line, not decoded
    # a speech model trained with joint CTC: CTC's share λ of a search's scores (joint CTC/attention decoding,
    # attnkit.decode.ctc); 0: the attention decoder's alone
    ctc_weight: float = 0.0


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    model: ModelConfig = field(default_factory=_default_model)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


def _coerce(value, typ, where: str):
    """Check ``value`` against the annotated type; int is accepted for float fields."""
    origin = typing.get_origin(typ)
    if origin is tuple:
        args = typing.get_args(typ)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[int, ...]: a list of any length
            if not isinstance(value, (list, tuple)):
                raise AttnkitError(f"{where}: expected a list, got {value!r}")
            return tuple(_coerce(v, args[0], where) for v in value)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise AttnkitError(f"{where}: expected a list of {len(args)} numbers, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if typ is bool:
        if not isinstance(value, bool):
            raise AttnkitError(f"{where}: expected true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise AttnkitError(f"{where}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AttnkitError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise AttnkitError(f"{where}: expected a string, got {value!r}")
        return value
    raise AttnkitError(f"{where}: unsupported type {typ}")


def _fill(obj, table: dict, where: str):
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in table.items():
        if key not in names:
            family = getattr(obj, "family", None)
            renamed = registry.family(family).legacy_names.get(key) if family in registry.FAMILIES else None
            if renamed:
                raise AttnkitError(f"{where}: unknown key '{key}': a {family} model calls it '{renamed}'")
            raise AttnkitError(f"{where}: unknown key '{key}' (known: {', '.join(sorted(names))})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise AttnkitError(f"{where}.{key}: expected a table")
            _fill(current, value, f"{where}.{key}")
        else:
            setattr(obj, key, _coerce(value, hints[key], f"{where}.{key}"))


def _parse_override(text: str) -> tuple[list[str], object]:
    if "=" not in text:
        raise AttnkitError(f"--set {text}: expected key=value, e.g. train.lr=5e-4")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string: --set data.format=tatoeba
    return key.strip().split("."), value


# The paper's table 3 sizes, and small ones that train on a CPU. ``model.preset`` fills
# these first; keys set beside it in the file or by --set win.
_GPT = dict(norm_first=True, activation="gelu", positional="learned", dropout=0.1)  # GPT-2's choices
PRESETS = {
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, dropout=0.1),
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_encoder_layers=6, n_decoder_layers=6, dropout=0.3),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3, dropout=0.1),
    "tiny": dict(d_model=128, n_heads=4, d_ff=256, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1),
    # decoder-only language models (family transformer_lm)
    "lm_tiny": dict(d_model=128, n_heads=4, d_ff=512, n_layers=2, **_GPT),
    "lm_small": dict(d_model=256, n_heads=4, d_ff=1024, n_layers=4, **_GPT),
    "lm_base": dict(d_model=384, n_heads=6, d_ff=1536, n_layers=6, **_GPT),  # nanoGPT's
    "gpt2_small": dict(d_model=768, n_heads=12, d_ff=3072, n_layers=12, **(_GPT | dict(max_positions=1024))),
}

# the fields every 0.1 [model] table held, whatever its family (dropped where the family has no such field)
_LEGACY_MODEL_KEYS = {
    "family", "preset", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "dropout",
    "attention_dropout", "activation_dropout", "activation", "norm_first", "layer_norm_eps", "positional",
    "max_positions", "share_embeddings", "d_feature", "attention_score", "attention_penalty", "conv_kernel",
    "adaptive_softmax"}


def _from_legacy(family: str, table: dict) -> dict:
    """A [model] table as attnkit 0.1 wrote it into checkpoints (one table for every family) in this family's
    names; the keys the family never read are dropped."""
    renamed = registry.family(family).legacy_names
    fields = {f.name for f in dataclasses.fields(registry.config_class(family))}
    out = {}
    for key, value in table.items():
        key = renamed.get(key, key)
        if key in fields:
            out[key] = value
        elif key not in _LEGACY_MODEL_KEYS:
            out[key] = value  # not a 0.1 key: left for _fill to report
    return out


def config_from_dict(table: dict, where: str = "config", legacy: bool = False) -> ExperimentConfig:
    """The experiment ``table`` describes. ``[model] family`` picks the model's dataclass (default: the
    Transformer); ``model.preset`` fills its fields first, and keys beside it win. ``legacy``: the table was
    written by attnkit 0.1 (a checkpoint's config.toml), whose [model] table named some fields otherwise."""
    cfg = ExperimentConfig()
    table = dict(table)
    model = table.get("model", {})
    if not isinstance(model, dict):
        raise AttnkitError(f"{where}.model: expected a table")
    family = model.get("family", registry.DEFAULT_FAMILY)
    if not isinstance(family, str) or family not in registry.FAMILIES:
        raise AttnkitError(f"{where}: {registry.describe_unknown_family(family)}")
    if legacy:
        model = _from_legacy(family, model)
    cfg.model = registry.config_class(family)()
    preset = model.get("preset", "")
    if not isinstance(preset, str):
        raise AttnkitError(f"{where}: model.preset = {preset!r}: expected the name of a preset")
    if preset:
        fields = {f.name for f in dataclasses.fields(cfg.model)}
        if preset not in PRESETS or not set(PRESETS[preset]) <= fields:
            usable = [name for name, values in PRESETS.items() if set(values) <= fields]
            raise AttnkitError(f"{where}: model.preset = {preset!r} is not one of {', '.join(usable) or 'none'} "
                               f"(for model.family = {family!r})")
        cfg.model = dataclasses.replace(cfg.model, **PRESETS[preset])
    table["model"] = model
    _fill(cfg, table, where)
    validate(cfg, where)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = (), legacy: bool = False) -> ExperimentConfig:
    """Read a TOML file (or start from defaults) and apply ``key=value`` overrides (see :func:`config_from_dict`
    for ``legacy``)."""
    table: dict = {}
    where = "config"
    if path is not None:
        path = Path(path)
        where = str(path)
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AttnkitError(f"{path}: config file not found") from None
        except IsADirectoryError:
            raise AttnkitError(f"{path}: is a directory, not a config file") from None
        except UnicodeDecodeError as e:
            raise AttnkitError(f"{path}: not UTF-8 text (byte {e.start})") from None
        except tomllib.TOMLDecodeError as e:
            raise AttnkitError(f"{path}: invalid TOML: {e}") from None
    for text in overrides:
        keys, value = _parse_override(text)
        node = table
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise AttnkitError(f"--set {text}: '{k}' is not a table")
        node[keys[-1]] = value
    return config_from_dict(table, where, legacy)


_CHOICES = {
    ("model", "attention_score"): ("additive", "general", "dot", "scaled_dot"),
    ("model", "energy"): ("mlp_dot", "additive"),  # LAS's attention energy
    ("model", "activation"): ("relu", "gelu"),
    ("model", "positional"): ("sinusoidal", "learned"),
    ("data", "format"): tuple(registry.FORMATS),
    ("model", "pooling"): ("cls", "mean"),
    ("model", "attention"): ("glimpses", "pooled", "none"),
    ("data", "spm_model_type"): ("unigram", "bpe", "char"),
    ("data", "lm_tokenizer"): ("corpus", "spm"),
    ("train", "schedule"): ("noam", "inverse_sqrt", "cosine", "linear", "constant"),
    ("train", "optimizer"): ("adam", "adamw"),
    ("train", "class_weights"): ("none", "balanced"),
    ("train", "parallel"): ("ddp", "fsdp"),
    ("train", "device"): ("auto", "cpu", "cuda"),
    ("train", "precision"): ("fp32", "bf16", "fp16", "auto"),
}


def validate(cfg: ExperimentConfig, where: str = "config") -> None:
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(cfg, section), key, None)
        if value is not None and value not in choices:
            raise AttnkitError(f"{where}: {section}.{key} = {value!r} is not one of {', '.join(choices)}")
    m = cfg.model
    task = registry.family(m.family).task
    if registry.data_format(cfg.data.format).task != task:
        other = registry.families_of(registry.data_format(cfg.data.format).task)
        raise AttnkitError(f"{where}: model.family = {m.family!r} goes with data.format = "
                           f"{' or '.join(registry.formats_of(task))}, not {cfg.data.format!r} (which goes with "
                           f"model.family = {' or '.join(other)})")
    needs = registry.data_format(cfg.data.format).needs
    if not all(getattr(cfg.data, key) for key in needs):
        raise AttnkitError(f"{where}: data.format = {cfg.data.format!r} needs "
                           f"{' and '.join(f'data.{key}' for key in needs)}")
    if hasattr(m, "conv_kernel") and (m.conv_kernel < 1 or m.conv_kernel % 2 == 0):
        raise AttnkitError(f"{where}: model.conv_kernel = {m.conv_kernel} must be a positive odd number "
                           "(the encoder's convolutions are centred)")
    if getattr(m, "share_embeddings", False) and registry.kind_of(m.family).source_vocabulary \
            and not cfg.data.joint_vocab:
        raise AttnkitError(f"{where}: model.share_embeddings = true needs data.joint_vocab = true")
    if getattr(m, "adaptive_softmax", ()):
        if list(m.adaptive_softmax) != sorted(set(m.adaptive_softmax)) or m.adaptive_softmax[0] <= 0:
            raise AttnkitError(f"{where}: model.adaptive_softmax = {list(m.adaptive_softmax)} must be increasing "
                               "positive cutoffs")
        if cfg.train.label_smoothing:
            raise AttnkitError(f"{where}: model.adaptive_softmax trains on the plain likelihood; "
                               "set train.label_smoothing = 0")
    for key in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "n_layers", "embedding_size",
                "hidden_size", "attention_size", "d_feature", "max_positions"):
        if getattr(m, key, 1) < 1:
            raise AttnkitError(f"{where}: model.{key} = {getattr(m, key)} must be at least 1")
    if hasattr(m, "n_heads") and m.d_model % m.n_heads:
        raise AttnkitError(f"{where}: model.d_model = {m.d_model} is not divisible by model.n_heads = {m.n_heads}")
    for key in ("dropout", "attention_dropout", "activation_dropout", "context_dropout"):
        value = getattr(m, key, 0.0)
        if not 0.0 <= value < 1.0:
            raise AttnkitError(f"{where}: model.{key} = {value} must be in [0, 1)")
    if getattr(m, "lm_weight", 0.0) < 0:
        raise AttnkitError(f"{where}: model.lm_weight = {m.lm_weight} must be at least 0 (0: the task's loss alone)")
    if not 0.0 <= cfg.train.label_smoothing < 1.0:
        raise AttnkitError(f"{where}: train.label_smoothing = {cfg.train.label_smoothing} must be in [0, 1)")
    if cfg.train.fit_schedule and not cfg.train.max_minutes:
        raise AttnkitError(f"{where}: train.fit_schedule = true fits the schedule to train.max_minutes, which is 0 "
                           "(no time budget)")
    for name in cfg.train.fast:
        if name not in registry.TRICKS:
            raise AttnkitError(f"{where}: train.fast: {name!r} is not one of {', '.join(registry.TRICKS)}")
    positive = [("train", "max_tokens"), ("train", "update_freq"), ("data", "vocab_size"), ("decode", "beam_size"),
                ("train", "lr"), ("data", "block_size")]
    for section, key in positive:
        if not getattr(getattr(cfg, section), key) > 0:  # NaN is not positive either
            raise AttnkitError(f"{where}: {section}.{key} must be positive")
    _validate_ranges(cfg, where)


# (section, key) -> the smallest value that means something (a count, a step, a rate)
_AT_LEAST = {
    ("train", "max_steps"): 1, ("train", "max_epochs"): 0, ("train", "save_every"): 0, ("train", "warmup_steps"): 0,
    ("train", "eval_every"): 0, ("train", "log_every"): 1, ("train", "keep_last"): 1, ("train", "average_last"): 0,
    ("train", "eval_beam"): 1, ("train", "threads"): 0, ("train", "max_minutes"): 0, ("train", "min_lr"): 0,
    ("train", "weight_decay"): 0, ("train", "clip_norm"): 0, ("data", "max_train_pairs"): 0,
    ("data", "max_valid_pairs"): 0, ("data", "max_len"): 1, ("data", "n_synthetic"): 1,
    ("data", "long_test_min_words"): 0, ("data", "min_word_count"): 1, ("decode", "max_len_a"): 0,
    ("decode", "max_len_b"): 0, ("decode", "max_caption_len"): 1, ("decode", "batch_size"): 1,
    ("decode", "max_source_tokens"): 1, ("train", "batch_size"): 0, ("train", "patience"): 0, ("data", "truncate"): 3,
    ("data", "image_size"): 32,
}


def check_positions(cfg: ExperimentConfig, where: str = "config") -> None:
    """Training: learned positions must cover the longest example (checked when a run starts; a checkpoint's
    config is not refused for it)."""
    m = cfg.model
    if getattr(m, "positional", None) == "learned" and hasattr(m, "max_positions"):
        need, what = registry.kind_of(m.family).positions_needed(cfg)
        if m.max_positions < need:
            raise AttnkitError(f"{where}: model.max_positions = {m.max_positions} learned positions are fewer than "
                               f"{what}")


def _validate_ranges(cfg: ExperimentConfig, where: str) -> None:
    """Every number finite, every count and step in its range, learned positions long enough for the data."""
    import math

    for section in ("model", "data", "train", "decode"):
        table = getattr(cfg, section)
        for f in dataclasses.fields(table):
            value = getattr(table, f.name)
            values = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                raise AttnkitError(f"{where}: {section}.{f.name} = {value!r} must be a finite number")
    for (section, key), low in _AT_LEAST.items():
        value = getattr(getattr(cfg, section), key)
        if value < low:
            raise AttnkitError(f"{where}: {section}.{key} = {value!r} must be at least {low}")
    t = cfg.train
    if not (0 <= t.betas[0] < 1 and 0 <= t.betas[1] < 1):
        raise AttnkitError(f"{where}: train.betas = {list(t.betas)} must both be in [0, 1)")
    if not t.eps > 0:
        raise AttnkitError(f"{where}: train.eps = {t.eps} must be positive")


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def dump_toml(cfg: ExperimentConfig) -> str:
    """Write the resolved config as TOML (flat tables of scalars and lists)."""
    lines = [f"name = {_toml_value(cfg.name)}"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"\n[{f.name}]")
            for k, v in dataclasses.asdict(value).items():
                lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
