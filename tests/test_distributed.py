"""DistributedDataParallel on PyTorch's own engine: 2 gloo processes on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TINY = ["--set", "data.format=dates", "--set", "data.n_synthetic=400", "--set", "data.vocab_size=64",
        "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "model.n_heads=4",
        "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1", "--set", "model.dropout=0.0",
        "--set", "train.max_tokens=200", "--set", "train.warmup_steps=2", "--set", "train.lr=1e-3",
        "--set", "train.eval_every=0", "--set", "train.eval_bleu=false", "--set", "train.progress=false",
        "--set", "train.log_every=1", "--set", "train.clip_norm=0.0", "--set", "train.keep_last=3"]


def _run(args: list[str], cwd: Path, nproc: int = 1):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "attnkit", *args]
    else:
        cmd = [sys.executable, "-m", "attnkit", *args]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "last" / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 3 updates twice: 2 ranks x 1 batch each, and 1 process accumulating the same 2 batches."""
    base = tmp_path_factory.mktemp("ddp")
    (base / "tiny.toml").write_text('name = "tiny"\n')
    _run(["train", "tiny.toml", "--run-dir", "ddp", "--set", "train.max_steps=3", "--set", "train.save_every=3", *TINY],
         base, nproc=2)
    (base / "single").mkdir()
    shutil.copy(base / "ddp" / "spm.model", base / "single" / "spm.model")  # one tokenizer for both
    _run(["train", "tiny.toml", "--run-dir", "single", "--set", "train.max_steps=3", "--set", "train.save_every=3",
          "--set", "train.update_freq=2", *TINY], base)
    return base


def test_two_ranks_equal_one_process_on_the_whole_batch(runs):
    ddp, single = _weights(runs / "ddp"), _weights(runs / "single")
    assert ddp.keys() == single.keys()
    d = 32
    for k in ddp:
        a, b = ddp[k], single[k]
        if k.endswith("in_proj.bias"):
            # softmax ignores the key bias (its gradient is 0 up to rounding, which Adam scales to +-lr)
            a, b = torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]])
        assert (a - b).abs().max() <= 1e-6, k
    import json

    meta = [json.loads((r / "checkpoints" / "last" / "meta.json").read_text()) for r in (runs / "ddp", runs / "single")]
    assert meta[0]["progress"]["batch_in_epoch"] == meta[1]["progress"]["batch_in_epoch"] == 6


def test_checkpoints_resume_across_world_sizes(runs):
    """A DDP checkpoint continues in one process, and a single-process one under DDP."""
    _run(["train", "tiny.toml", "--run-dir", "ddp", "--resume", "--set", "train.max_steps=4",
          "--set", "train.save_every=1", *TINY], runs)
    _run(["train", "tiny.toml", "--run-dir", "single", "--resume", "--set", "train.max_steps=4", "--set",
          "train.save_every=1", "--set", "train.update_freq=2", *TINY], runs, nproc=2)
    import json

    for run in ("ddp", "single"):
        meta = json.loads((runs / run / "checkpoints" / "last" / "meta.json").read_text())
        assert meta["progress"]["step"] == 4
