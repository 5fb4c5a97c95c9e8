"""Issue 23's kill test: a tiny model trained by `attnkit train` in a subprocess, SIGKILLed at several moments
(some inside checkpoint writes, held open by ATTNKIT_TEST_CHECKPOINT_SLEEP), resumed each time, ends
bit-identical (weights, Adam moments, RNG state) to an uninterrupted run, every checkpoint loadable, no temporary
debris left."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from attnkit.checkpoint import load_checkpoint, verify_files
from attnkit.config import dump_toml
from conftest import tiny_experiment

MAX_STEPS = 10


def _command(config: Path, run: Path, resume: bool) -> list[str]:
    return [sys.executable, "-m", "attnkit", "train", str(config), "--run-dir", str(run), "--threads", "1"] + \
        (["--resume"] if resume else [])


def _env(sleep: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNKIT_TEST_CHECKPOINT_SLEEP": str(sleep)}
    env.pop("ATTNKIT_DEBUG", None)
    return env


def _steps(ckpts: Path) -> list[int]:
    if not ckpts.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in ckpts.glob("step-*") if p.name[5:].isdigit())


def _writing(ckpts: Path) -> bool:
    return ckpts.is_dir() and any(p.name.startswith(".tmp-") for p in ckpts.iterdir())


def _run_until(config: Path, run: Path, condition, then_wait: float = 0.0, timeout: float = 60.0) -> bool:
    """Start (or resume) the run, SIGKILL it once ``condition(checkpoints dir)`` holds (after ``then_wait``
    seconds); -> whether it was killed (False: it finished first)."""
    ckpts = run / "checkpoints"
    resume = (ckpts / "last").exists()
    proc = subprocess.Popen(_command(config, run, resume), env=_env(0.3), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if condition(ckpts):
                time.sleep(then_wait)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.005)
        err = proc.stderr.read().decode()
        assert proc.wait() == 0, err
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _state(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    last = (run / "checkpoints" / "last").resolve()
    return {"model": load_file(str(last / "model.safetensors")),
            "trainer": load_file(str(last / "trainer.safetensors"))}


def test_sigkill_at_random_moments_then_resume_is_bit_identical(tmp_path):
    cfg = tiny_experiment(max_steps=MAX_STEPS, save_every=1, keep_last=3)
    cfg.data.n_synthetic = 300
    config = tmp_path / "tiny.toml"
    config.write_text(dump_toml(cfg))

    reference = tmp_path / "reference"
    subprocess.run(_command(config, reference, False), env=_env(0), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)

    run = tmp_path / "killed"
    rng = random.Random(23)
    moments = [
        ("inside the very first checkpoint write", lambda c: _writing(c), 0.0),
        ("inside a write after step 3", lambda c: max(_steps(c), default=0) >= 3 and _writing(c), rng.uniform(0, .2)),
        ("between writes after step 5", lambda c: max(_steps(c), default=0) >= 5 and not _writing(c),
         rng.uniform(0, .05)),
        ("inside a write after step 7", lambda c: max(_steps(c), default=0) >= 7 and _writing(c), rng.uniform(0, .2)),
    ]
    killed = 0
    for _, condition, wait in moments:
        killed += _run_until(config, run, condition, wait)
    assert killed >= 3
    while not ((run / "checkpoints" / "last").exists() and _steps(run / "checkpoints")[-1:] == [MAX_STEPS]):
        _run_until(config, run, lambda c: False)

    ckpts = run / "checkpoints"
    debris = [p.name for p in ckpts.iterdir() if p.name.startswith(".")]
    assert debris == [], debris
    assert sorted(p.name for p in ckpts.iterdir()) == sorted(p.name for p in (reference / "checkpoints").iterdir())
    for directory in ckpts.iterdir():
        verify_files(directory.resolve(), resuming=directory.name != "averaged")
        load_checkpoint(directory)
    mine, theirs = _state(run), _state(reference)
    for part in ("model", "trainer"):
        assert mine[part].keys() == theirs[part].keys()
        for key, value in theirs[part].items():
            assert torch.equal(mine[part][key], value), (part, key)
