"""DistributedDataParallel and fully sharded data parallel on PyTorch's own engine: 2 gloo processes here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import made_once

pytestmark = pytest.mark.slow  # three 2-process training runs, then four resumed ones: a minute and a half

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


LEAVES = """
import atexit
import os
import torch.distributed as dist
from attnkit.train import distributed
say = lambda line: os.write(1, f"{line}\\n".encode())  # one write per line: the two ranks share stdout
gloo_workers = lambda: sum(open(f"/proc/self/task/{t}/comm").read().strip() == "pt_gloo_runloop"
                           for t in os.listdir("/proc/self/task"))
# registered before the group is joined, so it runs after distributed.leave
atexit.register(lambda: say(f"in the group at exit: {dist.is_initialized()}, gloo workers: {gloo_workers()}"))
rank, world = distributed.setup()
import torch.distributed.fsdp  # imported after joining, as the trainer does
say(f"sum of ranks: {distributed.all_sum(rank, world)}, gloo workers: {gloo_workers() > 0}")
"""


def test_each_rank_leaves_the_process_group_before_it_exits(tmp_path):
    """A rank whose gloo worker threads outlive Python can be killed by SIGABRT as Python shuts down, its work done:
    each rank leaves the group, and the group's threads are gone, before the interpreter's shutdown begins."""
    (tmp_path / "leaves.py").write_text(LEAVES)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "leaves.py"], cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("sum of ranks: 1.0, gloo workers: True") == 2, out.stdout
    assert out.stdout.count("in the group at exit: False, gloo workers: 0") == 2, out.stdout


def test_a_rank_ends_after_its_exit_handlers_with_its_status_and_its_output_flushed(tmp_path):
    """attnkit.train.distributed.end_process: the exit handlers run (leaving the group is one), what the rank
    printed reaches its pipe, and the process ends with the command's status, without the interpreter's
    finalization (which would have run an object's ``__del__``: the same script ending by SystemExit does)."""
    script = """import atexit, sys
from attnkit.train import distributed
class Kept:
    def __del__(self):  # called as finalization clears the module's names, else never
        print("finalized", file=sys.stderr)
kept = Kept()
atexit.register(print, "exit handler ran")
print("the rank's result", end="")  # buffered: no newline, a pipe
distributed.end_process(3)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "the rank's resultexit handler ran\n"
    assert "finalized" not in out.stderr
    control = subprocess.run([sys.executable, "-c", script.replace("distributed.end_process(3)", "sys.exit(3)")],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert control.returncode == 3 and "finalized" in control.stderr


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "last" / "model.safetensors"))


@pytest.fixture(scope="module")
def runs():
    """The same 3 updates three times: 2 ranks x 1 batch each under DDP and under FSDP, and 1 process
    accumulating the same 2 batches. Made once a test run (the tests only read them), though both of ``make
    test``'s workers run tests of this file."""

    def make(base: Path) -> None:
        (base / "tiny.toml").write_text('name = "tiny"\n')
        _run(["train", "tiny.toml", "--run-dir", "ddp", "--set", "train.max_steps=3", "--set", "train.save_every=3",
              *TINY], base, nproc=2)
        for run in ("single", "fsdp"):
            (base / run).mkdir()
            shutil.copy(base / "ddp" / "spm.model", base / run / "spm.model")  # one tokenizer for all
        _run(["train", "tiny.toml", "--run-dir", "fsdp", "--set", "train.max_steps=3", "--set", "train.save_every=3",
              "--set", "train.parallel=fsdp", *TINY], base, nproc=2)
        _run(["train", "tiny.toml", "--run-dir", "single", "--set", "train.max_steps=3", "--set",
              "train.save_every=3", "--set", "train.update_freq=2", *TINY], base)

    return made_once("distributed-runs", make)


def _assert_same_weights(run_a: Path, run_b: Path) -> None:
    a_weights, b_weights = _weights(run_a), _weights(run_b)
    assert a_weights.keys() == b_weights.keys()
    d = 32
    for k in a_weights:
        a, b = a_weights[k], b_weights[k]
        if k.endswith("in_proj.bias"):
            # softmax ignores the key bias (its gradient is 0 up to rounding, which Adam scales to +-lr)
            a, b = torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]])
        assert (a - b).abs().max() <= 1e-6, k


def _progress(run: Path) -> dict:
    return json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["progress"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process_on_the_whole_batch(runs, parallel):
    _assert_same_weights(runs / parallel, runs / "single")
    assert _progress(runs / parallel)["batch_in_epoch"] == _progress(runs / "single")["batch_in_epoch"] == 6


def test_fsdp_shards_the_weights_and_adam_moments(runs):
    """Each rank held about half of every block (the checkpoint holds them whole, as one process writes)."""
    trainer_state = load_file(str(runs / "fsdp" / "checkpoints" / "last" / "trainer.safetensors"))
    single_state = load_file(str(runs / "single" / "checkpoints" / "last" / "trainer.safetensors"))
    assert {k: v.shape for k, v in trainer_state.items() if k.startswith("optim.")} == \
        {k: v.shape for k, v in single_state.items() if k.startswith("optim.")}
    records = {run: json.loads((runs / run / "run.jsonl").read_text().splitlines()[0])
               for run in ("ddp", "fsdp", "single")}
    assert records["fsdp"]["parallel"] == "fsdp" and records["fsdp"]["world_size"] == 2
    whole = records["single"]["parameters_on_rank0"]
    assert whole > 1000 and records["ddp"]["parameters_on_rank0"] == whole
    assert 0.4 * whole < records["fsdp"]["parameters_on_rank0"] < 0.6 * whole


def test_checkpoints_resume_across_world_sizes_and_ddp_fsdp(runs, tmp_path):
    """DDP and FSDP checkpoints continue in one process (to the same weights), and a single-process checkpoint
    continues under DDP and under FSDP (to the same weights): the Adam moments are re-sharded exactly."""
    runs = Path(shutil.copytree(runs, tmp_path / "runs", symlinks=True))  # the other tests read the runs as trained
    shutil.copytree(runs / "single", runs / "single-fsdp", symlinks=True)
    for run in ("ddp", "fsdp"):
        _run(["train", "tiny.toml", "--run-dir", run, "--resume", "--set", "train.max_steps=4",
              "--set", "train.save_every=1", *TINY], runs)
    for run, parallel in (("single", "ddp"), ("single-fsdp", "fsdp")):
        _run(["train", "tiny.toml", "--run-dir", run, "--resume", "--set", "train.max_steps=4", "--set",
              "train.save_every=1", "--set", "train.update_freq=2", "--set", f"train.parallel={parallel}", *TINY],
             runs, nproc=2)
    for run in ("ddp", "fsdp", "single", "single-fsdp"):
        assert _progress(runs / run)["step"] == 4
    _assert_same_weights(runs / "ddp", runs / "fsdp")
    _assert_same_weights(runs / "single", runs / "single-fsdp")
    # and the step made a difference (the comparison above is not between unchanged weights)
    step3 = load_file(str(runs / "single" / "checkpoints" / "step-3" / "model.safetensors"))
    assert any((step3[k] - v).abs().max() > 1e-4 for k, v in _weights(runs / "single").items())


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_fine_tune_on_two_ranks_equals_one_process(tmp_path, tiny_bert_directory, data_dir, parallel):
    """A BERT classifier fine-tuned on 2 ranks (1 batch each per update) ends at the weights of 1 process
    accumulating the same 2 batches: the task's loss is summed over examples and scaled to their mean."""
    from conftest import write_glue_slice

    train, dev = write_glue_slice(data_dir, tmp_path / "data", "sst2", n_train=96, n_dev=24)
    (tmp_path / "clf.toml").write_text('name = "clf"\n')
    common = [f"model.pretrained={json.dumps(str(tiny_bert_directory))}", "model.family=bert_classifier",
              "data.format=labelled", f"data.train_file={json.dumps(str(train))}",
              f"data.valid_file={json.dumps(str(dev))}", "data.text_column=sentence", "train.optimizer=adamw",
              "train.lr=1e-3", "train.warmup_steps=1", "train.batch_size=8", "train.max_tokens=100000",
              "train.label_smoothing=0.0",
              "train.max_steps=3", "train.save_every=3", "train.eval_every=0", "model.dropout=0.0",
              "model.attention_dropout=0.0", "train.progress=false", "train.log_every=1", "train.clip_norm=0.0",
              f"train.parallel={parallel}"]
    args = [a for kv in common for a in ("--set", kv)]
    _run(["train", "clf.toml", "--run-dir", "two", *args], tmp_path, nproc=2)
    _run(["train", "clf.toml", "--run-dir", "one", "--set", "train.update_freq=2", *args], tmp_path)
    a, b = _weights(tmp_path / "two"), _weights(tmp_path / "one")
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if k.endswith("in_proj.bias"):  # the key bias: no gradient but rounding (see _assert_same_weights)
            x, y = torch.cat([x[:32], x[64:]]), torch.cat([y[:32], y[64:]])
        assert (x - y).abs().max() <= 1e-6, k
    start = load_file(str(tiny_bert_directory / "model.safetensors"))["embeddings.word_embeddings.weight"]
    assert (a["encoder.tokens.weight"] - start).abs().max() > 1e-4  # the steps changed the weights
    assert _progress(tmp_path / "two")["step"] == _progress(tmp_path / "one")["step"] == 3
