"""What a fine-tuned classifier starts from, for each classifier family: the pretrained model's sizes, the
tokenizer files a run keeps beside its weights, and the pretrained body under a new head.

A start (named by its family in :mod:`attnkit.registry`) offers three functions:

    prepare(cfg, run_dir, write) -> file names    cfg.model takes the pretrained model's sizes; with ``write``
                                                  (one rank) the tokenizer's files are copied into ``run_dir``
    tokenizer(cfg, directory)                      the classifier's tokenizer, from a run or checkpoint directory
    model(cfg, tokenizer, labels, problem, class_weights)
                                                   the pretrained body and a new head, initialised from
                                                   ``train.seed``

BERT starts from a Hugging Face directory (the shipped all-MiniLM-L6-v2 by default); GPT-1's recipe starts from
one of attnkit's own language-model runs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

from attnkit.checkpoint import load_weights, read_config, read_meta, resolve_checkpoint, verify_files
from attnkit.config import ExperimentConfig
from attnkit.errors import AttnkitError
from attnkit.models.lm import LMConfig


def check_truncate(cfg: ExperimentConfig, pretrained: Path) -> None:
    """Refuse, before any file is written, inputs longer than the pretrained model's learned positions."""
    if cfg.data.truncate > cfg.model.max_positions:
        raise AttnkitError(f"data.truncate = {cfg.data.truncate} is longer than the {cfg.model.max_positions} "
                           f"positions of {pretrained}")


# --- BERT (Devlin et al. 2019): a Hugging Face directory


def bert_directory(cfg: ExperimentConfig) -> Path:
    from attnkit.models.bert import minilm_dir

    return Path(cfg.model.pretrained) if cfg.model.pretrained else minilm_dir()


def bert_prepare(cfg: ExperimentConfig, run_dir: Path, write: bool) -> list[str]:
    from attnkit.data import WordPiece
    from attnkit.models.bert import bert_config

    pretrained = bert_directory(cfg)
    config_file = pretrained / "config.json"
    try:
        hf = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"model.pretrained: {config_file}: missing (not a Hugging Face BERT directory)") from None
    except json.JSONDecodeError as e:
        raise AttnkitError(f"model.pretrained: {config_file}:{e.lineno}: invalid JSON ({e.msg})") from None
    shape = bert_config(hf, str(config_file))
    cfg.model = dataclasses.replace(cfg.model, **{k: getattr(shape, k) for k in (
        "d_model", "n_heads", "d_ff", "n_layers", "activation", "layer_norm_eps", "max_positions")})
    check_truncate(cfg, pretrained)
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pretrained / "vocab.txt", run_dir / "vocab.txt")
        casing = WordPiece.from_pretrained(pretrained).lowercase
        (run_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": casing}) + "\n",
                                                       encoding="utf-8")
    return ["tokenizer_config.json", "vocab.txt"]


def bert_tokenizer(cfg: ExperimentConfig, directory: Path):
    from attnkit.data import WordPiece

    return WordPiece.from_pretrained(directory, max_len=cfg.data.truncate)


def bert_model(cfg: ExperimentConfig, tokenizer, labels: list[str], problem: str, class_weights=None):
    """The pretrained encoder (and BERT's pooler where ``model.pooling = "cls"``) with a new head
    (:func:`attnkit.models.load_pretrained_classifier`), with this run's dropout."""
    from attnkit.models import build_classifier, load_pretrained_classifier

    m = cfg.model
    pretrained = load_pretrained_classifier(bert_directory(cfg), len(labels), m.pooling, m.dropout, problem, labels,
                                            seed=cfg.train.seed)
    model = build_classifier(m, tokenizer.vocab_size, labels, problem, class_weights)
    model.load_state_dict(pretrained.state_dict())
    return model


BERT = SimpleNamespace(prepare=bert_prepare, tokenizer=bert_tokenizer, model=bert_model)

# --- GPT-1 (Radford et al. 2018): an attnkit language-model run

GPT_TOKENIZER = "spm.model"
# the LM's own sizes; its dropouts are the fine-tuning's (GPT-1 fine-tunes with dropout 0.1)
LM_SHAPE = tuple(f.name for f in dataclasses.fields(LMConfig)
                 if f.name not in ("family", "preset", "dropout", "attention_dropout", "activation_dropout"))


def gpt_checkpoint(cfg: ExperimentConfig) -> tuple[Path, ExperimentConfig]:
    """The pretrained LM's checkpoint directory and config (``model.pretrained``), checked: a plain
    ``transformer_lm`` whose tokenizer is SentencePiece, its files as its meta.json records them."""
    if not cfg.model.pretrained:
        raise AttnkitError("model.pretrained: name the language model's checkpoint or run directory "
                           "(attnkit train configs/transfer_pretrain_wikitext2.toml makes one)")
    path = resolve_checkpoint(cfg.model.pretrained)
    lm = read_config(path)
    if type(lm.model) is not LMConfig:
        raise AttnkitError(f"model.pretrained: {path} holds a {lm.model.family} model, not a language model")
    if lm.data.lm_tokenizer != "spm" or lm.model.adaptive_softmax:
        raise AttnkitError(f"model.pretrained: {path}: GPT-1's recipe fine-tunes an LM with SentencePiece subwords "
                           "and one softmax (data.lm_tokenizer = 'spm', model.adaptive_softmax = [])")
    verify_files(path, read_meta(path) if (path / "meta.json").exists() else {})
    return path, lm


def gpt_prepare(cfg: ExperimentConfig, run_dir: Path, write: bool) -> list[str]:
    path, lm = gpt_checkpoint(cfg)
    cfg.model = dataclasses.replace(cfg.model, **{k: getattr(lm.model, k) for k in LM_SHAPE})
    check_truncate(cfg, path)
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path / GPT_TOKENIZER, run_dir / GPT_TOKENIZER)
    return [GPT_TOKENIZER]


def gpt_tokenizer(cfg: ExperimentConfig, directory: Path):
    from attnkit.data import Tokenizer
    from attnkit.models.gpt_classifier import FramingTokenizer

    return FramingTokenizer(Tokenizer(Path(directory) / GPT_TOKENIZER), cfg.data.truncate)


def gpt_model(cfg: ExperimentConfig, tokenizer, labels: list[str], problem: str, class_weights=None):
    """The LM of ``model.pretrained`` (its weights, unless ``model.from_scratch``) grown by the three new tokens,
    with a new head."""
    from attnkit.models import TransformerLM
    from attnkit.models.gpt_classifier import GPTClassifier

    m = cfg.model
    lm = TransformerLM(m, tokenizer.vocab_size)
    if not m.from_scratch:
        path, _ = gpt_checkpoint(cfg)
        load_weights(lm, path / "model.safetensors")
    n_labels = 1 if problem == "regression" else len(labels)
    return GPTClassifier(lm, n_labels, m.dropout, problem, labels, class_weights, m.lm_weight, seed=cfg.train.seed)


GPT = SimpleNamespace(prepare=gpt_prepare, tokenizer=gpt_tokenizer, model=gpt_model)
