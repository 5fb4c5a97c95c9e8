"""The README and docs/ stay a guide: short, free of notebook leftovers, and true to the tree they describe."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
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
GENERATED_OPEN = re.compile(r"<!-- results:[\w-]+ -->")
GENERATED_CLOSE = re.compile(r"<!-- /results:[\w-]+ -->")


def _docs() -> list[Path]:
    return [README, *DOCS]


def _generated_lines(text: str) -> set[int]:
    """The line numbers (from 1) inside the blocks bench/results.py writes, their markers included."""
    lines, inside = set(), False
    for n, line in enumerate(text.splitlines(), 1):
        if GENERATED_OPEN.match(line):
            inside = True
        if inside:
            lines.add(n)
        if GENERATED_CLOSE.match(line):
            inside = False
    return lines


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
    text = doc.read_text(encoding="utf-8")
    for n, line in enumerate(text.splitlines(), 1):
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


# --- results: docs/results.md's tables and the README's results table are written from bench/results/*.json

RESULTS_SCRIPT = ROOT / "bench" / "results.py"
RESULTS_DOC = ROOT / "docs" / "results.md"
FENCED = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`([^`]+)`")
# a measurement copied by hand: a decimal (38.11, 2.5x), a number with thousands separators (4,057), a percentage
MEASUREMENT = re.compile(r"(?<![\w.])\d+(?:\.\d+)+|(?<![\w.,])\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?\s?%")
# a number as the generated blocks write it: 4,057 / 38.11 / 26 (not the digits inside a word or a hash)
DOC_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def _results_module():
    spec = importlib.util.spec_from_file_location("bench_results", RESULTS_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hand_written(text: str) -> str:
    """``text`` without its generated blocks, fenced code and code spans: the prose a person keeps true."""
    generated = _generated_lines(text)
    text = "\n".join("" if n in generated else line for n, line in enumerate(text.splitlines(), 1))
    return CODE_SPAN.sub("", FENCED.sub("", text))


def _generated_text(text: str) -> str:
    generated = _generated_lines(text)
    return "\n".join(line for n, line in enumerate(text.splitlines(), 1) if n in generated)


def test_results_docs_agree_with_the_jsons():
    """`make results` has been run since the last change to bench/results/*.json (or to the generator)."""
    done = subprocess.run([sys.executable, str(RESULTS_SCRIPT), "--check"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, (f"docs disagree with bench/results/*.json; run `make results`:\n{done.stdout}"
                                  f"{done.stderr}")


# what the measurement pattern matches in hand-written text that is no measurement: an example input, the loopback
# address and the noise rule of thumb
NOT_MEASUREMENTS = {"README.md": {"4.3.1997", "127.0.0.1"},
                    "docs/performance.md": {"15%"}}


def test_hand_written_docs_quote_no_measurements():
    """Around the generated blocks, the README, docs/results.md and docs/performance.md explain method and reasons
    only: a number typed into prose goes stale the next time a recipe or a bench runs."""
    for name in ("README.md", "docs/results.md", "docs/performance.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        found = [m for m in MEASUREMENT.findall(_hand_written(text)) if m not in NOT_MEASUREMENTS.get(name, ())]
        assert not found, f"{name} quotes measurements outside its generated blocks: {found}"


# --- every value a generated block shows, read again from the JSON file and key path docs/results_sources.json names

SOURCES = Path("docs") / "results_sources.json"
BLOCK = re.compile(r"<!-- results:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.DOTALL)
# a number as a page shows it: 4,057 / 38.11 / 2026 (not the digits inside a word: fp32, avx512, batch64)
SHOWN_NUMBER = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*")
# the generator's own words that hold a digit: names of a cell, a metric, a setting or an HTTP status, not values
LABELS = re.compile("|".join(re.escape(label) + r"(?![\d.,]*\d)" for label in (
    "BLEU-1 / 2 / 3 / 4", "BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "WikiText-2", "SST-2", "224-pixel",
    "data.image_size = 224", "train.lr=2e-5", "n = 1024", "n = 4096", "batch 1 and 64", "batch 1", "batch 64",
    "batch-1", "beam 5", "AVX-512", "of them 200", "answered 429", "5xx")))
OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
       "neg": lambda a: -a}
STRING_OPS = {"slice": lambda v, start, stop: v[start:stop], "replace": str.replace, "strip": str.strip,
              "removeprefix": str.removeprefix, "removesuffix": str.removesuffix,
              "sub": lambda v, pattern, repl: re.sub(pattern, repl, v)}


def _source_value(source, jsons: dict):
    """What a source names: a key path's value in a results JSON (a constant as itself; no key: the file's name;
    ``"of": "key"``: the path's last key, which must exist), with the string operations it lists applied, or the
    computation it records over such values."""
    if not isinstance(source, dict):
        return source
    if "op" in source:
        return OPS[source["op"]](*(_source_value(a, jsons) for a in source["args"]))
    node = jsons[source["file"]]
    for key in source.get("key", []):
        node = node[key]
    value = (source["key"][-1] if source.get("of") == "key" else node) if "key" in source else source["file"]
    for op, *args in source.get("ops", []):
        value = STRING_OPS[op](value, *args)
    return value


def exact_source_problems(root: Path = ROOT) -> list[str]:
    """Each value in each generated block, read again from the JSON key it names and formatted as recorded, must be
    what the page shows where it shows it; and every number a block shows must be one of those values (or a label
    in ``LABELS``). Returns what disagrees."""
    jsons = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in (root / "bench" / "results").glob("*.json")}
    recorded = json.loads((root / SOURCES).read_text(encoding="utf-8"))
    problems = []
    for page, blocks in recorded.items():
        if page == "about":
            continue
        bodies = {m["name"]: m["body"] for m in BLOCK.finditer((root / page).read_text(encoding="utf-8"))}
        if set(bodies) != set(blocks):
            problems.append(f"{page}: blocks {sorted(bodies)}, sources for {sorted(blocks)}")
        for name, entries in blocks.items():
            body, spans = bodies.get(name, ""), []
            for at, shown, spec, source in entries:
                where = f"{page} [{name}] at {at}"
                try:
                    expected = format(_source_value(source, jsons), spec)
                except (KeyError, IndexError, TypeError, ValueError) as e:
                    problems.append(f"{where}: {json.dumps(source)} names nothing a JSON holds ({e!r})")
                    continue
                if expected != shown:
                    problems.append(f"{where}: {json.dumps(source)} reads {expected!r}, the sources say {shown!r}")
                if body[at:at + len(expected)] != expected:
                    problems.append(f"{where}: shows {body[at:at + len(expected)]!r} where {json.dumps(source)} "
                                    f"reads {expected!r}")
                spans.append((at, at + len(expected)))
            unlabelled = LABELS.sub(lambda m: " " * len(m.group()), body)
            for m in SHOWN_NUMBER.finditer(unlabelled):
                if not any(start <= m.start() and m.end() <= end for start, end in spans):
                    problems.append(f"{page} [{name}] at {m.start()}: {m.group()!r} comes from no JSON key: "
                                    f"...{body[max(0, m.start() - 40):m.end() + 10]}...")
    return problems


def test_every_generated_value_comes_from_its_json_key():
    problems = exact_source_problems()
    assert not problems, ("generated values that their JSON keys do not give (run `make results`):\n"
                          + "\n".join(problems[:40]))


def _copy_for_results(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    shutil.copy(README, tmp_path / "README.md")
    for doc in (ROOT / "docs").glob("*.md"):  # every page that may hold generated blocks
        shutil.copy(doc, tmp_path / "docs" / doc.name)
    for path in (ROOT / "bench" / "results").glob("*.json"):
        shutil.copy(path, tmp_path / "bench" / "results" / path.name)
    shutil.copy(ROOT / SOURCES, tmp_path / SOURCES)
    return tmp_path


def _edit_json(root: Path, name: str, edit) -> None:
    path = root / "bench" / "results" / f"{name}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    edit(record)
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")


def test_results_check_fails_when_a_json_changes(tmp_path, capsys):
    results = _results_module()
    root = _copy_for_results(tmp_path)
    _edit_json(root, "multi30k_en_de", lambda r: r["metrics"].update(bleu=12.34))
    assert results.main(["--check", "--root", str(root)]) == 1
    diff = capsys.readouterr().out
    assert "+| Transformer (`make multi30k`) | **12.34**" in diff and "BLEU 12.34" in diff
    assert (root / "README.md").read_bytes() == README.read_bytes(), "--check wrote a file"
    assert any("'12.34'" in p for p in exact_source_problems(root))  # the pages still show the old BLEU
    assert results.main(["--root", str(root)]) == 0
    assert results.main(["--check", "--root", str(root)]) == 0
    assert exact_source_problems(root) == []


def _entry(root: Path, page: str, block: str, key_end: str) -> tuple[list, int]:
    """The first source entry of ``block`` whose key path ends with ``key_end``, and where its block starts."""
    entries = json.loads((root / SOURCES).read_text(encoding="utf-8"))[page][block]
    entry = next(e for e in entries if e[3].get("key", [None])[-1] == key_end)
    start = next(m.start("body") for m in BLOCK.finditer((root / page).read_text(encoding="utf-8"))
                 if m["name"] == block)
    return entry, start


def test_the_exact_check_fails_on_a_number_edited_by_hand(tmp_path):
    root = _copy_for_results(tmp_path)
    assert exact_source_problems(root) == []
    (at, shown, _, _), start = _entry(root, "docs/performance.md", "train-throughput", "tokens_per_s")
    page = root / "docs" / "performance.md"
    text = page.read_text(encoding="utf-8")
    edited = shown[:-1] + ("1" if shown[-1] != "1" else "2")  # the same width: nothing else moves
    page.write_text(text[:start + at] + edited + text[start + at + len(shown):], encoding="utf-8")
    problems = exact_source_problems(root)
    assert len(problems) == 1 and f"shows {edited!r}" in problems[0] and f"reads {shown!r}" in problems[0]


def test_the_exact_check_fails_on_a_number_no_key_gives(tmp_path):
    root = _copy_for_results(tmp_path)
    page = root / "docs" / "performance.md"
    text = page.read_text(encoding="utf-8")
    closing = text.index("<!-- /results:attention-op -->")
    page.write_text(text[:closing] + "About 5,000 tokens/s.\n" + text[closing:], encoding="utf-8")
    problems = exact_source_problems(root)
    assert len(problems) == 1 and "'5,000' comes from no JSON key" in problems[0]


def test_the_exact_check_fails_on_a_value_that_names_the_wrong_key(tmp_path):
    root = _copy_for_results(tmp_path)
    (at, shown, _, source), _ = _entry(root, "docs/performance.md", "train-throughput", "tokens_per_s")
    assert source["key"][:2] == ["systems", "attnkit"]
    recorded = json.loads((root / SOURCES).read_text(encoding="utf-8"))
    for entry in recorded["docs/performance.md"]["train-throughput"]:
        if entry[0] == at:
            entry[3]["key"][1] = "huggingface_marian"  # the neighbouring system's throughput, in the same JSON
    (root / SOURCES).write_text(json.dumps(recorded), encoding="utf-8")
    problems = exact_source_problems(root)
    assert problems and all("huggingface_marian" in p for p in problems)
    assert any(f"the sources say {shown!r}" in p for p in problems)


def test_a_json_from_a_dirty_working_tree_is_marked(tmp_path):
    results = _results_module()
    root = _copy_for_results(tmp_path)
    _edit_json(root, "attention_op", lambda r: r.update(dirty=True))
    _edit_json(root, "compile_step", lambda r: r.update(dirty=False))  # its git_commit still ends in -dirty
    assert results.main(["--root", str(root)]) == 0
    page = (root / "docs" / "performance.md").read_text(encoding="utf-8")
    blocks = {m["name"]: m["body"] for m in BLOCK.finditer(page)}
    assert "[attention_op.json](../bench/results/attention_op.json)\\*" in blocks["attention-op"]
    assert blocks["attention-op"].rstrip().endswith(results.DIRTY_NOTE)
    assert "[compile_step.json](../bench/results/compile_step.json))" in blocks["compile-step"]
    assert results.DIRTY_NOTE not in blocks["compile-step"]
    assert exact_source_problems(root) == []


def test_results_render_what_a_json_records_and_only_that(tmp_path):
    results = _results_module()
    root = _copy_for_results(tmp_path)
    _edit_json(root, "multi30k_en_de", lambda r: r["metrics"].update(
        paper_bleu=40.25, paper_bleu_signature="multi-bleu.perl|lc|moses-de"))
    coco = {"bleu1": 63.1, "bleu2": 44.2, "bleu3": 31.3, "bleu4": 21.4, "meteor": 20.5, "rouge_l": 47.6, "cider": 52.7}
    _edit_json(root, "flickr8k_sat", lambda r: r["metrics"].update(coco=coco, coco_definition="pycocoevalcap"))
    _edit_json(root, "multi30k_en_de_rnnsearch", lambda r: r.pop("epochs_completed"))
    assert results.main(["--root", str(root)]) == 0
    page = (root / "docs" / "results.md").read_text(encoding="utf-8")
    assert "paper-style BLEU" in page and "40.25" in page and "`multi-bleu.perl|lc|moses-de`" in page
    assert "METEOR 20.50, ROUGE-L 47.60, CIDEr 52.70" in page
    rnnsearch = next(line for line in page.splitlines() if line.startswith("| RNNsearch (`make"))
    assert "epochs not recorded" in rnnsearch
    record = json.loads((root / "bench" / "results" / "multi30k_en_de_rnnsearch.json").read_text())
    minutes = f"{record['train_minutes']:.1f}"
    source = next(line for line in page.splitlines() if line.startswith("| [multi30k_en_de_rnnsearch.json]("))
    assert source.endswith(f"| {minutes} | not recorded |")  # the table of sources: minutes recorded, epochs not
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert f"| {minutes} min |" in readme  # no epochs where none are recorded
    unmarked = page.replace("<!-- /results:sources -->", "")
    (root / "docs" / "results.md").write_text(unmarked, encoding="utf-8")
    with pytest.raises(SystemExit, match="markers"):
        results.main(["--check", "--root", str(root)])


def _rows(page: str, label: str) -> dict[str, list[str]]:
    """The table rows of docs/results.md that start with ``label``, by their third cell (the protocol), as cells."""
    rows = [line.strip("|").split(" | ") for line in page.splitlines() if line.startswith(f"| {label}")]
    return {cells[2].strip(): [c.strip() for c in cells] for cells in rows}


def test_a_verdict_compares_like_with_like(tmp_path):
    """A language model's target is judged on the protocol of the published figure it was set from, each other
    protocol is a row of its own with no verdict, the continuous cache (tuned on the split it scores) is never held to
    the target, and a captioning score on the split that chose among the recipe's versions says it is not held out."""
    results = _results_module()
    root = _copy_for_results(tmp_path)

    def tiny(edit):
        _edit_json(root, "tinyshakespeare_char", edit)
        assert results.main(["--root", str(root)]) == 0
        assert exact_source_problems(root) == []
        page = (root / "docs" / "results.md").read_text(encoding="utf-8")
        return _rows(page, "Tiny Shakespeare, characters"), page

    # nanoGPT's figure is over blocks: the disjoint blocks decide, however the sliding window reads
    def blocks_meet(r):
        r["metrics"]["valid_loss"] = 1.46
        r["metrics"]["sliding_window"][0]["valid_loss"] = 1.5
    rows, page = tiny(blocks_meet)
    blocks = next(cells for how, cells in rows.items() if how.startswith("disjoint blocks"))
    window = next(cells for how, cells in rows.items() if how.startswith("a sliding window"))
    assert blocks[3].startswith("validation loss **1.460**") and blocks[4].endswith("met, scored over blocks as the "
                                                                                     "target is")
    assert window[3].startswith("validation loss 1.500") and window[4].startswith("none: a different protocol")
    assert "not comparable" in window[4] and "met" not in window[4].split(":")[0]

    def blocks_miss(r):
        r["metrics"]["valid_loss"] = 1.48
        r["metrics"]["sliding_window"][0]["valid_loss"] = 1.4
    rows, _ = tiny(blocks_miss)
    verdicts = [cells[4] for cells in rows.values()]
    assert sum(v.endswith(": missed, scored over blocks as the target is") for v in verdicts) == 1
    assert not any(v.endswith("met") or ": met" in v for v in verdicts)

    # no figure over blocks: the verdict says so and compares no other protocol's figure with the target
    rows, _ = tiny(lambda r: r["metrics"].pop("valid_loss"))
    blocks = next(cells for how, cells in rows.items() if how.startswith("disjoint blocks"))
    assert blocks[4].endswith("not recorded over blocks, as the target is scored; no other protocol's figure is "
                              "compared with it")
    assert not any(": met" in cells[4] or ": missed" in cells[4] for cells in rows.values())

    # WikiText-2: the cache's figure meets the target, the model's alone does not; the verdict is the model's
    page = (root / "docs" / "results.md").read_text(encoding="utf-8")
    rows = _rows(page, "WikiText-2, words")
    cache = next(cells for how, cells in rows.items() if "continuous cache" in how)
    window = next(cells for how, cells in rows.items() if how.startswith("a sliding window"))
    assert cache[4].startswith("none: the cache's settings were chosen on this split") and "met" not in cache[4]
    assert window[4].endswith(": missed, scored with every token given its context as the target is")
    assert sum(": met" in cells[4] or ": missed" in cells[4] for cells in rows.values()) == 1

    # Flickr8k: dev chose among the recipe's versions, and the table says so where it gives a dev score a verdict
    sat = next(line for line in page.splitlines() if line.startswith("| Show, Attend and Tell (`make flickr8k`)"))
    cells = [c.strip() for c in sat.strip("|").split(" | ")]
    assert cells[1].endswith("; model selection, not held out")
    assert "met on dev, which chose among the recipe's versions and so is not held out" in cells[4]
    assert "The dev split also chose among the recipe's versions" in page


# --- every config key and CLI option the docs and the configs' comments name exists

SECTION_KEY = re.compile(r"(?<![\w.$/-])(model|data|train|decode)\.([A-Za-z_]\w*)(?![\w(])")
TABLE_KEY = re.compile(r"\[(model|data|train|decode)\]\s+([A-Za-z_]\w*)")
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


def _config_comments(path: Path) -> str:
    """The comments of a TOML file (what follows a # outside a string), one per line."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        quote = None
        for i, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                out.append(line[i + 1:])
                break
    return "\n".join(out)


def _named_places() -> list[tuple[str, list[str]]]:
    """(where, texts) for each doc (its code spans and the logical lines of its code blocks) and each config
    (its comments, line by line)."""
    places = []
    for doc in _docs():
        text = doc.read_text(encoding="utf-8")
        blocks = [line for block in FENCED.findall(text)
                  for line in block.replace("\\\n", " ").splitlines()[1:-1]]
        spans = CODE_SPAN.findall(FENCED.sub("", text))
        places.append((_rel(doc), [re.sub(r"(^|\s)#.*$", "", b) for b in blocks] + spans))
    for path in CONFIGS:
        places.append((_rel(path), _config_comments(path).splitlines()))
    return places


def _config_keys() -> dict[str, set[str]]:
    from attnkit import registry
    from attnkit.config import ExperimentConfig

    cfg = ExperimentConfig()
    keys = {f.name: {g.name for g in dataclasses.fields(getattr(cfg, f.name))}
            for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))}
    keys["model"] = {g.name for family in registry.model_configs().values() for g in dataclasses.fields(family)}
    return keys


def test_the_config_keys_named_exist():
    """`section.key` in a doc's code spans and code, `[section] key`, and section.key in a config's comments."""
    keys = _config_keys()
    named, wrong = 0, []
    for where, texts in _named_places():
        for text in texts:
            for section, key in SECTION_KEY.findall(text) + TABLE_KEY.findall(text):
                named += 1
                if key not in keys[section]:
                    wrong.append(f"{where}: {section}.{key}")
    assert named >= 20, "the docs name config keys; the pattern should find them"
    assert not wrong, "config keys named that attnkit.config does not define:\n" + "\n".join(sorted(set(wrong)))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name, sub in action.choices.items()}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def _attnkit_invocations(text: str) -> list[list[str]]:
    """The words after each `attnkit` a command line in ``text`` runs (up to a pipe, && or ;)."""
    found = []
    for segment in re.split(r"\|\|?|&&|;", text):
        try:
            words = shlex.split(segment)
        except ValueError:  # a quote a code span opens and the next one closes
            words = segment.split()
        for i, word in enumerate(words):
            if word == "attnkit" or word.endswith("/attnkit"):
                found.append(words[i + 1:])
    return found


def test_the_cli_options_named_exist():
    """`attnkit COMMAND [SUBCOMMAND] ... --option` in a doc's code spans and code, and in a config's comments."""
    from attnkit.cli import build_parser

    top = build_parser()
    commands = _subparsers(top)
    checked, wrong = 0, []
    for where, texts in _named_places():
        for text in texts:
            for words in _attnkit_invocations(text):
                parser, shown = top, "attnkit"
                while words and _subparsers(parser):
                    if words[0].startswith("-"):  # an option before the command (attnkit --plugin FILE train)
                        action = parser._option_string_actions.get(words[0].split("=", 1)[0])
                        if action is None:
                            break
                        checked += 1
                        words = words[1 + (action.nargs != 0 and "=" not in words[0]):]
                        continue
                    name, words = words[0], words[1:]
                    if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
                        parser = None  # a placeholder (COMMAND): nothing to check
                        break
                    if name not in _subparsers(parser):
                        wrong.append(f"{where}: {shown} {name}: no such command")
                        parser = None
                        break
                    parser, shown = _subparsers(parser)[name], f"{shown} {name}"
                if parser is None:
                    continue
                for word in words:
                    option = word.split("=", 1)[0]
                    if re.fullmatch(r"--?[A-Za-z][\w-]*", option):
                        checked += 1
                        if option not in _options(parser):
                            wrong.append(f"{where}: {shown} {option}")
    assert len(commands) >= 10 and checked >= 30, "the docs show attnkit command lines; the parser should find them"
    assert not wrong, "command lines name what attnkit's parser does not have:\n" + "\n".join(sorted(set(wrong)))


def test_a_run_beside_a_recipe_names_what_its_overrides_change_from_the_recipe_as_it_stands():
    """A row beside a recipe says which keys its ``--set`` overrides change: an override that sets what the recipe's
    config now says changes nothing, and the threads are named where they are not the recipe's two."""
    import tomllib

    results = _results_module()
    config = "configs/fsdd_digits_las.toml"
    strings = tomllib.loads((ROOT / config).read_text(encoding="utf-8"))["data"]["n_synthetic"]

    def label(*args):
        return results._differs({"command": f"attnkit train {config} --run-dir runs/x {' '.join(args)}"}, "x")

    assert label("--threads", "2", "--set", f"data.n_synthetic={strings}") == "the recipe's settings"
    assert label("--threads", "2", "--set", f"data.n_synthetic={strings + 1}") == "`data.n_synthetic` changed"
    assert label("--threads", "1", "--set", f"data.n_synthetic={strings}", "--set", "model.energy=additive") == (
        "one thread, `model.energy` changed")
