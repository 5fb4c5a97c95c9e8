"""What training adds to checkpoints (:mod:`attnkit.checkpoint`): the trainer's state for an exact resume, and
averaging the last checkpoints of a run."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnkit.checkpoint import (
    load_checkpoint,
    load_weights,
    point,
    read_meta,
    resolve_checkpoint,
    verify_files,
    write_checkpoint,
)
from attnkit.errors import AttnkitError

__all__ = ["average_checkpoints", "load_checkpoint", "load_weights", "point", "read_meta", "read_trainer_state",
           "resolve_checkpoint", "set_aside", "step_directories", "step_number", "write_checkpoint"]

STEP_NAME = re.compile(r"step-([0-9]+)")


def step_number(name: str) -> int | None:
    """N for a checkpoint named step-N; None for any other name (best, averaged, a set-aside step-N.damaged)."""
    match = STEP_NAME.fullmatch(name)
    return int(match[1]) if match else None


def step_directories(directory: Path) -> list[Path]:
    """The step-N checkpoint directories in ``directory``, oldest first. Names are matched whole: a glob such as
    ``step-*`` would also take a damaged checkpoint set aside as step-N.damaged."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    steps = [d for d in directory.iterdir() if step_number(d.name) is not None and d.is_dir()]
    return sorted(steps, key=lambda d: step_number(d.name))


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint directory to <name>.damaged (or .damaged-2, -3, ... where that exists), so that
    training neither overwrites, prunes nor averages it and its files stay as they are for inspection; -> the new
    path. Nothing that exists is replaced."""
    path = Path(path)
    n = 1
    while True:
        target = path.with_name(f"{path.name}.damaged" + (f"-{n}" if n > 1 else ""))
        if not (target.exists() or target.is_symlink()):
            break
        n += 1
    try:
        os.rename(path, target)  # on one filesystem: the files are not copied, so not changed
    except OSError as e:
        raise AttnkitError(f"{path}: damaged, and cannot be set aside as {target.name} ({e.strerror or e})") from None
    return target


def read_trainer_state(path: Path) -> dict[str, torch.Tensor]:
    file = Path(path) / "trainer.safetensors"
    if not file.exists():
        raise AttnkitError(f"{file}: missing; this checkpoint cannot resume training")
    try:
        return load_file(str(file))
    except SafetensorError as e:
        raise AttnkitError(f"{file}: unreadable or truncated safetensors file ({e})") from None


def check_average_output(paths: list[Path], out: Path, overwrite: bool = False) -> None:
    """Refuse an output that is one of the inputs (its trainer state would be lost) or, unless ``overwrite``,
    an existing file or non-empty directory."""
    out = Path(out)
    target = out.resolve()
    for p in paths:
        p = Path(p)
        inputs = {p.resolve()}
        try:
            inputs.add(resolve_checkpoint(p).resolve())
        except AttnkitError:
            pass
        if target in inputs:
            raise AttnkitError(f"--output {out}: is one of the checkpoints being averaged ({p}); write elsewhere")
    if overwrite:
        if out.exists() and not out.is_dir():
            raise AttnkitError(f"--output {out}: is a file, not a checkpoint directory")
        if out.is_dir() and any(out.iterdir()) and not (out / "model.safetensors").exists():
            raise AttnkitError(f"--output {out}: a non-empty directory that is not a checkpoint; "
                               "--overwrite replaces only a checkpoint")
        return
    if out.is_dir() and any(out.iterdir()):
        raise AttnkitError(f"--output {out}: a non-empty directory; choose another or pass --overwrite")
    if out.exists() and not out.is_dir():
        raise AttnkitError(f"--output {out}: exists and is not a directory")
    if not out.parent.is_dir():
        raise AttnkitError(f"--output {out}: its parent directory {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise AttnkitError(f"--output {out}: cannot write in {out.parent} (permission denied)")


def average_checkpoints(paths: list[Path], out: Path, overwrite: bool = True) -> Path:
    """Average the weights of several checkpoints of one run (Vaswani et al. average the last 5 or 20).
    ``out`` may never be one of ``paths``; an existing ``out`` is replaced only with ``overwrite`` (the trainer's
    ``checkpoints/averaged``), and then only if it is a checkpoint."""
    if not paths:
        raise AttnkitError("no checkpoints to average")
    check_average_output(paths, out, overwrite)
    model, cfg, toks, _ = load_checkpoint(paths[0])
    params = dict(model.named_parameters())  # tied weights appear once
    total = {k: v.detach().double().clone() for k, v in params.items()}
    for p in paths[1:]:
        p = resolve_checkpoint(p)
        verify_files(p, read_meta(p) if (p / "meta.json").exists() else {})  # a damaged input is refused
        load_weights(model, p / "model.safetensors")
        for k, v in params.items():
            total[k] += v.detach().double()
    with torch.no_grad():
        for k, v in params.items():
            v.copy_(total[k] / len(paths))
    meta = {**read_meta(resolve_checkpoint(paths[-1])), "averaged": [str(p) for p in paths]}
    files = [f for f in resolve_checkpoint(paths[-1]).iterdir()
             if f.name not in ("model.safetensors", "trainer.safetensors", "meta.json", "config.toml")]
    return write_checkpoint(out, model, cfg, files, meta)
