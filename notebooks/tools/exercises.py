"""``make notebooks-exercises``: copies of the notebooks with every solution blanked, for a class.

In a notebook (``notebooks/NN_slug.py``, Jupytext's percent format) the body of each function the learner is asked to
write sits between a line ``# BEGIN SOLUTION`` and a line ``# END SOLUTION``. The copy replaces each such block, the
two marker lines included, by one line at the block's indentation::

    raise NotImplementedError("write this, then run the check below")

so the copy is still valid Python, each exercise fails loudly until written, and the check cell after it says so.
Each copy is written as ``OUT/NN_slug.py`` and, where Jupytext is installed, ``OUT/NN_slug.ipynb`` (no outputs).

    python notebooks/tools/exercises.py [--out notebooks/exercises] [NOTEBOOK.py ...]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[1]
BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION[ \t]*$")
END = re.compile(r"^[ \t]*# END SOLUTION[ \t]*$")
BLANK = 'raise NotImplementedError("write this, then run the check below")'


class MarkerError(ValueError):
    """A marker out of place: an END without a BEGIN, a BEGIN inside a block, a block never closed."""


def strip_solutions(text: str, name: str = "<notebook>") -> str:
    """``text`` with each ``# BEGIN SOLUTION`` .. ``# END SOLUTION`` block replaced by the NotImplementedError line."""
    out, opened = [], None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        begin = BEGIN.match(line.rstrip("\r\n"))
        end = END.match(line.rstrip("\r\n"))
        if opened is None:
            if begin:
                opened = n
                out.append(begin["indent"] + BLANK + "\n")
            elif end:
                raise MarkerError(f"{name}:{n}: # END SOLUTION without a # BEGIN SOLUTION before it")
            else:
                out.append(line)
        elif begin:
            raise MarkerError(f"{name}:{n}: # BEGIN SOLUTION inside the block opened at line {opened}")
        elif end:
            opened = None
    if opened is not None:
        raise MarkerError(f"{name}:{opened}: # BEGIN SOLUTION without a # END SOLUTION after it")
    return "".join(out)


def write_exercises(paths: list[Path], out: Path) -> list[Path]:
    """The blanked copy of each notebook into ``out`` (.py, and .ipynb where Jupytext is installed). Every notebook is
    blanked and compiled before anything is written: a marker out of place writes nothing."""
    copies = {}
    for path in paths:
        text = strip_solutions(path.read_text(encoding="utf-8"), str(path))
        compile(text, str(path), "exec")  # a copy that is not Python would be no exercise
        copies[path.name] = text
    try:
        import jupytext
    except ImportError:
        jupytext = None
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in copies.items():
        target = out / name
        target.write_text(text, encoding="utf-8")
        written.append(target)
        if jupytext is not None:
            jupytext.write(jupytext.reads(text, fmt="py:percent"), target.with_suffix(".ipynb"), fmt="ipynb")
            written.append(target.with_suffix(".ipynb"))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.py")
    parser.add_argument("--out", type=Path, default=NOTEBOOKS / "exercises", help="default: notebooks/exercises")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(NOTEBOOKS.glob("*.py"))
    try:
        written = write_exercises(paths, args.out)
    except (MarkerError, SyntaxError, OSError) as e:
        print(f"notebooks-exercises: {e}", file=sys.stderr)
        return 2
    blocks = sum(1 for p in paths for line in p.read_text(encoding="utf-8").splitlines() if BEGIN.match(line))
    print(f"notebooks-exercises: {blocks} solutions blanked in {len(paths)} notebooks: "
          f"{', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
