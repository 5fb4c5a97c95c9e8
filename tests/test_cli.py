"""The command line: --version, streaming translation through a pipe, --threads everywhere and its default
(attnkit.threads, on fake /proc/stat samples), and the progress bar's ETA under a time budget."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import attnkit
from attnkit import threads
from attnkit.cli import StreamLines, build_parser, main
from attnkit.errors import AttnkitError
from attnkit.train import Progress

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def attnkit_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "attnkit", *map(str, args)]


# --- --version

def test_version_prints_the_package_version():
    out = subprocess.run(attnkit_cmd("--version"), capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"attnkit {attnkit.__version__}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", attnkit.__version__)


# --- streaming translation

def end(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs (a test that failed midway), and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


class LineReader:
    """Reads lines from a pipe with a timeout (no blocking readline that could hang the test)."""

    def __init__(self, stream):
        self.fd, self.buffer = stream.fileno(), b""

    def readline(self, timeout: float) -> str:
        import select

        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError(f"no line within {timeout} s (so far {self.buffer!r})")
            data = os.read(self.fd, 4096)
            if not data:
                raise EOFError(f"the process closed its output (so far {self.buffer!r})")
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8")


def test_translate_streams_line_by_line_through_a_pipe(trained_checkpoint, tmp_path):
    sources = ["1 May 2000", "March 4, 1997", "the 3rd of june 1985"]
    batch = tmp_path / "in.txt"
    batch.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    expected = subprocess.run(attnkit_cmd("translate", "--checkpoint", trained_checkpoint, "--beam", "1",
                                          "--input", batch, "--threads", "1"),
                              capture_output=True, text=True, env=ENV, timeout=300)
    assert expected.returncode == 0, expected.stderr
    expected_lines = expected.stdout.splitlines()
    assert len(expected_lines) == len(sources)

    proc = subprocess.Popen(attnkit_cmd("translate", "--checkpoint", trained_checkpoint, "--beam", "1",
                                        "--threads", "1"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        reader = LineReader(proc.stdout)
        for i, (source, want) in enumerate(zip(sources, expected_lines)):
            proc.stdin.write((source + "\n").encode("utf-8"))
            proc.stdin.flush()  # the next line is written only after this one's translation came back
            assert reader.readline(timeout=300 if i == 0 else 60) == want
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    finally:
        end(proc)


def test_translate_invalid_utf8_on_stdin_is_a_one_line_error(trained_checkpoint):
    out = subprocess.run(attnkit_cmd("translate", "--checkpoint", trained_checkpoint, "--beam", "1", "--threads", "1"),
                         input=b"1 May 2000\n\xff\xfe 1997\n", capture_output=True, env=ENV, timeout=300)
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("attnkit: error: stdin: line 2 is not UTF-8"), err


def test_translate_in_chunks_while_compiling_writes_what_one_call_does(trained_checkpoint, tmp_path, monkeypatch,
                                                                         capsys):
    """With --compile a file is translated in chunks (here of 3 sentences), each through Model.translate, while the
    model compiles in the background (here a compile that never takes over, so each chunk decodes eagerly): the
    lines are those one Model.translate call gives, in input order, one best and n-best alike."""
    import threading

    import attnkit.cli.decode
    from attnkit.api import Model
    from attnkit.data import generate_dates

    sources = generate_dates(7, seed=3).src
    path = tmp_path / "in.txt"
    path.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    compiles, chunks = [], []

    def compile_in_background(self, **options):
        compiles.append(options)
        self.compiling = threading.Thread(target=lambda: None)
        self.compiling.start()
        return self

    translate = Model.translate

    def counting(self, sentences, **options):
        chunks.append(len(sentences))
        return translate(self, sentences, **options)

    monkeypatch.setattr(Model, "compile", compile_in_background)
    monkeypatch.setattr(Model, "translate", counting)
    monkeypatch.setattr(attnkit.cli.decode, "TRANSLATE_CHUNK", 3)
    whole = attnkit.load(trained_checkpoint).translate(sources, beam=2, n_best=2, details=True)
    assert chunks == [7]
    for n_best in (1, 2):
        chunks.clear()
        assert main(["translate", "--checkpoint", str(trained_checkpoint), "--input", str(path), "--beam", "2",
                     "--n-best", str(n_best), "--compile"]) == 0
        assert chunks == [3, 3, 1]
        lines = capsys.readouterr().out.splitlines()
        if n_best == 1:
            assert lines == [t.text[0] for t in whole]
        else:
            assert lines == [f"{h.score:.4f}\t{text}" for t in whole for h, text in zip(t.hypotheses, t.text)]
    assert compiles == [{"freeze": True, "beams": (2,), "background": True}] * 2
    chunks.clear()
    assert main(["translate", "--checkpoint", str(trained_checkpoint), "--input", str(path), "--beam", "2"]) == 0
    assert chunks == [7]  # not compiling: the whole file at once, batched by length as a whole
    assert capsys.readouterr().out.splitlines() == [t.text[0] for t in whole]


def test_compile_refuses_a_run_that_is_not_there_in_one_line(tmp_path, capsys):
    """`attnkit compile RUN` of a missing run: exit status 2 and one line naming it (what it compiles and where it keeps
    it: tests/test_end_to_end.py, on the run it trains)."""
    assert main(["compile", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and err.strip().count("\n") == 0, err


def _pipe_with(data: bytes) -> tuple[int, int]:
    r, w = os.pipe()
    os.write(w, data)
    return r, w


def test_evaluate_prints_the_papers_bleu_beside_sacrebleu_and_chrf(trained_checkpoint, dates_pairs, tmp_path, capsys):
    from attnkit.evaluate import paper_bleu

    src, ref, hyps, scores = (tmp_path / name for name in ("src.txt", "ref.txt", "hyps.txt", "scores.json"))
    src.write_text("".join(s + "\n" for s in dates_pairs.src[:6]), encoding="utf-8")
    ref.write_text("".join(t + "\n" for t in dates_pairs.tgt[:6]), encoding="utf-8")
    assert main(["evaluate", "--checkpoint", str(trained_checkpoint), "--src", str(src), "--ref", str(ref),
                 "--beam", "1", "--output", str(hyps), "--json", str(scores), "--moses-lang", "en"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" = ")[0] for line in lines] == ["BLEU", "BLEU4", "chrF2"]
    result = json.loads(scores.read_text())
    expected = paper_bleu(hyps.read_text(encoding="utf-8").splitlines(), dates_pairs.tgt[:6], "en")
    assert lines[1] == str(expected)
    assert result["paper_bleu"] == expected.score and result["paper_bleu_precisions"] == expected.precisions
    assert result["paper_bleu_bp"] == expected.bp and result["paper_bleu_signature"].startswith("lc+moses:en+")


def test_stream_lines_takes_what_is_ready_then_waits():
    r, w = _pipe_with(b"a b\nc\r\nd")
    try:
        lines = iter(StreamLines(r, max_tokens=100))
        assert next(lines) == ["a b", "c"]  # "d" has no newline yet: not a line
        os.write(w, b" e\nf\n")
        assert next(lines) == ["d e", "f"]
        os.write(w, b"g")
        os.close(w)
        w = None
        assert next(lines) == ["g"]  # the last line, without its newline
        assert next(lines, None) is None
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_stream_lines_chunks_are_about_max_tokens():
    r, w = _pipe_with(b"".join(b"w w w\n" for _ in range(10)))  # 4 tokens a line
    os.close(w)
    try:
        assert [len(c) for c in StreamLines(r, max_tokens=10)] == [3, 3, 3, 1]
    finally:
        os.close(r)


def test_stream_lines_names_the_line_that_is_not_utf8():
    r, w = _pipe_with(b"ok\n\xe9t\xe9\n")
    os.close(w)
    try:
        with pytest.raises(AttnkitError, match=r"^stdin: line 2 is not UTF-8 \(byte 0xe9 at byte 1"):
            list(StreamLines(r))
    finally:
        os.close(r)


# --- --threads

def _leaf_commands(parser: argparse.ArgumentParser, prefix=()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(prefix, parser)]
    return [leaf for a in subs for name, p in a.choices.items() for leaf in _leaf_commands(p, (*prefix, name))]


def test_every_subcommand_takes_threads(capsys):
    leaves = _leaf_commands(build_parser())
    names = {" ".join(path) for path, _ in leaves}
    assert {"train", "translate", "evaluate", "demo", "bench complexity", "average"} <= names
    for path, parser in leaves:
        [action] = [a for a in parser._actions if "--threads" in a.option_strings]
        assert action.type("3") == 3, path
        with pytest.raises(SystemExit) as e:
            main([*path, "--help"])
        assert e.value.code == 0
        assert "--threads" in capsys.readouterr().out, path
    args = build_parser().parse_args(["translate", "--checkpoint", "x", "--threads", "3"])
    assert args.threads == 3
    assert build_parser().parse_args(["demo", "--threads", "2", "--steps", "5"]).threads == 2
    assert build_parser().parse_args(["bench", "complexity", "--threads", "2"]).threads == 2
    assert build_parser().parse_args(["bench", "complexity"]).threads == 1  # its own default


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _record_threads(monkeypatch) -> list[int]:
    seen: list[int] = []

    def fake_average(args):
        seen.append(torch.get_num_threads())
        return 0

    monkeypatch.setattr("attnkit.cli.export.cmd_average", fake_average)  # the function the parser is built with
    return seen


def test_threads_is_applied_before_the_command_runs(monkeypatch, torch_threads):
    seen = _record_threads(monkeypatch)
    assert main(["average", "a", "-o", "b", "--threads", "2"]) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["average", "a", "-o", "b"]) == 0  # the environment's choice when --threads is not given
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(threads, "measure_default_threads", lambda: 3)
    assert main(["average", "a", "-o", "b"]) == 0  # neither: the measured default
    assert seen == [2, 1, 3]


def test_threads_below_one_is_a_usage_error(capsys):
    assert main(["average", "a", "-o", "b", "--threads", "0"]) == 2
    assert capsys.readouterr().err == "attnkit: error: argument --threads: expected an integer of at least 1, got '0'\n"


# --- option ranges: each an argparse type, written once

@pytest.mark.parametrize("argv, option, expected, bad", [
    (["translate", "--checkpoint", "x"], "--beam", "an integer of at least 1", ["0", "-3", "1.5", "two"]),
    (["generate", "--checkpoint", "x"], "--max-new-tokens", "an integer of at least 0", ["-1", "ten"]),
    (["serve", "x"], "--port", "an integer from 1 to 65535", ["0", "65536", "http"]),
    (["translate", "--checkpoint", "x"], "--len-penalty", "a finite number", ["nan", "inf", "high"]),
    (["serve", "x"], "--max-wait-ms", "a finite number of at least 0", ["-1", "nan", "inf"]),
    (["serve", "x"], "--timeout", "a finite number above 0", ["0", "-2.5", "nan", "inf"]),
    (["data", "fetch", "all"], "--timeout", "a finite number above 0", ["0", "nan"]),
    (["generate", "--checkpoint", "x"], "--top-p", "a number above 0 and at most 1", ["0", "1.5", "nan"]),
], ids=["at_least", "at_least_0", "at_least_up_to", "finite_float", "finite_nonnegative", "positive_float",
        "positive_float_data_fetch", "probability_mass"])
def test_an_option_out_of_range_is_refused_by_its_type_in_one_line(argv, option, expected, bad, capsys):
    """Refused while the command line is parsed, before anything is loaded (the checkpoint "x" does not exist): one
    line naming the option and the value, exit status 2."""
    for value in bad:
        assert main([*argv, option, value]) == 2, value
        assert capsys.readouterr().err == f"attnkit: error: argument {option}: expected {expected}, got {value!r}\n"


def test_the_range_types_return_the_values_they_accept():
    from attnkit.cli.common import at_least, finite_float, finite_nonnegative, positive_float, probability_mass

    assert at_least(1)("3") == 3 and at_least(0)("0") == 0 and at_least(1, 65535)("65535") == 65535
    assert finite_float("-1.5") == -1.5 and finite_nonnegative("0") == 0.0 and positive_float("0.25") == 0.25
    assert probability_mass("1") == 1.0 and probability_mass("0.9") == 0.9


def test_train_threads_flag_overrides_the_config(monkeypatch, tmp_path):
    seen = {}

    def fake_load_config(path, overrides):
        seen["overrides"] = list(overrides)
        raise AttnkitError("stop here")

    monkeypatch.setattr("attnkit.config.load_config", fake_load_config)
    monkeypatch.setattr(threads, "apply_threads", lambda n: None)
    assert main(["train", "x.toml", "--threads", "1", "--set", "train.lr=1"]) == 2
    assert seen["overrides"] == ["train.lr=1", "train.threads=1"]


# --- the default thread count (fake /proc/stat samples)

def _proc_stat(*cpus: tuple[int, int, int, int]) -> str:
    """A /proc/stat text with one line per core: (user, system, idle, iowait) jiffies; the aggregate first."""
    lines = ["cpu  " + " ".join(str(sum(c[i] for c in cpus)) for i in range(4)) + " 0 0 0 0 0 0"]
    for n, (user, system, idle, iowait) in enumerate(cpus):
        lines.append(f"cpu{n} {user} 0 {system} {idle} {iowait} 0 0 0 0 0")
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99", "btime 1", "processes 5"]) + "\n"


QUIET = (_proc_stat((100, 50, 1000, 10), (80, 40, 1000, 5)),
         _proc_stat((101, 50, 1014, 10), (81, 40, 1014, 5)))  # 15 jiffies each, 1 busy
ONE_BUSY = (_proc_stat((100, 50, 1000, 10), (80, 40, 1000, 5)),
            _proc_stat((101, 50, 1014, 10), (94, 41, 1000, 5)))  # cpu1: 15 of 15 busy


def test_parse_proc_stat_reads_the_per_core_lines():
    stat = threads.parse_proc_stat(QUIET[0])
    assert stat == {0: (150, 1160), 1: (120, 1125)}  # busy: user + nice + system + irq + softirq + steal


def test_default_threads_on_a_quiet_machine_uses_every_core():
    before, after = map(threads.parse_proc_stat, QUIET)
    assert threads.busy_cores(before, after, [0, 1]) == pytest.approx(2 / 15)
    assert threads.default_threads([0, 1], before, after) == 2


def test_default_threads_leaves_out_a_core_another_process_keeps_busy():
    before, after = map(threads.parse_proc_stat, ONE_BUSY)
    assert threads.busy_cores(before, after, [0, 1]) == pytest.approx(16 / 15)
    assert threads.default_threads([0, 1], before, after) == 1
    # only the cores this process may use count, and their busy ones
    assert threads.default_threads([0], before, after) == 1
    assert threads.busy_cores(before, after, [0]) == pytest.approx(1 / 15)


def test_default_threads_takes_out_this_process_own_time():
    before, after = map(threads.parse_proc_stat, ONE_BUSY)
    assert threads.busy_cores(before, after, [0, 1], own_jiffies=15) == pytest.approx(1 / 15)
    assert threads.default_threads([0, 1], before, after, own_jiffies=15) == 2


def test_choose_threads_rounds_busy_cores_half_up_and_keeps_one():
    assert threads.choose_threads(8, 0.0) == 8
    assert threads.choose_threads(8, 0.49) == 8
    assert threads.choose_threads(8, 0.5) == 7
    assert threads.choose_threads(8, 2.6) == 5
    assert threads.choose_threads(2, 5.0) == 1
    assert threads.choose_threads(1, 0.0) == 1


def test_usable_cores_cgroup_quota_and_local_ranks():
    assert threads.usable_cores(range(8)) == 8
    assert threads.usable_cores(range(8), "max 100000") == 8
    assert threads.usable_cores(range(8), "250000 100000") == 2
    assert threads.usable_cores(range(8), "50000 100000") == 1
    assert threads.usable_cores(range(8), local_world_size=2) == 4
    assert threads.usable_cores(range(2), local_world_size=4) == 1
    assert threads.usable_cores(range(8), "garbage") == 8


def test_default_threads_without_proc_stat_uses_the_load_average():
    assert threads.default_threads(range(4), None, None, loadavg=1.2) == 3
    assert threads.default_threads(range(4), None, None) == 4


def test_resolve_threads_order(monkeypatch):
    monkeypatch.setattr(threads, "measure_default_threads", lambda sample_seconds=0: 5)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.resolve_threads(3) == (3, "--threads")
    assert threads.resolve_threads(None) == (2, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert threads.resolve_threads(None) == (5, "free cores")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads.resolve_threads(None) == (5, "free cores")


def test_measure_default_threads_on_this_machine_is_in_range():
    n = threads.measure_default_threads(sample_seconds=0.05)
    assert 1 <= n <= len(os.sched_getaffinity(0))


# --- the progress bar's ETA under a time budget

def test_eta_is_the_budget_left_when_the_budget_ends_the_run_first():
    # the Multi30k recipe: max_steps = 100,000 under max_minutes = 60, at 2.5 steps/s
    p = Progress(step=1500, train_seconds=600.0)
    by_steps = (100_000 - 1500) / 2.5  # 11 hours
    assert p.eta_seconds(100_000, 0, 2.5) == pytest.approx(by_steps)
    assert p.eta_seconds(100_000, 60, 2.5) == pytest.approx(3000.0)  # 50 minutes of the budget left
    assert p.expected_total(100_000, 60, 2.5) == 1500 + 7500
    assert p.expected_total(100_000, 0, 2.5) == 100_000


def test_eta_is_the_step_estimate_when_the_steps_end_the_run_first():
    p = Progress(step=2900, train_seconds=120.0)  # the demo: 3000 steps or 2.5 minutes
    assert p.eta_seconds(3000, 2.5, 20.0) == pytest.approx(5.0)
    assert p.expected_total(3000, 2.5, 20.0) == 3000


def test_eta_before_a_rate_is_known_and_past_the_budget():
    assert Progress().eta_seconds(100, 0, None) is None
    assert Progress().eta_seconds(100, 1.0, None) == pytest.approx(60.0)
    assert Progress().expected_total(100, 1.0, None) is None  # no total (and no ETA) until a rate is measured
    assert Progress().expected_total(100, 0, None) == 100
    done = Progress(step=50, train_seconds=90.0)
    assert done.eta_seconds(100, 1.0, 1.0) == 0.0
    assert done.expected_total(100, 1.0, 1.0) == 50
    assert Progress(step=120).expected_total(100) == 120


def test_progress_bar_total_follows_the_time_budget(dates_pairs, capsys, tmp_path):
    from attnkit.data import generate_dates
    from attnkit.train import Trainer
    from conftest import tiny_experiment

    cfg = tiny_experiment(max_steps=100_000, max_minutes=0.02, progress=True)  # 1.2 s of training
    trainer = Trainer(cfg, tmp_path, train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1))
    result = trainer.train()
    err = capsys.readouterr().err
    totals = [int(t) for t in re.findall(r"\d+/(\d+) \[", err)]
    assert totals and "100000" not in err, err
    assert abs(totals[-1] - result["step"]) <= max(2, result["step"] // 10), (totals, result)
