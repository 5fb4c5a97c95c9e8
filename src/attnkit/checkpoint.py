"""Checkpoints for inference: find one, read its config and tokenizers, rebuild its model, verify its weights.

Nothing here imports the training stack (trainer, optimiser, tasks): a model is loaded for decoding, scoring or
serving with the model families, the data layer's tokenizers and safetensors alone. Writing checkpoints is
training's (:mod:`attnkit.train.checkpoint`).

A checkpoint directory is self-contained::

    step-1200/model.safetensors    the weights
    step-1200/config.toml          the resolved experiment config
    step-1200/spm*.model           the tokenizer(s) (chars.json, vocab.txt for other tasks)
    step-1200/trainer.safetensors  optimizer moments and RNG state (for --resume)
    step-1200/meta.json            step, epoch, data position, scores; the size and SHA-256 of every other file;
                                   the model config that shaped the weights

Loading verifies every file against meta.json (a damaged one is named) and refuses a config.toml whose model
table contradicts the one the weights were written with, even where the tensor shapes happen to fit (heads,
family). config.toml's other tables (decoding, data) may be edited. Checkpoints written before these records
(attnkit 0.1) load unverified.

A checkpoint is written under a temporary name and renamed into place, so a crash leaves either the old
checkpoint or the new one, never half of one. ``best``, ``last`` and ``averaged`` are symlinks or directories
beside the step directories, replaced atomically too.

A run directory resolves to one checkpoint by one rule: ``checkpoints/best`` (the best validation score), else
``checkpoints/averaged`` (the average of the last checkpoints, written at the end of a run), else
``checkpoints/last``.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_file, save_model

from attnkit import registry
from attnkit.config import ExperimentConfig, dump_toml, load_config
from attnkit.errors import AttnkitError
from attnkit.models import build_model

RUN_CHECKPOINTS = ("best", "averaged", "last")


TEMP_PREFIX = ".tmp-"  # write_checkpoint's temporary directories: .tmp-<name>.<random>, .tmp-<name>.old


def file_digest(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_record(cfg: ExperimentConfig) -> dict:
    """The model config that shapes the weights, as meta.json keeps it (dropout rates and Show-Attend-Tell's
    attention penalty excepted: they do not; and the preset's name: its values are recorded one by one)."""
    table = dataclasses.asdict(cfg.model)
    record = {k: list(v) if isinstance(v, tuple) else v for k, v in table.items()
              if "dropout" not in k and k not in ("preset", "attention_penalty")}  # a loss weight, not a shape
    record["family"] = cfg.model.family
    return record


def _saved(save, tensors_or_model, file: Path) -> None:
    """safetensors' writer reports a full disk as a SafetensorError ("... Os { code: 28, kind: StorageFull ...");
    make it the OSError it is, and any other failure to write a one-line error naming the file."""
    try:
        save(tensors_or_model, str(file))
    except SafetensorError as e:
        text = str(e)
        if "StorageFull" in text or "code: 28" in text or "No space left" in text:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file)) from None
        raise AttnkitError(f"{file}: cannot write ({' '.join(text.split())})") from None


def _test_pause(stage: str) -> None:
    """For the kill tests: ATTNKIT_TEST_CHECKPOINT_SLEEP=SECONDS sleeps inside every checkpoint write (after the
    weights, before the rename), so a SIGKILL can land there."""
    delay = os.environ.get("ATTNKIT_TEST_CHECKPOINT_SLEEP")
    if delay:
        time.sleep(float(delay))


def write_checkpoint(path: Path, model, cfg: ExperimentConfig, files: list[Path], meta: dict,
                     trainer_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """``files`` (tokenizers, vocabularies) are copied beside the weights so the directory stands alone.
    meta.json gains ``files`` (size and SHA-256 of each other file) and ``model`` (:func:`model_record`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=path.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private
        _saved(save_model, model, tmp / "model.safetensors")
        _test_pause("weights")
        (tmp / "config.toml").write_text(dump_toml(cfg), encoding="utf-8")
        for f in files:
            shutil.copyfile(f, tmp / Path(f).name)
        if trainer_tensors is not None:
            _saved(save_file, trainer_tensors, tmp / "trainer.safetensors")
        records = {f.name: {"size": f.stat().st_size, "sha256": file_digest(f)} for f in sorted(tmp.iterdir())}
        meta = {**meta, "files": records, "model": model_record(cfg)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        for f in tmp.iterdir():  # reach the disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if path.exists():
            old = path.with_name(f"{TEMP_PREFIX}{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def remove_debris(directory: Path) -> list[str]:
    """Remove what a killed :func:`write_checkpoint` or :func:`point` left in ``directory`` (temporary folders,
    half-made links); -> their names. Only one process writes a run's checkpoints, so none is in use."""
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        legacy = entry.name.startswith((".step-", ".averaged.", ".best.")) and entry.is_dir()  # older writes
        if legacy or entry.name.startswith(TEMP_PREFIX) or (entry.name.startswith(".") and entry.name.endswith(".tmp")
                                                            and entry.is_symlink()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def point(link: Path, target: Path) -> None:
    """Make ``link`` a relative symlink to ``target``, atomically."""
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(target, link.parent), tmp)
    os.replace(tmp, link)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory's checkpoint: best, else averaged, else last."""
    path = Path(path)
    if (path / "model.safetensors").exists():
        return path
    for name in RUN_CHECKPOINTS:
        for candidate in (path / "checkpoints" / name, path / name):
            if (candidate / "model.safetensors").exists():
                return candidate.resolve()
    if not path.exists():
        raise AttnkitError(f"{path}: no such checkpoint or run directory")
    raise AttnkitError(f"{path}: not a checkpoint (no model.safetensors, nor checkpoints/best, averaged or last)")


def read_meta(path: Path) -> dict:
    try:
        meta = json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}/meta.json: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AttnkitError(f"{path}/meta.json: invalid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(meta, dict):
        raise AttnkitError(f"{path}/meta.json: expected a JSON object, got {type(meta).__name__}")
    return meta


def record_files(path: Path) -> None:
    """Re-record the size and SHA-256 of a checkpoint's files in its meta.json: for a tool (or test) that edits a
    checkpoint on purpose; anything else that changes a file makes loading refuse it."""
    path = Path(path)
    meta = read_meta(path)
    meta["files"] = {f.name: {"size": f.stat().st_size, "sha256": file_digest(f)} for f in sorted(path.iterdir())
                     if f.is_file() and f.name != "meta.json"}
    (path / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


def verify_files(path: Path, meta: dict | None = None, resuming: bool = False) -> None:
    """Check every file meta.json records (size, then SHA-256) but config.toml (see :func:`verify_model_config`);
    the first that differs is named. A checkpoint from before these records passes unchecked. trainer.safetensors
    may have been removed from a checkpoint kept for inference, unless ``resuming``."""
    path = Path(path)
    meta = read_meta(path) if meta is None else meta
    records = meta.get("files")
    if records is None:
        return
    if not isinstance(records, dict):
        raise AttnkitError(f"{path}/meta.json: 'files' should be an object of name -> size and sha256")
    for name, record in records.items():
        if name == "config.toml":
            continue
        file = path / name
        if not isinstance(record, dict) or not isinstance(record.get("size"), int) \
                or not isinstance(record.get("sha256"), str):
            raise AttnkitError(f"{path}/meta.json: files.{name} should have an integer size and a sha256 string")
        if not file.is_file():
            if name == "trainer.safetensors" and not resuming:
                continue
            hint = "; this checkpoint cannot resume training" if name == "trainer.safetensors" else ""
            raise AttnkitError(f"{file}: missing (meta.json records it){hint}")
        size = file.stat().st_size
        if size != record["size"]:
            raise AttnkitError(f"{file}: damaged: {size} bytes where meta.json records {record['size']}")
        if file_digest(file) != record["sha256"]:
            raise AttnkitError(f"{file}: damaged: its SHA-256 differs from the one meta.json records")


def verify_model_config(path: Path, cfg: ExperimentConfig, meta: dict, what: str | None = None) -> None:
    """Refuse a model config that contradicts the one the checkpoint's weights were written with."""
    recorded = meta.get("model")
    if not isinstance(recorded, dict):
        return
    mine = model_record(cfg)
    for key in sorted(set(recorded) | set(mine)):
        if recorded.get(key) != mine.get(key):
            where = what or f"{Path(path) / 'config.toml'}"
            raise AttnkitError(f"{where}: model.{key} = {mine.get(key)!r} contradicts the weights in "
                               f"{Path(path) / 'model.safetensors'}, written with model.{key} = {recorded.get(key)!r}")


def checkpoint_damage(path: Path, resuming: bool = True) -> str | None:
    """What is wrong with checkpoint directory ``path``, in one line naming the file relative to it
    ("model.safetensors: damaged: ..."); None if it is intact."""
    path = Path(path)
    try:
        verify_files(path, resuming=resuming)
    except AttnkitError as e:
        text = str(e)
        return text.removeprefix(f"{path}/")
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if not (path / "model.safetensors").is_file():
        return "model.safetensors: missing"
    return None


def checkpoint_is_intact(path: Path, resuming: bool = True) -> bool:
    return checkpoint_damage(path, resuming) is None


def load_weights(model, file: Path) -> None:
    """Load ``model.safetensors`` strictly; a truncated file or one from another config is a one-line error."""
    try:
        missing, unexpected = load_model(model, str(file), strict=False)
    except FileNotFoundError:
        raise AttnkitError(f"{file}: missing") from None
    except SafetensorError as e:
        raise AttnkitError(f"{file}: unreadable or truncated safetensors file ({e})") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        detail = next((line.strip() for line in first if "size mismatch" in line), first[-1] if first else "")
        raise AttnkitError(f"{file}: weights do not fit this model's config: {detail}") from None
    if missing or unexpected:
        raise AttnkitError(f"{file}: weights do not fit this model's config "
                           f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def lm_tokenizer_file(cfg: ExperimentConfig) -> str:
    """The file a language model's tokenizer is kept in."""
    if cfg.data.lm_tokenizer == "spm":
        return "spm.model"
    return "chars.json" if registry.data_format(cfg.data.format).unit == "characters" else "vocab.txt"


def load_tokenizers(cfg: ExperimentConfig, directory: str | Path):
    """The tokenizer(s) a checkpoint keeps beside its weights, as its task reads them (:mod:`attnkit.registry`):
    a translation model's source and target :class:`~attnkit.data.Tokenizers`, a captioner's word vocabulary, a
    language model's tokenizer, a classifier's word pieces."""
    return registry.resolve(registry.task_of(cfg).tokenizers)(cfg, Path(directory))


def translation_tokenizers(cfg: ExperimentConfig, directory: Path):
    from attnkit.data import load_tokenizers as load_translation_tokenizers

    return load_translation_tokenizers(directory)


def caption_vocabulary(cfg: ExperimentConfig, directory: Path):
    from attnkit.data import WordVocab

    return WordVocab(directory / "vocab.txt")


def lm_tokenizer(cfg: ExperimentConfig, directory: Path):
    from attnkit.data import CharTokenizer, Tokenizer, WordVocab

    path = directory / lm_tokenizer_file(cfg)
    if cfg.data.lm_tokenizer == "spm":
        return Tokenizer(path)
    if registry.data_format(cfg.data.format).unit == "characters":
        return CharTokenizer(path)
    return WordVocab(path, pretokenized=True)


SPEECH_TOKENIZER_FILE = "chars.json"  # a speech model's characters


def speech_tokenizer(cfg: ExperimentConfig, directory: Path):
    from attnkit.data import CharTokenizer

    return CharTokenizer(Path(directory) / SPEECH_TOKENIZER_FILE)


def speech_model(cfg: ExperimentConfig, tokenizer, directory=None):
    return build_model(cfg.model, cfg.data.n_mels, tokenizer.vocab_size)


def classifier_tokenizer(cfg: ExperimentConfig, directory: Path):
    return registry.start(cfg.model.family).tokenizer(cfg, directory)


LABELS_FILE = "labels.json"  # a classifier's task: {"problem": "classification" | "regression", "labels": [...]}


def read_labels(directory: str | Path) -> tuple[str, list[str]]:
    """(problem, label names) of the classifier a checkpoint (or run) directory holds, from its labels.json."""
    path = Path(directory) / LABELS_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: missing (a classifier's checkpoint keeps its labels there)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AttnkitError(f"{path}: invalid JSON ({getattr(e, 'msg', e)})") from None
    problem, labels = (record.get(k) if isinstance(record, dict) else None for k in ("problem", "labels"))
    if problem not in ("classification", "regression") or not isinstance(labels, list) \
            or not all(isinstance(x, str) for x in labels) or not labels:
        raise AttnkitError(f"{path}: expected {{\"problem\": \"classification\" or \"regression\", "
                           f"\"labels\": [names]}}")
    return problem, labels


def write_labels(directory: str | Path, problem: str, labels: list[str]) -> Path:
    path = Path(directory) / LABELS_FILE
    path.write_text(json.dumps({"problem": problem, "labels": list(labels)}, indent=1) + "\n", encoding="utf-8")
    return path


def model_for(cfg: ExperimentConfig, tokenizers, directory: str | Path | None = None):
    """A freshly initialised model of ``cfg``'s family, sized for these tokenizers (a classifier: and for the
    labels of ``directory``'s labels.json), as its task builds it (:mod:`attnkit.registry`)."""
    return registry.resolve(registry.task_of(cfg).build)(cfg, tokenizers, directory)


def translation_model(cfg: ExperimentConfig, tokenizers, directory=None):
    return build_model(cfg.model, tokenizers.src.vocab_size, tokenizers.tgt.vocab_size)


def captioning_model(cfg: ExperimentConfig, vocabulary, directory=None):
    from attnkit.nn.vision import grid_shape

    _, h, w = grid_shape(cfg.data.image_grid, cfg.data.image_size)
    return build_model(cfg.model, h * w, vocabulary.vocab_size)


def language_model(cfg: ExperimentConfig, tokenizer, directory=None):
    return build_model(cfg.model, 0, tokenizer.vocab_size)


def classifier_model(cfg: ExperimentConfig, tokenizer, directory=None):
    if directory is None:
        raise AttnkitError("a classifier is built for the labels of a directory's labels.json: pass directory")
    problem, labels = read_labels(directory)
    return registry.resolve(registry.family(cfg.model.family).build)(cfg.model, tokenizer.vocab_size, labels, problem)


def read_config(path: Path) -> ExperimentConfig:
    """A checkpoint's config.toml (as attnkit 0.1 wrote it, too)."""
    return load_config(Path(path) / "config.toml", legacy=True)


def load_checkpoint(path: str | Path):
    """-> (model in eval mode, config, tokenizers (or a captioner's vocabulary), checkpoint dir)."""
    path = resolve_checkpoint(path)
    cfg = read_config(path)
    meta = read_meta(path) if (path / "meta.json").exists() else {}
    verify_files(path, meta)
    toks = load_tokenizers(cfg, path)
    model = model_for(cfg, toks, path)
    load_weights(model, path / "model.safetensors")
    verify_model_config(path, cfg, meta)
    model.eval()
    return model, cfg, toks, path
