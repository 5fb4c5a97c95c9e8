"""Typed configuration: dataclasses loaded from TOML with ``--set key=value`` overrides.

One system only. Every experiment is an :class:`ExperimentConfig`; a TOML file maps
its tables (``[model]``, ``[data]``, ``[train]``, ``[decode]``) onto the nested
dataclasses. Unknown keys and values of the wrong type are rejected with a one-line
error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from attnkit.errors import AttnkitError


@dataclass
class ModelConfig:
    # rnn_encdec, rnnsearch: d_model is the word embedding size, d_ff the GRU hidden size (see models/rnn.py)
    family: str = "transformer"
    preset: str = ""  # "base", "big" (the paper), "small", "tiny"; "lm_tiny" .. "gpt2_small": see PRESETS
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3  # transformer_lm: its depth
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0  # inside the FFN; off in the paper, and costly on a CPU (the d_ff-wide tensor)
    activation: str = "relu"
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN (the lm_* presets)
    layer_norm_eps: float = 1e-5  # BERT's weights were trained with 1e-12
    positional: str = "sinusoidal"  # or "learned"
    max_positions: int = 1024
    share_embeddings: bool = True  # source/target embeddings and output projection tied (needs a joint vocabulary)
    # captioners: image features come as a grid of d_feature-channel cells
    d_feature: int = 1280
    attention_score: str = "additive"  # show_attend_tell, rnnsearch: additive (Bahdanau), general, dot, scaled_dot
    attention_penalty: float = 1.0  # show_attend_tell: lambda of the doubly stochastic regulariser
    conv_kernel: int = 3  # conv_transformer: the convolutional encoder's kernel width k (odd)
    # transformer_lm: cutoffs of an adaptive softmax (Grave et al. 2017), e.g. [2000, 10000]: the frequent words
    # get a full-width softmax, rarer ones narrower clusters. Empty: one softmax over the whole vocabulary.
    # With share_embeddings the input embedding is adaptive too and shares the softmax's weights.
    adaptive_softmax: tuple[int, ...] = ()


@dataclass
class DataConfig:
    format: str = "multi30k"  # multi30k | tatoeba | parallel | dates | flickr8k | tinyshakespeare | wikitext2
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
    max_train_pairs: int = 0  # 0: all (captioning: images; language models: blocks)
    max_valid_pairs: int = 0
    vocab_size: int = 8000
    joint_vocab: bool = True
    spm_model_type: str = "unigram"  # unigram | bpe | char
    max_len: int = 128  # longer training pairs (in subwords) are dropped
    n_synthetic: int = 20000  # format = "dates": generated pairs
    long_test_min_words: int = 0  # format = "tatoeba": hold out long sources as split "test_long" (0: off)
    # format = "flickr8k" (captioning)
    image_grid: str = "head"  # EfficientNet-Lite0 grid: "head" (7x7x1280) or "stage6" (14x14x112), ...
    feature_cache: str = "runs/features"  # CNN grids are computed once per image and encoder, kept here
    min_word_count: int = 5  # rarer caption words become <unk>
    # language models (tinyshakespeare: characters; wikitext2: the corpus's words): the text is one stream
    block_size: int = 256  # tokens per training example, cut contiguously from the stream
    lm_tokenizer: str = "corpus"  # corpus: characters (tinyshakespeare), words (wikitext2); spm: SentencePiece
    spm_model: str = ""  # lm_tokenizer = "spm": use this SentencePiece model (e.g. one shared with pretraining)


@dataclass
class TrainConfig:
    seed: int = 1
    max_tokens: int = 4096  # per batch, counting padded source or target tokens, whichever is larger
    update_freq: int = 1  # gradient accumulation
    max_steps: int = 10000
    max_epochs: int = 0  # 0: no limit
    max_minutes: float = 0.0  # 0: no limit; a wall-clock budget for the training loop
    lr: float = 7e-4
    schedule: str = "inverse_sqrt"  # noam | inverse_sqrt | cosine | constant
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
    best_metric: str = "bleu"  # bleu | loss
    threads: int = 0  # 0: torch's default
    parallel: str = "ddp"  # under torchrun: ddp (replicas) | fsdp (parameters, gradients, Adam moments sharded)
    device: str = "auto"  # auto (CUDA when there is one) | cpu | cuda; under torchrun, GPU LOCAL_RANK
    precision: str = "fp32"  # fp32 | bf16 | fp16: mixed precision (autocast; fp16 with loss scaling), CUDA only
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


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    model: ModelConfig = field(default_factory=ModelConfig)
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
    # decoder-only language models (family transformer_lm); depth is n_decoder_layers
    "lm_tiny": dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=0, n_decoder_layers=2, **_GPT),
    "lm_small": dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=0, n_decoder_layers=4, **_GPT),
    "lm_base": dict(d_model=384, n_heads=6, d_ff=1536, n_encoder_layers=0, n_decoder_layers=6, **_GPT),  # nanoGPT's
    "gpt2_small": dict(d_model=768, n_heads=12, d_ff=3072, n_encoder_layers=0, n_decoder_layers=12,
                       **(_GPT | dict(max_positions=1024))),
}


def config_from_dict(table: dict, where: str = "config") -> ExperimentConfig:
    cfg = ExperimentConfig()
    preset = table.get("model", {}).get("preset", "") if isinstance(table.get("model"), dict) else ""
    if preset:
        if preset not in PRESETS:
            raise AttnkitError(f"{where}: model.preset = {preset!r} is not one of {', '.join(PRESETS)}")
        cfg.model = dataclasses.replace(cfg.model, **PRESETS[preset])
    _fill(cfg, table, where)
    validate(cfg, where)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a TOML file (or start from defaults) and apply ``key=value`` overrides."""
    table: dict = {}
    where = "config"
    if path is not None:
        path = Path(path)
        where = str(path)
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AttnkitError(f"{path}: config file not found") from None
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
    return config_from_dict(table, where)


LM_FORMATS = ("tinyshakespeare", "wikitext2")  # language-model corpora: one stream of text

_CHOICES = {
    ("model", "family"): ("transformer", "show_attend_tell", "transformer_captioner", "transformer_lm",
                          "rnn_encdec", "rnnsearch", "conv_transformer"),
    ("model", "attention_score"): ("additive", "general", "dot", "scaled_dot"),
    ("model", "activation"): ("relu", "gelu"),
    ("model", "positional"): ("sinusoidal", "learned"),
    ("data", "format"): ("multi30k", "tatoeba", "parallel", "dates", "flickr8k", "tinyshakespeare", "wikitext2"),
    ("data", "spm_model_type"): ("unigram", "bpe", "char"),
    ("data", "lm_tokenizer"): ("corpus", "spm"),
    ("train", "schedule"): ("noam", "inverse_sqrt", "cosine", "constant"),
    ("train", "best_metric"): ("bleu", "loss"),
    ("train", "parallel"): ("ddp", "fsdp"),
    ("train", "device"): ("auto", "cpu", "cuda"),
    ("train", "precision"): ("fp32", "bf16", "fp16"),
}


def validate(cfg: ExperimentConfig, where: str = "config") -> None:
    for (section, key), choices in _CHOICES.items():
        value = getattr(getattr(cfg, section), key)
        if value not in choices:
            raise AttnkitError(f"{where}: {section}.{key} = {value!r} is not one of {', '.join(choices)}")
    m = cfg.model
    if (m.family == "transformer_lm") != (cfg.data.format in LM_FORMATS):
        raise AttnkitError(f"{where}: model.family = 'transformer_lm' goes with data.format = "
                           f"{' or '.join(LM_FORMATS)}, not {m.family!r} with {cfg.data.format!r}")
    if m.family in ("rnn_encdec", "rnnsearch", "conv_transformer") and cfg.data.format == "flickr8k":
        raise AttnkitError(f"{where}: model.family = {m.family!r} translates text; data.format = 'flickr8k' "
                           "goes with show_attend_tell or transformer_captioner")
    if m.family == "conv_transformer" and (m.conv_kernel < 1 or m.conv_kernel % 2 == 0):
        raise AttnkitError(f"{where}: model.conv_kernel = {m.conv_kernel} must be a positive odd number "
                           "(the encoder's convolutions are centred)")
    if m.share_embeddings and not cfg.data.joint_vocab:
        raise AttnkitError(f"{where}: model.share_embeddings = true needs data.joint_vocab = true")
    if m.adaptive_softmax:
        if m.family != "transformer_lm":
            raise AttnkitError(f"{where}: model.adaptive_softmax is for model.family = 'transformer_lm'")
        if list(m.adaptive_softmax) != sorted(set(m.adaptive_softmax)) or m.adaptive_softmax[0] <= 0:
            raise AttnkitError(f"{where}: model.adaptive_softmax = {list(m.adaptive_softmax)} must be increasing "
                               "positive cutoffs")
        if cfg.train.label_smoothing:
            raise AttnkitError(f"{where}: model.adaptive_softmax trains on the plain likelihood; "
                               "set train.label_smoothing = 0")
    if m.d_model % m.n_heads:
        raise AttnkitError(f"{where}: model.d_model = {m.d_model} is not divisible by model.n_heads = {m.n_heads}")
    fractions = [("model", "dropout"), ("model", "attention_dropout"), ("model", "activation_dropout"),
                 ("train", "label_smoothing")]
    for section, key in fractions:
        value = getattr(getattr(cfg, section), key)
        if not 0.0 <= value < 1.0:
            raise AttnkitError(f"{where}: {section}.{key} = {value} must be in [0, 1)")
    positive = [("model", "d_model"), ("model", "n_heads"), ("model", "d_ff"), ("train", "max_tokens"),
                ("train", "update_freq"), ("data", "vocab_size"), ("decode", "beam_size"), ("train", "lr"),
                ("data", "block_size")]
    for section, key in positive:
        if getattr(getattr(cfg, section), key) <= 0:
            raise AttnkitError(f"{where}: {section}.{key} must be positive")


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
