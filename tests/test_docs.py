"""The README and docs/ stay a guide: short, free of notebook leftovers, and true to the tree they describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LECTURES = ROOT / "docs" / "lectures.md"

README_MAX_BYTES = 15_000

COMMIT_HASH = re.compile(r"\b[0-9a-f]{7,40}\b")
ISSUE_REF = re.compile(r"\bissue\s*#?\d+|#\d+", re.IGNORECASE)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REPO_PATH = re.compile(r"(?<![\w./-])(?:src|tests|bench|configs)/[\w./-]*[\w/]")
PY_PATH = re.compile(r"(?<![\w./-])(?:src|tests|bench)/[\w./-]*\.py\b")
BACKTICKED = re.compile(r"`([^`]+)`")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _docs() -> list[Path]:
    return [README, *DOCS]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_readme_is_short():
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes; at most {README_MAX_BYTES:,} (move detail to docs/)"


def test_the_docs_exist_and_the_readme_links_them():
    text = README.read_text(encoding="utf-8")
    for name in ("results.md", "performance.md", "lectures.md"):
        assert (ROOT / "docs" / name).is_file(), f"docs/{name} is missing"
        assert f"docs/{name}" in text, f"README.md does not link docs/{name}"
    assert "MIT" in (ROOT / "LICENSE").read_text(encoding="utf-8")


@pytest.mark.parametrize("doc", _docs(), ids=_rel)
def test_no_notebook_leftovers(doc: Path):
    problems = []
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if "/tmp" in line:
            problems.append(f"{n}: /tmp path: {line.strip()}")
        for m in COMMIT_HASH.finditer(line):
            problems.append(f"{n}: commit-hash-like string {m.group()!r}")
        for m in ISSUE_REF.finditer(line):
            problems.append(f"{n}: issue reference {m.group()!r}")
    assert not problems, f"{_rel(doc)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", _docs(), ids=_rel)
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the same page
        path = target.split("#", 1)[0]
        if path and not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{_rel(doc)} links to missing files: {broken}"


def _defines(source: str, name: str) -> bool:
    n = re.escape(name)
    return re.search(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{n}\b", source, re.MULTILINE) is not None or \
        re.search(rf"^[ \t]*{n}[ \t]*(?::[^=\n]*)?=(?!=)", source, re.MULTILINE) is not None


def _named_pairs(text: str) -> list[tuple[str, str]]:
    """(path, name) for every backticked identifier that follows a .py path on the same line (up to the next path)."""
    pairs = []
    for line in text.splitlines():
        spots = list(PY_PATH.finditer(line))
        for quoted in BACKTICKED.finditer(line):
            owners = [m for m in spots if m.end() <= quoted.start(1)]
            if owners and IDENTIFIER.fullmatch(quoted.group(1)):
                pairs.append((owners[-1].group(), quoted.group(1)))
    return pairs


def test_lectures_paths_exist():
    text = LECTURES.read_text(encoding="utf-8")
    missing = sorted({p for p in REPO_PATH.findall(text) if not (ROOT / p).exists()})
    assert not missing, f"docs/lectures.md names paths that do not exist: {missing}"


def test_lectures_names_are_defined_where_it_says():
    pairs = _named_pairs(LECTURES.read_text(encoding="utf-8"))
    assert len(pairs) >= 40, "docs/lectures.md should pair each concept with a file and a name"
    missing = []
    for path, name in pairs:
        file = ROOT / path
        if not file.is_file() or not _defines(file.read_text(encoding="utf-8"), name):
            missing.append(f"{path} -> {name}")
    assert not missing, "docs/lectures.md names what the tree does not define:\n" + "\n".join(missing)
