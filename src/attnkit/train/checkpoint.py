"""Checkpoints on disk: safetensors for tensors, TOML/JSON for the rest; never pickle.

A checkpoint directory is self-contained::

    step-1200/model.safetensors    the weights
    step-1200/config.toml          the resolved experiment config
    step-1200/spm*.model           the tokenizer(s)
    step-1200/trainer.safetensors  optimizer moments and RNG state (for --resume)
    step-1200/meta.json            step, epoch, data position, scores

It is written under a temporary name and renamed into place, so a crash leaves either
the old checkpoint or the new one, never half of one. ``best`` and ``last`` are
symlinks beside the step directories, replaced atomically too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from attnkit.config import ExperimentConfig, dump_toml, load_config
from attnkit.errors import AttnkitError


def write_checkpoint(path: Path, model, cfg: ExperimentConfig, files: list[Path], meta: dict,
                     trainer_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """``files`` (tokenizers, vocabularies) are copied beside the weights so the directory stands alone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private
        save_model(model, str(tmp / "model.safetensors"))
        (tmp / "config.toml").write_text(dump_toml(cfg), encoding="utf-8")
        for f in files:
            shutil.copyfile(f, tmp / Path(f).name)
        if trainer_tensors is not None:
            save_file(trainer_tensors, str(tmp / "trainer.safetensors"))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        for f in tmp.iterdir():  # reach the disk before the rename makes it visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if path.exists():
            old = path.with_name(f".{path.name}.old")
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


def point(link: Path, target: Path) -> None:
    """Make ``link`` a relative symlink to ``target``, atomically."""
    tmp = link.with_name(f".{link.name}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(target, link.parent), tmp)
    os.replace(tmp, link)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory (its best checkpoint, else its last)."""
    path = Path(path)
    if (path / "model.safetensors").exists():
        return path
    for name in ("best", "last"):
        for candidate in (path / "checkpoints" / name, path / name):
            if (candidate / "model.safetensors").exists():
                return candidate.resolve()
    raise AttnkitError(f"{path}: not a checkpoint (no model.safetensors, nor checkpoints/best or last)")


def read_meta(path: Path) -> dict:
    try:
        return json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}/meta.json: missing") from None
    except json.JSONDecodeError as e:
        raise AttnkitError(f"{path}/meta.json:{e.lineno}: invalid JSON ({e.msg})") from None


def load_weights(model, file: Path) -> None:
    """Load ``model.safetensors`` strictly; a truncated file or one from another config is a one-line error."""
    try:
        missing, unexpected = load_model(model, str(file), strict=False)
    except SafetensorError as e:
        raise AttnkitError(f"{file}: unreadable or truncated safetensors file ({e})") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        detail = next((line.strip() for line in first if "size mismatch" in line), first[-1] if first else "")
        raise AttnkitError(f"{file}: weights do not fit this model's config: {detail}") from None
    if missing or unexpected:
        raise AttnkitError(f"{file}: weights do not fit this model's config "
                           f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def load_checkpoint(path: str | Path):
    """-> (model in eval mode, config, tokenizers (or a captioner's vocabulary), checkpoint dir)."""
    from attnkit.train.tasks import task_class

    path = resolve_checkpoint(path)
    cfg = load_config(path / "config.toml")
    model, toks = task_class(cfg).restore(cfg, path)
    load_weights(model, path / "model.safetensors")
    model.eval()
    return model, cfg, toks, path


def read_trainer_state(path: Path) -> dict[str, torch.Tensor]:
    file = Path(path) / "trainer.safetensors"
    if not file.exists():
        raise AttnkitError(f"{file}: missing; this checkpoint cannot resume training")
    try:
        return load_file(str(file))
    except SafetensorError as e:
        raise AttnkitError(f"{file}: unreadable or truncated safetensors file ({e})") from None


def average_checkpoints(paths: list[Path], out: Path) -> Path:
    """Average the weights of several checkpoints of one run (Vaswani et al. average the last 5 or 20)."""
    if not paths:
        raise AttnkitError("no checkpoints to average")
    model, cfg, toks, _ = load_checkpoint(paths[0])
    params = dict(model.named_parameters())  # tied weights appear once
    total = {k: v.detach().double().clone() for k, v in params.items()}
    for p in paths[1:]:
        load_weights(model, resolve_checkpoint(p) / "model.safetensors")
        for k, v in params.items():
            total[k] += v.detach().double()
    with torch.no_grad():
        for k, v in params.items():
            v.copy_(total[k] / len(paths))
    meta = {**read_meta(resolve_checkpoint(paths[-1])), "averaged": [str(p) for p in paths]}
    files = [f for f in resolve_checkpoint(paths[-1]).iterdir()
             if f.name not in ("model.safetensors", "trainer.safetensors", "meta.json", "config.toml")]
    return write_checkpoint(out, model, cfg, files, meta)
