"""Every notebook runs top to bottom at the small budget, and `make notebooks-exercises` blanks every solution.

The notebooks (notebooks/NN_slug.py, Jupytext's percent format) are executed as a learner runs them: converted by
Jupytext, run cell by cell by a Jupyter kernel (nbclient) in notebooks/, any error failing the test.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.py"))
LIMIT_S = 120  # per notebook, its kernel's start included
BLANK = 'raise NotImplementedError("write this, then run the check below")'


def _exercises_module():
    spec = importlib.util.spec_from_file_location("notebook_exercises", NOTEBOOKS / "tools" / "exercises.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_notebooks():
    assert PATHS, "no notebooks/*.py"
    for path in PATHS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.py", path.name), f"{path.name}: expected NN_slug.py"


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom_at_the_small_budget(path, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = jupytext.read(path)
    assert notebook.cells and notebook.cells[0].cell_type == "markdown", \
        f"{path.name}: the first cell says what the notebook needs and how long it runs"
    monkeypatch.setenv("ATTNKIT_NOTEBOOK_BUDGET", "small")  # the kernel inherits the environment
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = nbclient.NotebookClient(notebook, timeout=LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.monotonic()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    seconds = time.monotonic() - start
    assert seconds < LIMIT_S, f"{path.name} ran {seconds:.0f} s at the small budget; at most {LIMIT_S} s"
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_exercises_blank_every_solution_and_stay_python(path, tmp_path):
    exercises = _exercises_module()
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    begins = [(n, line[: len(line) - len(line.lstrip())]) for n, line in enumerate(lines)
              if line.strip() == "# BEGIN SOLUTION"]
    ends = [n for n, line in enumerate(lines) if line.strip() == "# END SOLUTION"]
    assert len(begins) == len(ends), f"{path.name}: {len(begins)} BEGIN SOLUTION markers, {len(ends)} END"
    assert exercises.main(["--out", str(tmp_path), str(path)]) == 0  # what make notebooks-exercises runs
    blanked = (tmp_path / path.name).read_text(encoding="utf-8")
    assert blanked == exercises.strip_solutions(text)
    ast.parse(blanked, filename=path.name)  # valid Python
    assert "# BEGIN SOLUTION" not in blanked and "# END SOLUTION" not in blanked
    assert [line for line in blanked.splitlines() if line.strip() == BLANK] == [f"{indent}{BLANK}"
                                                                               for _, indent in begins]
    # everything outside the blocks is kept, in order, and each block is its one line
    expected, inside = [], False
    for line in lines:
        if line.strip() == "# BEGIN SOLUTION":
            inside = True
            expected.append(line[: len(line) - len(line.lstrip())] + BLANK)
        elif line.strip() == "# END SOLUTION":
            inside = False
        elif not inside:
            expected.append(line)
    assert blanked.splitlines() == expected
    if begins and importlib.util.find_spec("jupytext"):
        assert (tmp_path / path.with_suffix(".ipynb").name).is_file()


def test_stripping_keeps_indentation_and_refuses_bad_markers():
    exercises = _exercises_module()
    source = ("def f(x):\n    '''doc'''\n    # BEGIN SOLUTION\n    y = x + 1\n    return y\n    # END SOLUTION\n\n"
              "class A:\n    def g(self):\n        # BEGIN SOLUTION\n        return 2\n        # END SOLUTION\n")
    blanked = exercises.strip_solutions(source)
    assert blanked == ("def f(x):\n    '''doc'''\n    " + BLANK + "\n\nclass A:\n    def g(self):\n        "
                       + BLANK + "\n")
    namespace = {}
    exec(compile(blanked, "<exercise>", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="write this, then run the check below"):
        namespace["f"](1)
    for bad, message in (("# END SOLUTION\n", "1: # END SOLUTION without"),
                         ("# BEGIN SOLUTION\nx = 1\n", "1: # BEGIN SOLUTION without a # END"),
                         ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "2: # BEGIN SOLUTION inside")):
        with pytest.raises(exercises.MarkerError, match=message):
            exercises.strip_solutions(bad, "nb.py")


def test_a_bad_marker_is_one_line_and_exit_status_2(tmp_path):
    bad = tmp_path / "09_bad.py"
    bad.write_text("# %%\ndef f():\n    # BEGIN SOLUTION\n    return 1\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(NOTEBOOKS / "tools" / "exercises.py"), "--out",
                           str(tmp_path / "out"), str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert done.stderr.strip() == f"notebooks-exercises: {bad}:3: # BEGIN SOLUTION without a # END SOLUTION after it"


def test_the_notebooks_extra_installs_jupyter_and_what_the_tests_run():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    names = {re.match(r"[\w.-]+", d).group().lower() for d in extras["notebooks"]}
    assert {"jupyter", "jupytext", "nbclient", "ipykernel", "nbconvert", "matplotlib"} <= names
    included = set(re.findall(r"\w+", next(d for d in extras["notebooks"] if d.startswith("attnkit["))))
    assert {"caption", "bert", "speech", "vqa"} <= included  # what the notebooks load: weights, audio, easy-VQA
    dev = {re.match(r"[\w.-]+", d).group().lower() for d in extras["dev"]}
    assert {"jupytext", "nbclient", "ipykernel"} <= dev
