"""A damaged checkpoint is set aside, never overwritten: ``train --resume`` on a run whose newest checkpoint is
damaged renames it to step-N.damaged (its files kept byte for byte), resumes from the newest intact one, says so in
one warning line, and nothing later in the run (saving, pruning, averaging, best) writes, removes or reads it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from attnkit.checkpoint import checkpoint_is_intact, read_meta
from attnkit.cli import main
from attnkit.config import dump_toml
from attnkit.train.checkpoint import step_directories
from conftest import tiny_experiment


def _config(root: Path) -> Path:
    """Checkpoints every 2 steps, each validated (so ``best`` moves), the last two averaged at the end."""
    cfg = tiny_experiment(max_steps=4, save_every=2, eval_every=2, keep_last=3, average_last=2)
    cfg.data.n_synthetic = 300
    path = root / "tiny.toml"
    path.write_text(dump_toml(cfg), encoding="utf-8")
    return path


def _train(config: Path, run: Path, capsys, *more: str) -> list[str]:
    """Run ``attnkit train``; -> its stderr lines that are attnkit's messages."""
    capsys.readouterr()
    code = main(["train", str(config), "--run-dir", str(run), *more])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("attnkit:")]


def _resume(config: Path, run: Path, capsys, max_steps: int) -> list[str]:
    return _train(config, run, capsys, "--resume", "--set", f"train.max_steps={max_steps}")


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(f.relative_to(directory)): f.read_bytes() for f in sorted(directory.rglob("*")) if f.is_file()}


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 3])


@pytest.fixture
def run(tmp_path, capsys) -> tuple[Path, Path]:
    """(config, run directory) of a 4-step run: checkpoints/step-2, step-4, last -> step-4, best, averaged."""
    config, run = _config(tmp_path), tmp_path / "run"
    assert _train(config, run, capsys) == []
    ckpts = run / "checkpoints"
    assert [d.name for d in step_directories(ckpts)] == ["step-2", "step-4"]
    assert (ckpts / "last").resolve().name == "step-4"
    return config, run


def _assert_links_intact(ckpts: Path) -> None:
    for name in ("last", "best"):
        link = ckpts / name
        assert link.is_symlink() and link.exists(), name
        target = link.resolve()
        assert target.parent == ckpts.resolve() and target.name.startswith("step-"), (name, target)
        assert not target.name.endswith(".damaged") and checkpoint_is_intact(target), (name, target)


def _assert_set_aside(ckpts: Path, warnings: list[str], snapshot: dict[str, bytes], file: str) -> None:
    """step-4 was set aside as step-4.damaged, unchanged; the run went on from step-2 past it."""
    damaged, moved = ckpts / "step-4", ckpts / "step-4.damaged"
    assert len(warnings) == 1, warnings
    line = warnings[0]
    assert line.startswith("attnkit: warning: "), line
    assert f"{damaged} is damaged ({file}" in line, line
    assert f"moved to {moved};" in line, line
    assert line.endswith("resuming from step-2, the newest intact checkpoint"), line
    assert _snapshot(moved) == snapshot  # every file, byte for byte, and nothing added
    assert not (ckpts / "step-4.damaged-2").exists()
    # step-4 is the resumed run's own, written after the set-aside: complete and intact
    assert checkpoint_is_intact(damaged) and read_meta(damaged)["progress"]["step"] == 4
    assert [d.name for d in step_directories(ckpts)] == ["step-4", "step-6", "step-8"]
    assert (ckpts / "last").resolve().name == "step-8"
    _assert_links_intact(ckpts)
    averaged = read_meta(ckpts / "averaged")["averaged"]
    assert [Path(p).name for p in averaged] == ["step-6", "step-8"]


def _assert_second_resume_leaves_it(config: Path, run: Path, capsys) -> None:
    ckpts = run / "checkpoints"
    before = _snapshot(ckpts / "step-4.damaged")
    assert _resume(config, run, capsys, 10) == []  # nothing damaged now: no warning
    assert _snapshot(ckpts / "step-4.damaged") == before
    assert sorted(p.name for p in ckpts.iterdir() if ".damaged" in p.name) == ["step-4.damaged"]
    assert (ckpts / "last").resolve().name == "step-10"
    _assert_links_intact(ckpts)


@pytest.mark.parametrize("file", ["meta.json", "model.safetensors", "trainer.safetensors"])
def test_a_damaged_checkpoint_is_set_aside_and_training_goes_on(file, run, capsys):
    """meta.json cut short (invalid JSON: the other files are intact), the weights truncated, or the trainer
    state (optimizer moments, RNG) truncated."""
    config, run = run
    ckpts = run / "checkpoints"
    _truncate(ckpts / "step-4" / file)
    snapshot = _snapshot(ckpts / "step-4")
    warnings = _resume(config, run, capsys, 8)
    _assert_set_aside(ckpts, warnings, snapshot, file)
    _assert_second_resume_leaves_it(config, run, capsys)


def test_a_dangling_last_is_repointed_and_training_goes_on(run, capsys):
    """``last`` (and ``best``) pointing at a step-N that is gone: nothing to set aside."""
    config, run = run
    ckpts = run / "checkpoints"
    shutil.rmtree(ckpts / "step-4")
    assert (ckpts / "last").is_symlink() and not (ckpts / "last").exists()
    warnings = _resume(config, run, capsys, 8)
    assert warnings == [f"attnkit: warning: {ckpts / 'last'} points at step-4, which is missing; resuming from "
                        "step-2, the newest intact checkpoint"]
    assert not any(".damaged" in p.name for p in ckpts.iterdir())
    assert [d.name for d in step_directories(ckpts)] == ["step-4", "step-6", "step-8"]
    assert (ckpts / "last").resolve().name == "step-8"
    _assert_links_intact(ckpts)


def test_every_newer_damaged_checkpoint_is_set_aside_and_nothing_is_overwritten(tmp_path, capsys):
    """Two damaged checkpoints newer than the intact one both go aside; a step-6.damaged from an earlier time
    stays as it was, the new one becoming step-6.damaged-2."""
    config, run = _config(tmp_path), tmp_path / "run"
    _train(config, run, capsys, "--set", "train.max_steps=6")
    ckpts = run / "checkpoints"
    _truncate(ckpts / "step-4" / "model.safetensors")
    (ckpts / "step-6" / "meta.json").write_text("{", encoding="utf-8")
    earlier = ckpts / "step-6.damaged"
    earlier.mkdir()
    (earlier / "note.txt").write_text("set aside before", encoding="utf-8")
    snapshots = {name: _snapshot(ckpts / name) for name in ("step-4", "step-6", "step-6.damaged")}
    warnings = _resume(config, run, capsys, 8)
    assert len(warnings) == 1, warnings
    assert f"{ckpts / 'step-6'} is damaged (meta.json: invalid JSON" in warnings[0]
    assert f"moved to {ckpts / 'step-6.damaged-2'}; {ckpts / 'step-4'} is damaged (model.safetensors" in warnings[0]
    assert warnings[0].endswith(f"moved to {ckpts / 'step-4.damaged'}; resuming from step-2, the newest intact "
                                "checkpoint")
    assert _snapshot(ckpts / "step-4.damaged") == snapshots["step-4"]
    assert _snapshot(ckpts / "step-6.damaged-2") == snapshots["step-6"]
    assert _snapshot(ckpts / "step-6.damaged") == snapshots["step-6.damaged"]
    assert [d.name for d in step_directories(ckpts)] == ["step-4", "step-6", "step-8"]
    _assert_links_intact(ckpts)


def _trainer(run: Path, **train):
    from attnkit.data import generate_dates
    from attnkit.train import Trainer

    cfg = tiny_experiment(**{"save_every": 2, "eval_every": 2, "keep_last": 3, "average_last": 2, **train})
    return Trainer(cfg, run, train_pairs=generate_dates(300), valid_pairs=generate_dates(20, seed=1))


def test_best_at_a_damaged_checkpoint_is_repointed_at_the_intact_one_with_the_best_score(run):
    _, run = run
    ckpts = run / "checkpoints"
    losses = {name: read_meta(ckpts / name)["scores"]["valid_loss"] for name in ("step-2", "step-4")}
    assert losses["step-4"] < losses["step-2"] and (ckpts / "best").resolve().name == "step-4"
    _truncate(ckpts / "step-4" / "model.safetensors")
    trainer = _trainer(run, max_steps=8)
    trainer.resume(run)
    assert trainer.progress.step == 2 and trainer.progress.best_score == -losses["step-2"]
    assert (ckpts / "step-4.damaged").is_dir() and not (ckpts / "step-4").exists()
    assert (ckpts / "best").resolve().name == "step-2" and (ckpts / "last").resolve().name == "step-2"


def test_a_damaged_older_checkpoint_the_run_keeps_is_set_aside(run, capsys):
    """``best`` at an older checkpoint the resumed progress still lists: set aside (averaging would read it,
    pruning delete it), dropped from the list, and ``best`` removed when no intact checkpoint holds the best
    score recorded (the next better validation sets it again)."""
    from attnkit.checkpoint import record_files

    _, run = run
    ckpts = run / "checkpoints"
    meta = read_meta(ckpts / "step-4")
    assert meta["progress"]["history"] == ["step-2", "step-4"]
    best_score = -read_meta(ckpts / "step-2")["scores"]["valid_loss"]
    (ckpts / "step-4" / "meta.json").write_text(json.dumps({**meta, "progress": {**meta["progress"],
                                                                                 "best_score": best_score}}))
    record_files(ckpts / "step-4")  # step-4, edited on purpose, stays intact
    (ckpts / "best").unlink()
    os.symlink("step-2", ckpts / "best")
    _truncate(ckpts / "step-2" / "trainer.safetensors")
    snapshot = _snapshot(ckpts / "step-2")
    trainer = _trainer(run, max_steps=6, average_last=3)
    capsys.readouterr()
    trainer.resume(run)
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [f"attnkit: warning: {ckpts / 'step-2'} is damaged (trainer.safetensors: damaged: "
                        f"{len(snapshot['trainer.safetensors'])} bytes where meta.json records "
                        f"{meta['files']['trainer.safetensors']['size']}); moved to {ckpts / 'step-2.damaged'}; "
                        "resuming from step-4"]
    assert trainer.progress.history == ["step-4"]
    assert not (ckpts / "best").is_symlink() and (ckpts / "last").resolve().name == "step-4"
    trainer.train()
    assert _snapshot(ckpts / "step-2.damaged") == snapshot
    assert [Path(p).name for p in read_meta(ckpts / "averaged")["averaged"]] == ["step-4", "step-6"]
    assert (ckpts / "last").resolve().name == "step-6"
    if (ckpts / "best").is_symlink():
        assert checkpoint_is_intact((ckpts / "best").resolve())


def test_only_rank_0_sets_a_damaged_checkpoint_aside(run, capsys):
    """Under torchrun every rank resumes; the others only read."""
    _, run = run
    ckpts = run / "checkpoints"
    _truncate(ckpts / "step-4" / "model.safetensors")
    before = _snapshot(ckpts)
    trainer = _trainer(run, max_steps=8)
    trainer.rank = 1
    capsys.readouterr()
    trainer.resume(run)
    assert trainer.progress.step == 2
    assert capsys.readouterr().err == ""
    assert _snapshot(ckpts) == before and not (ckpts / "step-4.damaged").exists()
