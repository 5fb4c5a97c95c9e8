"""``make notebooks``: run every notebook top to bottom, keep it executed, render it with its figures.

Each ``notebooks/NN_slug.py`` (Jupytext's percent format) is executed by a Jupyter kernel (nbclient) in
``notebooks/``, at the full budget (``ATTNKIT_NOTEBOOK_BUDGET=full``), and written

- executed, as ``runs/notebooks/executed/NN_slug.ipynb`` (open it in Jupyter; ``notebooks/NN_slug.ipynb`` is left
  alone: ``make lab`` makes it, unexecuted, as a learner's working copy),
- as Markdown with its figures: ``docs/notebooks/NN_slug.md`` and ``docs/notebooks/NN_slug_files/*.png``;

then once more at the small budget, only timed. ``docs/notebooks/runtimes.json`` keeps each notebook's two wall times
(a notebook not run this time keeps its earlier ones) and ``docs/notebooks/README.md``, the index, is written from it.

    python notebooks/tools/render.py [--budget full|small] [--no-small] [NOTEBOOK.py ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1]
ROOT = NOTEBOOKS.parent
DOCS = ROOT / "docs" / "notebooks"
RUNTIMES = DOCS / "runtimes.json"
CELL_TIMEOUT = 1800  # seconds; a full-budget training cell runs a few minutes


def execute(path: Path, budget: str, timeout: int = CELL_TIMEOUT):
    """The notebook at ``path`` executed at ``budget`` in its own directory: (notebook node, wall seconds)."""
    import jupytext
    from nbclient import NotebookClient

    notebook = jupytext.read(path)
    os.environ["ATTNKIT_NOTEBOOK_BUDGET"] = budget  # the kernel inherits this process's environment
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    client.execute()
    return notebook, time.monotonic() - start


def render(notebook, stem: str) -> Path:
    """``docs/notebooks/STEM.md`` and its figures in ``docs/notebooks/STEM_files/``."""
    from nbconvert import MarkdownExporter

    files = f"{stem}_files"
    shutil.rmtree(DOCS / files, ignore_errors=True)
    body, resources = MarkdownExporter().from_notebook_node(notebook, resources={"output_files_dir": files})
    for name, data in resources.get("outputs", {}).items():
        target = DOCS / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    target = DOCS / f"{stem}.md"
    target.write_text(body, encoding="utf-8")
    return target


def write_index(runtimes: dict) -> Path:
    rows = ["| notebook | full budget | small budget |", "|---|---|---|"]
    for stem in sorted(runtimes):
        times = runtimes[stem]
        cells = [f"{times[b]:.0f} s" if b in times else "not run" for b in ("full", "small")]
        rows.append(f"| [{stem}]({stem}.md) | {cells[0]} | {cells[1]} |")
    machines = [f"{stem}: {t['machine']}" for stem, t in sorted(runtimes.items()) if "machine" in t]
    text = ("# The notebooks, executed\n\n"
            "Written by `make notebooks` from `notebooks/*.py` run top to bottom at the full budget, each with its "
            "figures; the wall time of each run (a Jupyter kernel's start included) at the full budget and at the "
            "small one that `make test` runs. The sources and what each notebook needs: "
            "[../notebooks.md](../notebooks.md).\n\n" + "\n".join(rows) + "\n\n"
            "Measured on:\n\n" + "".join(f"- {m}\n" for m in machines))
    target = DOCS / "README.md"
    target.write_text(text, encoding="utf-8")
    return target


def machine() -> str:
    """The CPUs, torch, its threads, and the load the machine carried (other jobs slow a notebook down)."""
    import torch

    threads = torch.get_num_threads()
    return (f"{os.cpu_count()} CPUs ({platform.machine()}), torch {torch.__version__}, {threads} torch "
            f"thread{'s' if threads != 1 else ''}, load average {os.getloadavg()[0]:.1f} at the end")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.py")
    parser.add_argument("--budget", choices=("full", "small"), default="full",
                        help="the budget rendered (default full)")
    parser.add_argument("--no-small", action="store_true", help="do not time the small budget as well")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.py"))
    DOCS.mkdir(parents=True, exist_ok=True)
    runtimes = json.loads(RUNTIMES.read_text(encoding="utf-8")) if RUNTIMES.exists() else {}
    runtimes = {stem: t for stem, t in runtimes.items() if (NOTEBOOKS / f"{stem}.py").exists()}
    import nbformat

    for path in paths:
        stem = path.stem
        try:
            notebook, seconds = execute(path, args.budget)
        except Exception as e:  # a cell's error: name the notebook, keep its earlier rendering
            print(f"make notebooks: {path.name} failed at the {args.budget} budget: {type(e).__name__}: "
                  f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}", file=sys.stderr)
            return 1
        executed = ROOT / "runs" / "notebooks" / "executed" / f"{stem}.ipynb"
        executed.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, executed)
        print(f"{path.name}: {args.budget} budget in {seconds:.0f} s -> {render(notebook, stem).relative_to(ROOT)}")
        times = {args.budget: round(seconds, 1), "machine": machine()}
        if args.budget == "full" and not args.no_small:
            _, small = execute(path, "small")
            times["small"] = round(small, 1)
            print(f"{path.name}: small budget in {small:.0f} s")
        runtimes[stem] = {**runtimes.get(stem, {}), **times}
        RUNTIMES.write_text(json.dumps(runtimes, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(write_index(runtimes).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
