"""A results JSON names the commit it was measured at and says whether the working tree held changes beside it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from attnkit.evaluate.results import git_commit, working_tree_dirty, write_results


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=attnkit", "-c", "user.email=attnkit@example.com", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def _written(repo: Path) -> dict:
    path = write_results(repo / "bench" / "results" / "probe.json", "probe", "python bench/probe.py", {"x": 1})
    return json.loads(path.read_text(encoding="utf-8"))


def test_a_results_json_says_whether_the_working_tree_had_uncommitted_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above the ones made here
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "code.py").write_text("x = 1\n", encoding="utf-8")
    (repo / ".gitignore").write_text("runs/\n", encoding="utf-8")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "code")
    head = _git(repo, "rev-parse", "HEAD")
    monkeypatch.chdir(repo)

    record = _written(repo)  # bench/results/probe.json is new, and output, not code
    assert record["git_commit"] == head and record["dirty"] is False

    _git(repo, "add", "bench/results/probe.json")
    _git(repo, "commit", "-q", "-m", "results")
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "runs" / "demo").mkdir(parents=True)
    (repo / "runs" / "demo" / "log.txt").write_text("a run's output\n", encoding="utf-8")
    record = _written(repo)  # rewrites the committed JSON: still output, and so are the runs
    assert record["git_commit"] == head and record["dirty"] is False

    (repo / "src" / "code.py").write_text("x = 2\n", encoding="utf-8")
    record = _written(repo)
    assert record["git_commit"] == head and record["dirty"] is True
    assert git_commit() == head + "-dirty"

    _git(repo, "checkout", "-q", "--", "src/code.py")
    assert working_tree_dirty() is False
    (repo / "src" / "new.py").write_text("y = 1\n", encoding="utf-8")  # a file not yet committed runs too
    assert _written(repo)["dirty"] is True

    outside = tmp_path / "outside"
    outside.mkdir()
    monkeypatch.chdir(outside)
    record = json.loads(write_results(outside / "probe.json", "probe", "python probe.py", {}).read_text())
    assert record["git_commit"] == "unknown" and record["dirty"] is None
