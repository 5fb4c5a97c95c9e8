"""Every number in docs/results.md, docs/performance.md and the README's results table, from bench/results/*.json.

    python bench/results.py           # rewrite the generated blocks and docs/results_sources.json (make results)
    python bench/results.py --check   # change nothing; print the difference and exit 1 where the docs disagree

A generated block sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``; the text around the
blocks is written by hand, explains method and holds no measured numbers. Hand-copied numbers go stale the
moment a recipe is rerun; these blocks are rewritten from the JSONs the recipes write, and tests/test_docs.py
runs ``--check``. A field a JSON does not hold is written "not recorded", never guessed. docs/results_sources.json
names, for every value a block shows, the JSON file and key path it was read from (or the computation over such
keys), and tests/test_docs.py reads each one again. A JSON written from a working tree with uncommitted changes is
marked where docs/ names it. Only the standard library: the check runs in the docs tests without torch.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NOT_RECORDED = "not recorded"
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.DOTALL)
OPENING = re.compile(r"<!-- results:([\w-]+) -->")

# where each generated value comes from (:func:`_written`), for tests/test_docs.py to read every one of them again
SOURCES = Path("docs") / "results_sources.json"
SOURCES_ABOUT = ("Written by bench/results.py (make results); do not edit. For each page and generated block, one "
                 "entry per value it shows from bench/results/*.json: [offset in the block, the text shown, the "
                 "format spec, its source]. A source is {file, key, of, ops}: the JSON bench/results/FILE.json, the "
                 "key path in it (no key: the file's name; of = key: the path's last key, not its value), and what "
                 "was done to a string before it was shown; or {op, args}: a value computed from sources and "
                 "constants. tests/test_docs.py reads each again.")
# the pages whose tables mark a JSON written from a working tree with uncommitted changes; the README's table keeps
# to its size, and docs/results.md's table of sources marks every such JSON
DIRTY_NOTED = ("docs/results.md", "docs/performance.md")
DIRTY_MARK = "\\*"
DIRTY_NOTE = ("\\* Written from a working tree with uncommitted changes (the JSON's `dirty`): what ran may differ "
              "from the commit it names.")
_dirty: set[str] = set()  # the JSONs so marked, while a page that notes them is written

# what each recipe's JSON is called in the tables and which make target writes it
TRANSLATION = [
    ("multi30k_en_de", "Transformer", "make multi30k"),
    ("multi30k_en_de_lc", "Transformer, lowercased text", "make multi30k-lc"),
    ("multi30k_en_de_rnnsearch", "RNNsearch", "make multi30k-rnnsearch"),
    ("multi30k_en_de_rnnencdec", "RNNencdec, no attention", "make multi30k-rnnencdec"),
]
# and the protocol its target's published figure is scored by (LM_PUBLISHED_PROTOCOL), which its verdict is on:
# nanoGPT's figure is over blocks, the literature's word-level perplexities give every word its context
LANGUAGE_MODELS = [
    ("tinyshakespeare_char", "Tiny Shakespeare, characters", "make tinyshakespeare", "blocks"),
    ("wikitext2_word", "WikiText-2, words", "make wikitext2", "sliding_window/0"),
]
# the COCO caption evaluation (pycocoevalcap) a captioning JSON may hold under metrics.coco: key -> name
COCO = {"bleu1": "BLEU-1", "bleu2": "BLEU-2", "bleu3": "BLEU-3", "bleu4": "BLEU-4", "meteor": "METEOR",
        "rouge_l": "ROUGE-L", "cider": "CIDEr", "spice": "SPICE"}
LAYERS = {"rnn": "GRU", "conv": "convolution, centred", "conv_causal": "convolution, causal",
          "conv_dilated": "convolution, dilated", "self_attention": "self-attention"}


# --- where each number comes from
#
# Every leaf a results JSON holds is read as a number or string that remembers its file and key path, and a number
# computed from such leaves (a ratio, a percentage) remembers the computation. While a block is written (``_marking``)
# formatting one of them leaves a marker in the text; ``_unmark`` puts the formatted value in its place and notes
# where it sits, what it was formatted from and how. docs/results_sources.json keeps those notes, and
# tests/test_docs.py reads every one of them again from the JSON it names: a number edited by hand in a doc, or
# written from another key than it claims, fails there.

_MARK = re.compile("\ue000(\\d+)\ue001")
_marks: list[tuple[str, str, dict]] | None = None  # (shown, format spec, source) while a block is being written


def _mark(shown: str, spec: str, source: dict) -> str:
    if _marks is None:
        return shown
    _marks.append((shown, spec, source))
    return f"\ue000{len(_marks) - 1}\ue001"


def _source(value):
    """The source of a tracked value; a plain number as itself (a constant of the computation)."""
    return value.source if isinstance(value, (_Int, _Float)) else value


def _computed(op: str, value, *args):
    """``value`` (the result of ``op`` over ``args``), remembering the computation where an argument is tracked."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not any(isinstance(a, (_Int, _Float)) for a in args):
        return value
    source = {"op": op, "args": [_source(a) for a in args]}
    return _Int(value, source) if isinstance(value, int) else _Float(value, source)


class _Number:
    """Arithmetic that remembers what it computed from, and formatting that marks where the value is shown."""

    source: dict

    def __format__(self, spec: str) -> str:
        # an empty spec formats as str(), which is this class's own: the base type's repr is the same text
        return _mark(super().__format__(spec) if spec else super().__repr__(), spec, self.source)

    def __str__(self) -> str:
        return self.__format__("")

    def __add__(self, other):
        return _computed("add", super().__add__(other), self, other)

    def __radd__(self, other):
        return _computed("add", super().__radd__(other), other, self)

    def __sub__(self, other):
        return _computed("sub", super().__sub__(other), self, other)

    def __rsub__(self, other):
        return _computed("sub", super().__rsub__(other), other, self)

    def __mul__(self, other):
        return _computed("mul", super().__mul__(other), self, other)

    def __rmul__(self, other):
        return _computed("mul", super().__rmul__(other), other, self)

    def __truediv__(self, other):
        return _computed("div", super().__truediv__(other), self, other)

    def __rtruediv__(self, other):
        return _computed("div", super().__rtruediv__(other), other, self)

    def __neg__(self):
        return _computed("neg", super().__neg__(), self)


class _Int(_Number, int):
    def __new__(cls, value: int, source: dict):
        self = int.__new__(cls, value)
        self.source = source
        return self


class _Float(_Number, float):
    def __new__(cls, value: float, source: dict):
        self = float.__new__(cls, value)
        self.source = source
        return self


class _Str(str):
    """A string from a JSON: what is done to it before it is shown (sliced, replaced, substituted) is remembered, and
    it marks where it is shown when it holds a digit."""

    def __new__(cls, value: str, source: dict):
        self = str.__new__(cls, value)
        self.source = source
        return self

    def _then(self, value: str, *op) -> _Str:
        return _Str(value, {**self.source, "ops": [*self.source.get("ops", []), list(op)]})

    def __format__(self, spec: str) -> str:
        shown = str.__format__(self, spec)
        return _mark(shown, spec, self.source) if any(c.isdigit() for c in shown) else shown

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step is not None:
            return str.__getitem__(self, index)
        return self._then(str.__getitem__(self, index), "slice", index.start, index.stop)

    def replace(self, old: str, new: str) -> _Str:
        return self._then(str.replace(self, old, new), "replace", str(old), str(new))

    def strip(self) -> _Str:
        return self._then(str.strip(self), "strip")

    def removeprefix(self, prefix: str) -> _Str:
        return self._then(str.removeprefix(self, prefix), "removeprefix", str(prefix))

    def removesuffix(self, suffix: str) -> _Str:
        return self._then(str.removesuffix(self, suffix), "removesuffix", str(suffix))


def _sub(pattern: str, repl: str, value):
    """``re.sub(pattern, repl, value)``, remembered on a string from a JSON."""
    done = re.sub(pattern, repl, value)
    return value._then(done, "sub", pattern, repl) if isinstance(value, _Str) else done


def _tracked(node, name: str, path: tuple = ()):
    """A JSON's tree with every number and string remembering ``{"file": name, "key": [path...]}``, and every key
    its own path with ``"of": "key"`` (a key shown as a label: "greedy/batch64")."""
    if isinstance(node, dict):
        return {_Str(k, {"file": name, "key": [*path, k], "of": "key"}): _tracked(v, name, (*path, k))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_tracked(v, name, (*path, i)) for i, v in enumerate(node)]
    if isinstance(node, bool) or node is None:
        return node
    source = {"file": name, "key": list(path)}
    if isinstance(node, int):
        return _Int(node, source)
    if isinstance(node, float):
        return _Float(node, source)
    return _Str(node, source)


class _plain:
    """No markers while inside: for text that decides (a dictionary key, a comparison), not text that is shown."""

    def __enter__(self):
        global _marks
        self.saved, _marks = _marks, None

    def __exit__(self, *exc):
        global _marks
        _marks = self.saved


def _written(write, results: dict) -> tuple[str, list[list]]:
    """A block as ``write`` makes it from ``results``, and [offset, shown, format spec, source] for each value from
    a JSON it shows, in order."""
    global _marks
    saved, _marks = _marks, []
    try:
        marked = write(results)
        marks = _marks
    finally:
        _marks = saved
    out, sources, at = [], [], 0
    for m in _MARK.finditer(marked):
        out.append(marked[at:m.start()])
        shown, spec, source = marks[int(m.group(1))]
        sources.append([sum(map(len, out)), shown, spec, source])
        out.append(shown)
        at = m.end()
    out.append(marked[at:])
    body = "".join(out)
    with _plain():
        plain = write(results)
    if body != plain or "\ue000" in body:
        raise SystemExit(f"bench/results.py: {getattr(write, '__name__', write)}: the block's text depends on where "
                         "its values are marked: one was used as a key, or compared as text, once formatted")
    return body, sources


# --- reading a JSON


def load_all(directory: Path = RESULTS) -> dict[str, dict]:
    return {p.stem: _tracked(json.loads(p.read_text(encoding="utf-8")), p.stem)
            for p in sorted(directory.glob("*.json"))}


def get(record: dict | None, *path, default=None):
    """record[path[0]][path[1]]...; ``default`` where any step is missing or null."""
    node = record
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return default
        node = node[key]
    return node


def absent(name: str) -> str:
    """A block's text where ``bench/results/NAME.json`` does not exist."""
    return f"No {name}.json: {NOT_RECORDED}.\n"


def number(value, digits: int = 2, bold: bool = False) -> str:
    """``value`` with ``digits`` decimals and thousands separators; "not recorded" for a missing value."""
    if value is None:
        return NOT_RECORDED
    if isinstance(value, bool):
        return str(value).lower()
    text = f"{value:,}" if isinstance(value, int) and digits == 0 else f"{value:,.{digits}f}"
    return f"**{text}**" if bold else text


def text(value) -> str:
    """A string from a JSON, safe inside a Markdown table cell."""
    if value is None or value == "":
        return NOT_RECORDED
    value = value if isinstance(value, str) else str(value)
    safe = value.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return f"{safe}"


def counted(value: str, unit: str) -> str:
    """"4,656 steps", or "steps not recorded"."""
    return f"{unit} {NOT_RECORDED}" if value == NOT_RECORDED else f"{value} {unit}"


def link(name: str, prefix: str) -> str:
    """A link to ``bench/results/NAME.json``, marked where that JSON was written from a working tree with uncommitted
    changes (:func:`dirty`, on the pages that carry the note)."""
    named = _Str(name, {"file": name})  # the file's own name: its digits come from where the test finds the file
    return f"[{named}.json]({prefix}{named}.json)" + (DIRTY_MARK if name in _dirty else "")


def dirty(record: dict) -> bool:
    """Whether a results JSON was written from a working tree with uncommitted changes: its ``dirty`` field, or, in
    a JSON without one, a ``git_commit`` that ends in "-dirty"."""
    if isinstance(record.get("dirty"), bool):
        return record["dirty"]
    return str(record.get("git_commit") or "").endswith("-dirty")


def _ran(r: dict, name: str, extra: str = "") -> str:
    """"`command` (date, machine, torch, N thread[s]; extra; [name.json](...))": where a bench's numbers come from."""
    threads = r.get("threads")
    threads = f", {number(threads, 0)} thread{'' if threads == 1 else 's'}" if threads is not None else ""
    # recorded since the benches start under jemalloc as the command line does (attnkit.allocator)
    alloc = {"jemalloc": ", under jemalloc", "system": ", the bench's process under the C library's malloc"}.get(
        r.get("allocator"), "")
    # recorded since attnkit has MKL choose its kernels by the CPU's instructions (attnkit.mkl)
    mkl = f", MKL's kernels: {r['mkl_kernels']}" if r.get("mkl_kernels") else ""
    return (f"`{r.get('command') or NOT_RECORDED}` ({date(r)}, {machine(r)}, torch {torch_version(r)}{threads}"
            f"{alloc}{mkl}{'; ' + extra if extra else ''}; {link(name, '../bench/results/')})")


def machine(record: dict) -> str:
    cpus, cpu = get(record, "machine", "cpus"), get(record, "machine", "cpu")
    if cpu is None:
        return NOT_RECORDED
    cpu = _sub(r"\s+", " ", _sub(r"\((R|TM)\)", "", cpu)).strip()
    family, model = get(record, "machine", "cpu_family"), get(record, "machine", "cpu_model")
    if family is not None and model is not None:  # a bare name ("AMD EPYC") covers several generations
        cpu = f"{cpu} (family {family}, model {model})"
    return f"{cpus}-core {cpu}" if cpus else cpu


def per_machine(results: dict, bench: str) -> list[str]:
    """A bench's results files, one per machine it ran on: ``bench`` first, then ``bench_<machine>`` by name."""
    return [n for n in results if n == bench] + sorted(n for n in results if n.startswith(bench + "_"))


def torch_version(record: dict) -> str:
    return record.get("torch") or get(record, "versions", "torch", default=NOT_RECORDED)


def date(record: dict) -> str:
    return f"{record['date'][:10]}" if record.get("date") else NOT_RECORDED


def config(record: dict) -> str:
    """The config the JSON records; else the configs its command names; else "not recorded"."""
    recorded = record.get("config")
    if isinstance(recorded, str) and recorded:
        return f"`{recorded}`"
    if isinstance(recorded, dict):
        return f"`{recorded.get('name', 'config')}` (in full in the JSON)"
    named = sorted(set(re.findall(r"configs/[\w.-]+\.toml", record.get("command") or "")))
    return ", ".join(f"`{c}` (its command)" for c in named) or NOT_RECORDED


def epochs(record: dict) -> str:
    value = record.get("epochs_completed", record.get("epochs"))
    return number(value, 0) if value is not None else NOT_RECORDED


def split_name(test_set: str | None) -> str:
    """The split out of a JSON's "corpus split [languages]" ("multi30k test_2016_flickr en-de"), for the short
    table."""
    words = (test_set or NOT_RECORDED).split()
    if len(words) > 1 and words[0].islower() and words[0] != "not":
        words = words[1:]  # the corpus: the row names it
    if len(words) > 1 and re.fullmatch(r"[a-z]{2,3}-[a-z]{2,3}", words[-1]):
        words = words[:-1]  # the language pair: the row names it
    return " ".join(words)


def minutes(record: dict, key: str = "train_minutes") -> str:
    return number(record.get(key), 1)


def coco(scores: dict | None) -> str:
    """"BLEU-1 60.12, ..., CIDEr 51.30" from a metrics.coco table; "" where there is none."""
    if not isinstance(scores, dict):
        return ""
    return ", ".join(f"{name} {number(scores[key])}" for key, name in COCO.items() if scores.get(key) is not None)


# --- the blocks


def block_translation(results: dict) -> str:
    records = [(name, label, target, results.get(name)) for name, label, target in TRANSLATION]
    # the BLEU the papers print (lowercased, Moses-tokenised), where the JSONs hold it
    papers = any(get(r, "metrics", "paper_bleu") is not None for *_, r in records)
    targets = any(get(r, "metrics", "target", "paper_bleu") is not None for *_, r in records)
    head = ["model", "BLEU", *(["paper-style BLEU"] if papers else []), *(["published target"] if targets else []),
            "chrF2", "test set", "beam",
            "checkpoint (its valid BLEU)", "training", "JSON"]
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    signatures: dict[str, set[str]] = {"BLEU": set(), "paper-style BLEU": set(), "chrF2": set()}
    for name, label, target, r in records:
        if r is None:
            rows.append(f"| {label} (`{target}`) | {' | '.join([NOT_RECORDED] * (len(head) - 2))} | no {name}.json |")
            continue
        m = r.get("metrics", {})
        for what, key in (("BLEU", "signature"), ("paper-style BLEU", "paper_bleu_signature"),
                          ("chrF2", "chrf_signature")):
            if m.get(key):
                signatures[what].add(m[key])
        chosen = [s for s in r.get("selection_on_valid", []) if s.get("checkpoint") == r.get("checkpoint")
                  and s.get("len_penalty") == r.get("len_penalty")]
        step = f"step {number(r['checkpoint_step'], 0)}, " if r.get("checkpoint_step") is not None else ""
        valid = f" ({step}{number(chosen[0]['valid_bleu'])})" if chosen else ""
        training = [counted(minutes(r), "training minutes"), counted(number(r.get("steps"), 0), "steps"),
                    counted(epochs(r), "epochs"), counted(number(r.get("tokens_per_s"), 0), "target tokens/s"),
                    counted(minutes(r, "wall_minutes_including_validation"), "wall minutes with validation")]
        if len(r.get("launches") or []) > 1:
            training.append(f"{len(r['launches'])} launches (resumed with `--resume`)")
        lowercased = " (lowercased)" if m.get("lowercased") else ""  # sacreBLEU's case:lc, for lowercased output
        cells = [f"{label} (`{target}`)", number(m.get("bleu"), bold=True) + lowercased,
                 *([number(m.get("paper_bleu"))] if papers else []), *([_bleu_target(m)] if targets else []),
                 number(m.get("chrf")), text(m.get("test_set")),
                 number(r.get("beam"), 0), f"{text(r.get('checkpoint'))}{valid}", ", ".join(training),
                 link(name, "../bench/results/")]
        rows.append("| " + " | ".join(cells) + " |")
    lines = rows + [""]
    for what, found in signatures.items():
        if found or what != "paper-style BLEU":
            lines.append(f"{what} signature: " + (", ".join(f"`{s}`" for s in sorted(found)) or NOT_RECORDED) + ".")
    return "\n".join(lines) + "\n"


def _bleu_target(m: dict) -> str:
    """"at least 41.0 (who published it): met" (or missed), from a translation JSON's metrics.target."""
    t = m.get("target") or {}
    if t.get("paper_bleu") is None:
        return "none"
    verdict = NOT_RECORDED if m.get("paper_bleu") is None else "met" if m["paper_bleu"] >= t["paper_bleu"] else "missed"
    minutes = f" in {number(t['train_minutes'], 0)} training minutes" if t.get("train_minutes") else ""
    return f"at least {number(t['paper_bleu'], 1)}{minutes} ({text(t.get('published'))}): {verdict}"


def _bucket(b: dict) -> str:
    return f"{b['min_len']}+" if b.get("max_len") is None else f"{b['min_len']}-{b['max_len']}"


def block_by_length(results: dict, name: str) -> str:
    r = results.get(name)
    if r is None:
        return f"No {name}.json: {NOT_RECORDED}.\n"
    m = r.get("metrics", {})
    systems = r.get("systems", {})
    buckets = next(iter(systems.values()), {}).get("by_length", [])
    head = "| model | checkpoint | BLEU | chrF2 | " + " | ".join(f"{_bucket(b)} words" for b in buckets) + " |"
    rows = [head, "|---" * (4 + len(buckets)) + "|",
            "| sentences | | | | " + " | ".join(number(b.get("n"), 0) for b in buckets) + " |"]
    for label, s in systems.items():
        step = _sub(r"^.*/", "", s.get("checkpoint") or NOT_RECORDED)  # the checkpoint's directory name
        rows.append(f"| {label} | {step} | {number(s.get('bleu'), bold=True)} | {number(s.get('chrf'))} | "
                    + " | ".join(number(b.get("bleu")) for b in s.get("by_length", [])) + " |")
    trained = [f"{label} {number(s.get('train_minutes'), 1)} minutes, {number(s.get('epochs_completed'), 0)} "
               f"epochs, {number(s.get('tokens_per_s'), 0)} target tokens/s" for label, s in systems.items()
               if s.get("train_minutes") is not None]
    how = ("; ".join(trained) + "." if len(trained) == len(systems) else
           f"{NOT_RECORDED} in this JSON, which records the checkpoints it scored.")
    lines = [f"{text(m.get('test_set'))}: {number(m.get('sentences'), 0)} sentences, beam "
             f"{number(r.get('beam'), 0)}, BLEU signature `{m.get('signature') or NOT_RECORDED}` "
             f"({link(name, '../bench/results/')}). The systems' training: {how}", "", *rows]
    return "\n".join(lines) + "\n"


# the captioning recipes: results name, label, make target
CAPTIONING = [("flickr8k_sat", "Show, Attend and Tell", "make flickr8k"),
              # the same recipe on the 224-pixel images as they come (a 7x7 grid): what the larger grid is worth
              ("flickr8k_sat_224", "Show, Attend and Tell, 224-pixel images", "data.image_size = 224"),
              ("flickr8k_transformer", "Transformer captioner", "make flickr8k-transformer")]


# the split the captioning recipes validate on and whose scores chose among the recipe's versions (the rows of
# the table): a score there is no held-out figure; the test split's would be
CAPTION_SELECTION_SPLIT = "dev"


def _selected_on(m: dict) -> bool:
    """Whether a captioning JSON scores the split the recipe's versions were chosen on."""
    return CAPTION_SELECTION_SPLIT in str(m.get("split") or "").split()


def _caption_target(m: dict) -> str:
    """The published figure a captioner is held to, in the COCO evaluation, and whether the run met it; on the
    split that chose among the recipe's versions, said as such."""
    t = m.get("target") or {}
    if t.get("bleu4") is None:
        return text(t.get("published")) if t else NOT_RECORDED
    goal = f"BLEU-4 at least {number(t['bleu4'])} and METEOR at least {number(t.get('meteor'))}"
    goal += f" within {number(t['train_minutes'], 0)} minutes" if t.get("train_minutes") else ""
    goal += f" ({text(t['published'])})" if t.get("published") else ""
    judged = [(get(m, "coco", k), t.get(k)) for k in ("bleu4", "meteor")]
    if any(value is None or bound is None for value, bound in judged):
        return f"{goal}: {NOT_RECORDED}"
    verdict = "met" if all(value >= bound for value, bound in judged) else "missed"
    if _selected_on(m):
        return (f"{goal}: {verdict} on {CAPTION_SELECTION_SPLIT}, which chose among the recipe's versions and so is "
                "not held out; no test score is recorded")
    return f"{goal}: {verdict}"


def _missing_row(label: str, target: str, name: str, columns: int) -> str:
    """A recipe's table row while its JSON does not exist: ``columns`` cells not recorded."""
    return f"| {label} (`{target}`) | {' | '.join([NOT_RECORDED] * columns)} | no {name}.json |"


def block_captioning(results: dict) -> str:
    rows = ["| model | split | BLEU-1 / 2 / 3 / 4 | COCO evaluation | published target | beam | checkpoint | "
            "training | JSON |", "|---|---|---|---|---|---|---|---|---|"]
    definitions = {}
    others = []
    for name, label, target in CAPTIONING:
        r = results.get(name)
        if r is None:
            rows.append(_missing_row(label, target, name, 7))
            continue
        m = r.get("metrics", {})
        scores = " / ".join(number(m.get(k)) for k in ("bleu1", "bleu2", "bleu3", "bleu4"))
        # under a tenth of a minute: every grid was in the cache an earlier run filled
        extraction = r.get("feature_extraction_minutes")
        cached = isinstance(extraction, (int, float)) and extraction < 0.1
        training = [f"grids read from the cache ({number(extraction, 2)} minutes)" if cached else
                    counted(minutes(r, "feature_extraction_minutes"), "minutes of grid extraction"),
                    counted(minutes(r), "training minutes"), counted(number(r.get("steps"), 0), "steps"),
                    counted(epochs(r), "epochs"),
                    counted(minutes(r, "wall_minutes_including_feature_extraction"), "wall minutes in all")]
        split = text(m.get("split")) + ("; model selection, not held out" if _selected_on(m) else "")
        rows.append(f"| {label} (`{target}`) | {split} | **{scores}** | "
                    f"{coco(m.get('coco')) or NOT_RECORDED} | {_caption_target(m)} | {number(r.get('beam'), 0)} | "
                    f"{text(r.get('checkpoint'))} | {', '.join(training)} | {link(name, '../bench/results/')} |")
        definitions.setdefault("BLEU", m.get("bleu_definition"))
        if m.get("coco"):
            definitions.setdefault("The COCO caption evaluation", m.get("coco_definition"))
        also = []
        for key in ("best_checkpoint", "last_checkpoint"):
            if get(r, key, "bleu4") is not None:
                extra = f"; COCO {coco(get(r, key, 'coco'))}" if coco(get(r, key, "coco")) else ""
                also.append(f"the {key.split('_')[0]} checkpoint's BLEU-4 {number(get(r, key, 'bleu4'))}{extra}")
        if also:
            others.append(f"{label}, the other checkpoints on the same split: " + ", ".join(also) + ".")
    lines = [*rows, ""]
    if any(_selected_on(results[name].get("metrics", {})) for name, *_ in CAPTIONING if name in results):
        lines.append(f"The {CAPTION_SELECTION_SPLIT} split also chose among the recipe's versions (the Show, Attend "
                     "and Tell rows) and is where each captioner validates during training, so no score on it is "
                     "held out; the held-out split is test, which these JSONs do not score.")
    lines += [f"{what}: {text(definition)}." for what, definition in definitions.items()]
    return "\n".join(lines + others) + "\n"


# how a language model's validation split is scored: the figure each protocol gives, in the JSON's metrics
def _lm_figures(r: dict, m: dict) -> list[tuple[str, str, dict | None]]:
    """(protocol, how it scores, its figure) for each protocol a language-model JSON records: disjoint blocks (the
    metrics' own figures), each sliding window, and the continuous cache over a sliding window."""
    unit = "characters" if m.get("valid_bpc") is not None else "words"
    size = get(r, "config", "data", "block_size")
    figures = [("blocks", f"disjoint blocks of {number(size, 0)} {unit}" if size is not None else "disjoint blocks",
                m)]
    for i, w in enumerate(m.get("sliding_window") or [{}]):
        figures.append((f"sliding_window/{i}", f"a sliding window (window {number(w.get('window'), 0)}, stride "
                        f"{number(w.get('stride'), 0)})", w or None))
    cache = m.get("continuous_cache")
    if cache:
        figures.append(("continuous_cache", f"a continuous cache over the sliding window (window "
                        f"{number(cache.get('window'), 0)}, stride {number(cache.get('stride'), 0)}), its settings "
                        f"chosen on this split", cache))
    return figures


def _lm_result(m: dict, figure: dict | None, judged: bool) -> str:
    """The figure a protocol gives: the loss and bits per character for characters, the perplexity for words; bold
    where the row holds the target's verdict."""
    figure = figure or {}
    if m.get("valid_bpc") is not None:  # characters
        return (f"validation loss {number(figure.get('valid_loss'), 3, bold=judged)} "
                f"({number(figure.get('valid_bpc'), 3)} bits per character)")
    return f"validation perplexity {number(figure.get('valid_ppl'), 1, bold=judged)}"


# the protocol of the published figure a language model's target is held to, and how the other rows are told apart
# from it: nanoGPT's estimate_loss averages the loss over blocks of its context, the literature's word-level
# perplexities give every word its context, as a sliding window does
LM_PUBLISHED_PROTOCOL = {"blocks": "over blocks", "sliding_window/0": "with every token given its context"}
LM_PROTOCOL_ROW = {"blocks": "the disjoint blocks' row", "sliding_window/0": "the sliding window's row"}


def _target(m: dict, figure: dict | None, protocol: str) -> str:
    """The target's goal and the verdict on ``figure``, scored by ``protocol``: the published figure's own."""
    t = m.get("target") or {}
    goal = [f"validation loss at most {number(t['valid_loss'], 2)}" if t.get("valid_loss") is not None else "",
            f"validation perplexity at most {number(t['valid_ppl'], 1)}" if t.get("valid_ppl") is not None else ""]
    goal = " and ".join(g for g in goal if g)
    if not goal:
        return NOT_RECORDED
    goal += f" within {number(t['train_minutes'], 0)} training minutes" if t.get("train_minutes") else ""
    goal += f" ({text(t['published'])})" if t.get("published") else ""
    judged = [((figure or {}).get(k), t[k]) for k in ("valid_loss", "valid_ppl") if t.get(k) is not None]
    if any(value is None for value, _ in judged):
        return (f"{goal}: {NOT_RECORDED} {LM_PUBLISHED_PROTOCOL[protocol]}, as the target is scored; no other "
                "protocol's figure is compared with it")
    verdict = "met" if all(value <= bound for value, bound in judged) else "missed"
    return f"{goal}: {verdict}, scored {LM_PUBLISHED_PROTOCOL[protocol]} as the target is"


def _lm_unjudged(protocol: str, judged_on: str) -> str:
    """The target cell of a row scored by another protocol than the published figure's."""
    if protocol == "continuous_cache":
        return ("none: the cache's settings were chosen on this split (each half with the other half's best), so "
                "its figure is not held out and is not held to the target; the model alone is")
    return (f"none: a different protocol from the target's, which is scored {LM_PUBLISHED_PROTOCOL[judged_on]} "
            f"({LM_PROTOCOL_ROW[judged_on]}); not comparable with it")


def _cache_note(label: str, cache: dict) -> str:
    """A sentence on how a continuous-cache figure was reached: each half's settings, and the published pair."""
    folds = "; ".join(
        f"the {text(f.get('scored'))} {number(f.get('valid_ppl'), 1)} (the model alone {number(f.get('model_ppl'), 1)};"
        f" cache {number(f.get('cache_size'), 0)} tokens, theta {f.get('theta')}, lambda {f.get('lambda')}, "
        f"chosen on the {text(f.get('tuned_on'))})" for f in cache.get("folds", []))
    return (f"{label} with the continuous cache: {folds}. Published: {text(cache.get('published'))} "
            f"(their split is test, ours valid).")


def block_language_models(results: dict) -> str:
    rows = ["| recipe | split | protocol | result | target | parameters | training | JSON |",
            "|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, label, target, judged_on in LANGUAGE_MODELS:
        r = results.get(name)
        if r is None:
            rows.append(_missing_row(label, target, name, 6))
            continue
        m = r.get("metrics", {})
        training = [counted(minutes(r), "training minutes"), counted(number(r.get("step"), 0), "steps"),
                    counted(epochs(r), "epochs"), counted(number(r.get("tokens_per_s"), 0), "tokens/s")]
        run = [number(r.get("parameters"), 0), ", ".join(training)]
        for protocol, how, figure in _lm_figures(r, m):
            judged = protocol == judged_on
            verdict = _target(m, figure, protocol) if judged else _lm_unjudged(protocol, judged_on)
            rows.append(f"| {label} (`{target}`) | {text(r.get('split'))} | {how} | {_lm_result(m, figure, judged)} | "
                        f"{verdict} | {' | '.join(run)} | {link(name, '../bench/results/')} |")
            run = ["the same run", "the same run"]
        if m.get("continuous_cache"):
            notes.append(_cache_note(label, m["continuous_cache"]))
    return "\n".join(rows + ([""] + notes if notes else [])) + "\n"


def block_transfer(results: dict) -> str:
    r = results.get("transfer")
    if r is None:
        return absent("transfer")
    m = r.get("metrics", {})
    steps = [c[-1]["step"] for c in (get(r, "curves", "finetune"), get(r, "curves", "scratch")) if c]
    pretrain = r.get("pretrain_curve") or []
    lines = [
        f"Validation loss after {number(steps[0], 0) if steps else NOT_RECORDED} steps on Tiny Shakespeare: "
        f"**{number(m.get('finetune_valid_loss'), 3)}** fine-tuned from the WikiText-2 model against "
        f"**{number(m.get('scratch_valid_loss'), 3)}** from scratch, "
        f"{number(m.get('gain_nats_per_subword'), 2)} nats per subword gained. The pretrained model: validation "
        f"loss {number(m.get('pretrain_valid_loss'), 3)} after "
        f"{number(pretrain[-1]['step'], 0) if pretrain else NOT_RECORDED} steps, "
        f"{counted(minutes(r, 'pretrain_minutes'), 'training minutes')} ({link('transfer', '../bench/results/')}, "
        "curves in [transfer.png](../bench/results/transfer.png))."]
    return "\n".join(lines) + "\n"


# (JSON, task, the score its target is in, how it was run); the recipes, then the variants measured beside them
FINE_TUNING = [("glue_sst2", "SST-2", "accuracy", "`make sst2`"), ("glue_mrpc", "MRPC", "f1", "`make mrpc`"),
               ("glue_stsb", "STS-B", "spearman", "`make stsb`")]
FINE_TUNING_VARIANTS = [("glue_sst2_lr2e-5", "SST-2", "accuracy", "`make sst2` with `--set train.lr=2e-5`")]
_SCORE_NAMES = {"accuracy": "accuracy", "f1": "F1", "matthews": "Matthews corr.", "pearson": "Pearson",
                "spearman": "Spearman"}


def _glue_scores(m: dict, headline: str) -> str:
    names = [k for k in _SCORE_NAMES if f"dev_{k}" in m]
    return ", ".join((f"**{_SCORE_NAMES[k]} {number(m[f'dev_{k}'])}**" if k == headline
                      else f"{_SCORE_NAMES[k]} {number(m[f'dev_{k}'])}") for k in names)


def block_fine_tuning(results: dict) -> str:
    rows = ["| task | dev result | target | training | JSON |", "|---|---|---|---|---|"]
    for name, label, headline, how in FINE_TUNING + [v for v in FINE_TUNING_VARIANTS if v[0] in results]:
        r = results.get(name)
        if r is None:
            rows.append(f"| {label} ({how}) | {NOT_RECORDED} | {NOT_RECORDED} | {NOT_RECORDED} | no {name}.json |")
            continue
        m = r.get("metrics", {})
        t = m.get("target") or {}
        goal = (f"{_SCORE_NAMES[headline]} at least {number(t.get(f'dev_{headline}'))} within "
                f"{number(t.get('train_minutes'), 0)} training minutes ({text(t.get('source'))})" if t
                else NOT_RECORDED)
        training = [counted(minutes(r), "training minutes"), counted(number(r.get("step"), 0), "steps"),
                    counted(epochs(r), "epochs"), counted(number(r.get("examples_per_s"), 0), "examples/s"),
                    f"best at step {number(r.get('best_step'), 0)} ({minutes(r, 'best_minutes')} min)"]
        rows.append(f"| {label} ({how}) | {_glue_scores(m, headline)} "
                    f"({number(m.get('dev_examples'), 0)} dev examples) | {goal} | {', '.join(training)} | "
                    f"{link(name, '../bench/results/')} |")
    return "\n".join(rows) + "\n"


# easy-VQA's systems in the order of the lecture's argument: question alone, the image pooled, the image attended
VQA_SYSTEMS = ("none", "pooled", "glimpses")
VQA_TYPES = (("color", "color"), ("shape", "shape"), ("yes_no", "yes/no"))


def block_vqa(results: dict) -> str:
    r = results.get("easy_vqa")
    if r is None:
        return absent("easy_vqa")
    m = r.get("metrics", {})
    t = m.get("target") or {}
    rows = ["| system | test accuracy | " + " | ".join(label for _, label in VQA_TYPES) + " | training |",
            "|---|---|" + "---|" * len(VQA_TYPES) + "---|"]
    for name in VQA_SYSTEMS:
        s = get(r, "systems", name)
        if s is None:
            rows.append(f"| {name} | {NOT_RECORDED} |" + f" {NOT_RECORDED} |" * (len(VQA_TYPES) + 1))
            continue
        training = [counted(number(s.get("train_minutes"), 1), "training minutes"),
                    counted(number(s.get("steps"), 0), "steps"), counted(number(s.get("epochs_completed"), 0),
                                                                         "epochs")]
        rows.append(f"| {text(s.get('title'))} | **{number(s.get('test_accuracy'))}** | "
                    + " | ".join(number(s.get(f"test_accuracy_{key}")) for key, _ in VQA_TYPES)
                    + f" | {', '.join(training)} |")
    return "\n".join(rows) + (f"\n\n{number(m.get('test_questions'), 0)} test questions; the target: at least "
                              f"{number(t.get('test_accuracy'), 1)}% within {number(t.get('train_minutes'), 0)} "
                              f"training minutes ({link('easy_vqa', '../bench/results/')}).\n")
SPEECH = [("fsdd_digits_las", "LAS"), ("fsdd_digits_speech_transformer", "Speech Transformer")]
SPEAKERS = ("george", "jackson", "nicolas", "theo", "yweweler")


def block_speech(results: dict) -> str:
    """`make fsdd-digits`: each family on test strings of unseen recordings, then its speaker-held-out folds."""
    rows = ["| model | data | decoding | training minutes | CER | WER (digit error rate) | string accuracy | JSON |",
            "|---|---|---|---|---|---|---|---|"]
    for name, label in SPEECH:
        for speaker in ("", *SPEAKERS):
            key = f"{name}_heldout_{speaker}" if speaker else name
            data = f"digit strings, {speaker} held out" if speaker else "digit strings, unseen recordings"
            if key in EARLIER_CONFIG:
                data += f"; {EARLIER_CONFIG[key]}"
            r = results.get(key)
            if r is None:
                rows.append(f"| {label} | {data} |" + f" {NOT_RECORDED} |" * 5 + f" no {key}.json |")
                continue
            rows.append(_speech_row(label, data, r, key))
        for key in sorted(k for k in results if k.startswith(f"{name}_") and "_heldout_" not in k):
            data = f"digit strings, unseen recordings; {_differs(results[key], key)}"
            rows.append(_speech_row(label, data, results[key], key))
    runs = [(label, key) for name, label in SPEECH
            for key in sorted(k for k in results if k == name or (k.startswith(f"{name}_") and "_heldout_" not in k))]
    return "\n".join(rows) + _validation_curves(results, runs) + "\n"


def _validation_curves(results: dict, runs: list[tuple[str, str]]) -> str:
    """The validation curves of the speech ``runs`` ([(label, JSON name)]) under their table: the budget's effect
    (still falling at its end, or flat) in the JSON's own points."""
    curves = []
    for label, key in runs:
        points = "; ".join(f"{number(c.get('step'), 0)}: {number(c.get('valid_loss'), 3)}, "
                           f"{number(c.get('valid_cer'))}" for c in results[key].get("curve", []))
        curves.append(f"- {label}, {link(key, '../bench/results/')}: {points}")
    return ("\n\nValidation curves (step: validation loss, validation CER, greedy):\n\n" + "\n".join(curves)
            if curves else "")


def _decoding(r: dict) -> str:
    """How a speech JSON's transcripts were searched: the beam, and CTC's share of the scores where it had one."""
    w = r.get("ctc_weight")
    return f"beam {r.get('beam', NOT_RECORDED)}, " + (f"CTC's share {w}" if w else "the decoder alone")


def _speech_row(label: str, data: str, r: dict, key: str) -> str:
    m = r.get("metrics", {})
    return (f"| {label} | {data} | {_decoding(r)} | {minutes(r)} | {number(m.get('test_cer'))} | "
            f"{number(m.get('test_digit_error_rate'))} | {number(m.get('test_string_accuracy'))} | "
            f"{link(key, '../bench/results/')} |")


# runs made before their recipe's config changed, so that their commands no longer say how they differ
LIGHTER_AUGMENTATION = "the earlier recipe's fewer strings and lighter SpecAugment"
# runs of the recipe's config whose trainer fitted the schedule's end from the speed over warmup alone
FITTED_AT_WARMUP = "its schedule's end fitted at warmup alone"
# the recipe's run decoded without CTC's prefix scores
ATTENTION_DECODING = "the recipe's run decoded by its attention decoder alone"
EARLIER_CONFIG = {"fsdd_digits_speech_transformer_one_thread": "the earlier, lower CTC weight",
                  "fsdd_digits_speech_transformer_lower_ctc_weight": "the earlier, lower CTC weight",
                  "fsdd_digits_las_lighter_augmentation": LIGHTER_AUGMENTATION,
                  "fsdd_digits_las_fitted_at_warmup": FITTED_AT_WARMUP,
                  "fsdd_digits_las_more_augment": FITTED_AT_WARMUP,
                  "fsdd_digits_las_one_thread": LIGHTER_AUGMENTATION,
                  "multi30k_speech_speech_transformer_without_ctc": "without joint CTC, as Dong et al. train it",
                  "multi30k_speech_speech_transformer_attention_decoding": ATTENTION_DECODING,
                  "fsdd_digits_speech_transformer_attention_decoding": ATTENTION_DECODING,
                  "fsdd_digits_speech_transformer_earlier_run": "an earlier run of the recipe's training settings",
                  "multi30k_speech_speech_transformer_attention_decoding_beam_8": ATTENTION_DECODING,
                  **{f"fsdd_digits_las_heldout_{speaker}": LIGHTER_AUGMENTATION for speaker in ("theo", "yweweler")}}


def _differs(r: dict, key: str) -> str:
    """What a run beside a recipe's changed, read from its command: its threads where not the recipe's two, and the
    keys its --set overrides changed (their values are in its JSON's command): a different budget or model, a row of
    its own."""
    words = str(r.get("command", "")).split()
    config = next((w for w in words if w.startswith("configs/") and w.endswith(".toml")), None)
    changes = [f"`{words[i + 1].partition('=')[0]}` changed" for i, w in enumerate(words[:-1])
               if w == "--set" and not _recipe_has(config, words[i + 1])]
    threads = next((words[i + 1] for i, w in enumerate(words[:-1]) if w == "--threads"), "2")
    if threads != "2":
        changes.insert(0, {"1": "one thread"}.get(threads, "threads as its command says"))
    if key in EARLIER_CONFIG:
        changes.append(EARLIER_CONFIG[key])
    return ", ".join(changes) or "the recipe's settings"


def _recipe_has(config: str | None, override: str) -> bool:
    """Whether the recipe ``config`` (configs/<name>.toml) now says what ``override`` ("section.key=value") set:
    then the override changed nothing from the recipe as it stands."""
    path = ROOT / config if config else None
    if path is None or not path.is_file():
        return False
    dotted, _, value = override.partition("=")
    section, _, key = dotted.partition(".")
    current = tomllib.loads(path.read_text(encoding="utf-8")).get(section, {}).get(key)
    try:  # the value read as `attnkit train --set` reads it (make results runs this without attnkit installed)
        wanted = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        wanted = value  # a bare string, as --set takes one
    return current is not None and current == wanted


SPEECH_MULTI30K = [("multi30k_speech_las", "LAS"), ("multi30k_speech_speech_transformer", "Speech Transformer")]


def block_speech_multi30k(results: dict) -> str:
    """`make multi30k-speech`: each family on test2016 spoken in the training voices and in the held-out voice."""
    rows = ["| model | decoding | training minutes | test2016 CER | WER | string accuracy | held-out voice CER | WER | "
            "JSON |", "|---|---|---|---|---|---|---|---|---|"]
    runs = []
    for name, label in SPEECH_MULTI30K:
        if name not in results:
            rows.append(f"| {label} |" + f" {NOT_RECORDED} |" * 7 + f" no {name}.json |")
        # the recipe's run, then the runs beside it (a changed setting each, said in the model column)
        for key in (name, *sorted(k for k in results if k.startswith(f"{name}_"))):
            if key not in results:
                continue
            r, m = results[key], results[key].get("metrics", {})
            model = label if key == name else f"{label}, {_differs(r, key)}"
            rows.append(f"| {model} | {_decoding(r)} | {minutes(r)} | {number(m.get('test_cer'))} | "
                        f"{number(m.get('test_wer'))} | "
                        f"{number(m.get('test_string_accuracy'))} | {number(m.get('held_out_voice_cer'))} | "
                        f"{number(m.get('held_out_voice_wer'))} | {link(key, '../bench/results/')} |")
            runs.append((label, key))
    return "\n".join(rows) + _validation_curves(results, runs) + "\n"


def block_speech_decoding(results: dict) -> str:
    """bench/decoding_sweep.py: each speech run's decodings scored on its validation split, the chosen one first."""
    sweeps = sorted(k for k in results if k.startswith("decoding_sweep_"))
    if not sweeps:
        return absent("decoding_sweep_multi30k_speech_speech_transformer")
    rows = ["| run | beam | CTC's share | validation CER | WER | string accuracy | JSON |",
            "|---|---|---|---|---|---|---|"]
    for key in sweeps:
        m = results[key].get("metrics", {})
        chosen = m.get("chosen", {})
        for row in m.get("rows", []):
            pick = row.get("beam") == chosen.get("beam") and row.get("ctc_weight") == chosen.get("ctc_weight")
            rows.append(f"| {key.removeprefix('decoding_sweep_')}{' (chosen)' if pick else ''} | {row.get('beam')} | "
                        f"{row.get('ctc_weight')} | {number(row.get('valid_cer'))} | {number(row.get('valid_wer'))} | "
                        f"{number(row.get('valid_string_accuracy'))} | {link(key, '../bench/results/')} |")
    return "\n".join(rows) + "\n"


def block_sst2_pretraining(results: dict) -> str:
    r = results.get("sst2_pretraining")
    if r is None:
        return absent("sst2_pretraining")
    rows = ["| system | SST-2 dev accuracy | minutes | run on | JSON |", "|---|---|---|---|---|"]
    for row in get(r, "metrics", "rows", default=[]):
        source = Path(get(row, "detail", "json", default="") or "").stem  # a fine-tuning run's own JSON
        run = results.get(source, r)
        rows.append(f"| {text(row.get('system'))} | {number(row.get('dev_accuracy'))} | "
                    f"{number(row.get('minutes'), 1)} | {machine(run)}, {date(run)} | "
                    f"{link(source or 'sst2_pretraining', '../bench/results/')} |")
    return "\n".join(rows) + f"\n\ntorch {torch_version(r)} ({link('sst2_pretraining', '../bench/results/')}).\n"


def block_complexity(results: dict) -> str:
    r = results.get("complexity")
    if r is None:
        return absent("complexity")
    grid = r.get("grid", {})
    ns, ds = grid.get("ns", []), grid.get("ds", [])
    structure = get(r, "metrics", "structure", default={})
    path_ns = [p.get("n") for p in next(iter(structure.values()), [])]
    threads = f"{number(r.get('threads'), 0)} thread{'' if r.get('threads') == 1 else 's'}"
    lines = [f"`{r.get('command') or NOT_RECORDED}` ({date(r)}): {number(r.get('seconds'), 0)} s; time and FLOPs "
             f"at n = {', '.join(map(str, ns))} and d = {', '.join(map(str, ds))}, batch "
             f"{number(grid.get('batch'), 0)}, {threads}; convolution kernel {number(r.get('kernel'), 0)} "
             f"([complexity.json](../bench/results/complexity.json), "
             "[complexity.png](../bench/results/complexity.png)).", "",
             "| layer | sequential steps at n = " + " / ".join(map(str, path_ns)) + " | longest path | "
             "equal to the lectures' table |", "|---|---|---|---|"]
    for layer, points in structure.items():
        steps = " / ".join("-" if p.get("sequential_steps") is None else str(p["sequential_steps"]) for p in points)
        path = " / ".join("-" if p.get("path_length") is None else str(p["path_length"]) for p in points)
        same = all(p.get("sequential_steps") == p.get("theory_sequential_steps")
                   and p.get("path_length") == p.get("theory_path_length") for p in points)
        lines.append(f"| {LAYERS.get(layer, layer.replace('_', ' '))} | {steps} | {path} | {'yes' if same else 'no'} |")
    lines += ["", "| d | self-attention's forward FLOPs exceed the GRU's from n = | its forward + backward time, "
              "from n = | the fused kernel's, from n = |", "|---|---|---|---|"]
    never = "not within the grid"
    for d, c in get(r, "metrics", "crossover_n", default={}).items():
        cells = [never if c.get(k) is None else number(c[k], 0) for k in ("flops", "time", "time_fused")]
        lines.append(f"| {d} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def block_sources(results: dict) -> str:
    rows = ["| JSON | config | machine | torch | date | training minutes | epochs |",
            "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        rows.append(f"| {link(name, '../bench/results/')} | {config(r)} | {machine(r)} | "
                    f"{torch_version(r)} | {date(r)} | {minutes(r)} | {epochs(r)} |")
    return "\n".join(rows) + "\n"


def block_readme(results: dict) -> str:
    """The README's table: one line a recipe, the detail in docs/results.md."""
    p = "bench/results/"
    rows = ["| recipe | result | training | JSON |", "|---|---|---|---|"]

    def row(name: str, label: str, result, training) -> None:
        r = results.get(name)
        if r is None:
            rows.append(f"| {label} | {NOT_RECORDED} | {NOT_RECORDED} | no {name}.json |")
        else:
            rows.append(f"| {label} | {result(r, r.get('metrics', {}))} | {training(r)} | [JSON]({p}{name}.json) |")

    def trained(r: dict) -> str:
        text = f"{minutes(r)} min" if r.get("train_minutes") is not None else NOT_RECORDED
        return text + (f", {epochs(r)} epochs" if r.get("epochs_completed") is not None else "")

    def trained_each(r: dict) -> str:  # a JSON of several systems: each one's run
        systems = list(r.get("systems", {}).values())
        if not systems or any(s.get("train_minutes") is None for s in systems):
            return NOT_RECORDED
        return (" / ".join(minutes(s) for s in systems) + " min, "
                + " / ".join(epochs(s) for s in systems) + " epochs")

    for name, label, _ in TRANSLATION:
        row(name, f"Multi30k en→de, {label}", lambda r, m: f"BLEU {number(m.get('bleu'))}"
            + (" (lowercased)" if m.get("lowercased") else "")
            + (f", paper-style BLEU {number(m['paper_bleu'])}" if m.get("paper_bleu") is not None else "")
            + f", chrF2 {number(m.get('chrf'))} ({split_name(m.get('test_set'))})", trained)
    row("bleu_by_length_tatoeba", "Tatoeba by length: " + " / ".join(
        get(results, "bleu_by_length_tatoeba", "metrics", "bleu", default={})),
        lambda r, m: "BLEU " + " / ".join(number(v) for v in m.get("bleu", {}).values())
        + f" ({split_name(m.get('test_set'))})", trained_each)
    for name, label in (("flickr8k_sat", "Show-Attend-Tell"), ("flickr8k_transformer", "Transformer")):
        if name == "flickr8k_sat" or name in results:
            row(name, f"Flickr8k, {label}", lambda r, m: (
                f"COCO BLEU-4 {number(get(m, 'coco', 'bleu4'))}, METEOR {number(get(m, 'coco', 'meteor'))}"
                if m.get("coco") else f"BLEU-1 {number(m.get('bleu1'))}, BLEU-4 {number(m.get('bleu4'))}")
                + f" (dev, beam {number(r.get('beam'), 0)})", trained)
    row("tinyshakespeare_char", "Tiny Shakespeare, character GPT",
        lambda r, m: f"validation loss {number(m.get('valid_loss'), 3)} (blocks)"
        f"; {number(get(m, 'sliding_window', default=[{}])[0].get('valid_loss'), 3)} (sliding window)", trained)
    row("wikitext2_word", "WikiText-2, word GPT", lambda r, m: "validation perplexity "
        f"{number(get(m, 'sliding_window', default=[{}])[0].get('valid_ppl'), 1)} (sliding window)"
        + (f"; {number(get(m, 'continuous_cache', 'valid_ppl'), 1)} (valid-tuned cache)"
           if m.get("continuous_cache") else ""), trained)
    row("transfer", "transfer to Tiny Shakespeare", lambda r, m: f"validation loss "
        f"{number(m.get('finetune_valid_loss'), 3)} fine-tuned vs {number(m.get('scratch_valid_loss'), 3)} "
        "from scratch", trained)
    for name, label, headline, _ in FINE_TUNING:
        row(name, f"{label}, MiniLM fine-tuned", lambda r, m, h=headline: f"dev {_SCORE_NAMES[h]} "
            f"{number(m.get(f'dev_{h}'))}", trained)
    shown = [results[n] for n in ("multi30k_en_de", "multi30k_en_de_rnnsearch", "multi30k_en_de_rnnencdec",
                                  "bleu_by_length_tatoeba", "flickr8k_sat", "flickr8k_transformer",
                                  "tinyshakespeare_char", "wikitext2_word",
                                  "transfer", *(n for n, *_ in FINE_TUNING)) if n in results]
    where = {}
    for r in shown:  # one entry a machine and torch: told apart by their text, then shown from the first such run
        with _plain():
            key = f"{machine(r)}, torch {torch_version(r)}"
        where.setdefault(key, f"{machine(r)}, torch {torch_version(r)}")
    return "\n".join(rows) + f"\n\nRun on: {'; '.join(where[k] for k in sorted(where)) or NOT_RECORDED}.\n"


def _local(path: str | None) -> str | None:
    """A checkpoint path as its run names it (from ``runs/``), not the machine's absolute path."""
    return path if path is None or "/runs/" not in path else _sub(r"^.*?/runs/", "runs/", path)


def block_decode_precision(results: dict) -> str:
    """attnkit at each precision against CTranslate2, cell by cell, and BLEU per precision: one table per machine
    (decode_precision.json, then decode_precision_<machine>.json for each other machine it ran on)."""
    names = per_machine(results, "decode_precision")
    if not names:
        return absent("decode_precision")
    return "\n".join(_decode_precision(results[n], n) for n in names)


def _decode_precision(r: dict, name: str) -> str:
    systems = r.get("systems", {})
    labels = list(systems.get("attnkit_fp32", {}))
    names = [n for n in systems if n.startswith("attnkit_")] + [n for n in systems if n.startswith("ctranslate2")]
    flags = ", ".join(get(r, "metrics", "cpu_flags", default=[]))
    lines = [f"**{machine(r)}.** " + _ran(r, name, f"CPU flags: {flags}; "
                  f"checkpoint `{text(_local(r.get('checkpoint')))}`; batch-1 cells over the first "
                  f"{number(r.get('batch1_sentences'), 0)} sentences, batch 64 over {number(r.get('sentences'), 0)}"
                  + (f", each cell's turns timed {number(r['repeats'], 0)} times over" if r.get("repeats") else ""))
             + ".", "",
             "| tokens/s | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(number(get(systems, n, label, "tokens_per_s"), 0) for n in names)
                     + " |")
    lines.append("| BLEU, beam 5 (test) | " + " | ".join(number(get(systems, n, "beam5/batch64", "bleu"))
                                                     for n in names) + " |")
    if any(get(systems, n, label, "first_pass_tokens_per_s") is not None for n in names for label in labels):
        lines += ["", "The same cells in each system's first pass over them, before the turns (one-time costs "
                  "included: compiling, the compiled steps' checks, kernels made for new shapes):", "",
                  "| tokens/s, first pass | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for label in labels:
            lines.append(f"| {label} | " + " | ".join(
                number(get(systems, n, label, "first_pass_tokens_per_s"), 0) for n in names) + " |")
    eager = " (attnkit_fp32_eager: eagerly, `--no-compile`)" if "attnkit_fp32_eager" in systems else ""
    lines += ["", f"attnkit's precision columns decode {text(get(r, 'metrics', 'attnkit', default='eagerly'))}"
              f"{eager}."]
    kept = get(r, "metrics", "compiled_steps", default={})
    if kept:
        lines.append("Each compiled step, checked against the eager one on the first batches: " + "; ".join(
            f"{name}: " + ", ".join(f"{step} {text(how)}" for step, how in steps.items())
            for name, steps in kept.items()) + ".")
    wide = {name: n for name, n in get(r, "metrics", "wide_sentences", default={}).items() if n is not None}
    if wide:
        counts = "; ".join(f"{name}: {number(n, 0)}" for name, n in wide.items())
        lines.append("Searches of this many sentences or more ran graphs whose linear layers are oneDNN's products of "
                     f"packed weights (`WIDE_GRAPH`): {counts}.")
    effect = get(r, "metrics", "bleu_shortlist_effect", default={})
    if effect:
        lines.append(f"With the vocabulary shortlist `{text(_local(r.get('shortlist')))}` (the `_shortlist` columns: "
                     "`--shortlist`; CTranslate2's `_vmap` columns: the same map, `use_vmap`), BLEU minus BLEU "
                     "without it at the same precision: " + "; ".join(
                         f"{text(k)} {'+' if v > 0 else ''}{number(v, 2)}" for k, v in effect.items()) + ".")
    target = _times(get(r, "metrics", "targets", "over_ctranslate2"), 1)
    lines += ["", f"attnkit over CTranslate2 at the same precision, cell by cell (the target is at least {target}):",
              ""]
    ratios = r.get("ratios", {})
    pairs = [("fp32", "float32"), ("int8", "int8"), ("fp32_shortlist", "float32_vmap"), ("int8_shortlist", "int8_vmap")]
    lines += ["| attnkit / CTranslate2 | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for ours, theirs in pairs:
        key = f"attnkit_{ours}_over_ctranslate2_{theirs}"
        if any(key + "/" + label in ratios for label in labels):  # joined, not formatted: a key, not text shown
            lines.append(f"| {ours} / {theirs} | " + " | ".join(
                f"{number(ratios.get(key + '/' + label), 2)}x" for label in labels) + " |")
    return "\n".join(lines) + "\n"


def block_train_throughput(results: dict) -> str:
    """attnkit against Hugging Face Marian on the Multi30k batches, at fp32 and (where the CPU has it) bf16: one
    table per machine (train_throughput.json, then train_throughput_<machine>.json for each other machine)."""
    names = per_machine(results, "train_throughput")
    if not names:
        return absent("train_throughput")
    return "\n".join(_train_throughput(results[n], n) for n in names)


def _kernels(r: dict) -> str:
    """What a training bench run set apart from the machine's defaults: ``--avx2-kernels`` (every library's AVX2
    code, as a CPU without AVX-512 runs, whatever flags this CPU has) or ``ATTNKIT_MKL=vendor`` (MKL's own choice of
    kernels); "" for neither."""
    command = str(r.get("command", ""))
    if "--avx2-kernels" in command:
        return ", AVX2 kernels only"
    return ", MKL's own choice of kernels" if "ATTNKIT_MKL=vendor" in command else ""


def _train_throughput(r: dict, name: str) -> str:
    m = r.get("metrics", {})
    flags = get(r, "machine", "cpu_flags", default=[])
    lines = [f"**{machine(r)}{_kernels(r)}.** " + _ran(r, name, f"{number(r.get('steps'), 0)} timed steps each in "
                  f"{number(r.get('rounds'), 0)} alternating rounds; CPU flags: {', '.join(flags) or NOT_RECORDED}")
             + ".", "",
             "| system | target tokens/s | model GFLOP/s | of the fp32 matmul peak | validation loss after the same "
             "steps |", "|---|---|---|---|---|"]
    for name, v in r.get("systems", {}).items():
        peak = v.get("fraction_of_matmul_peak")
        lines.append(f"| {text(name)} | {number(v.get('tokens_per_s'), 0)} | {number(v.get('model_gflop_per_s'), 1)} "
                     f"| {number(100 * peak, 1) + '%' if peak is not None else NOT_RECORDED} "
                     f"| {number(v.get('valid_loss_after_steps'), 4)} |")
    bf16 = m.get("bf16_speedup_vs_fp32")
    lines += ["", f"fp32 matmul peak {number(m.get('matmul_peak_gflop_per_s'), 1)} GFLOP/s; the model's own matmul "
              f"shapes alone reach {number(m.get('model_shape_matmul_gflop_per_s'), 1)} GFLOP/s; attnkit / Hugging "
              f"Face {number(m.get('speedup_vs_huggingface'))}x"
              + (f"; attnkit bf16 / fp32 {number(bf16)}x" if bf16 is not None else "") + "."]
    recipe = m.get("recipe_precision")
    if recipe is not None:
        lines += ["", f"`{text(r.get('config'))}` trains at {text(recipe)} on this machine (`train.precision = "
                  f"\"{text(m.get('recipe_precision_setting'))}\"`): "
                  f"{number(100 * m['recipe_fraction_of_matmul_peak'], 1)}% of the fp32 matmul peak."]
    return "\n".join(lines) + "\n"


def block_finetune_speed(results: dict) -> str:
    """attnkit against Hugging Face's Trainer (training), its pipeline and onnxruntime (classifying SST-2 dev)."""
    r = results.get("finetune_speed")
    if r is None:
        return absent("finetune_speed")
    t, i = r.get("training", {}), r.get("inference", {})
    lines = [_ran(r, "finetune_speed", f"every system alike; CPU flags: "
                  f"{', '.join(r.get('cpu_flags') or [])}") + ".", "",
             "| training (same batches, AdamW, schedule) | examples/s |", "|---|---|"]
    for name, v in get(t, "systems", default={}).items():
        lines.append(f"| {text(name)} | {number(v.get('examples_per_s'), 1)} |")
    lines += ["", f"| classifying the {number(i.get('sentences'), 0)} dev sentences, batches of "
              f"{number(i.get('batch_size'), 0)} | sentences/s |", "|---|---|"]
    for name, v in get(i, "systems", default={}).items():
        lines.append(f"| {text(name)} | {number(v.get('sentences_per_s'), 1)} |")
    ratios, targets = r.get("ratios", {}), get(r, "metrics", "targets", default={})
    lines += ["", "| ratio | measured | target |", "|---|---|---|"]
    for key, label in (("train_speedup_vs_huggingface", "attnkit / Hugging Face Trainer, training"),
                       ("inference_speedup_vs_pipeline", "attnkit / pipeline, classifying"),
                       ("inference_speedup_vs_onnxruntime", "attnkit / onnxruntime, classifying")):
        lines.append(f"| {label} | {number(ratios.get(key))}x | at least {number(targets.get(key), 1)}x |")
    for key, value in i.items():  # the lower precisions (--precision), beside the fp32 headline
        if key.endswith("_over_pipeline") and key != "attnkit_over_pipeline":
            name = key.removesuffix("_over_pipeline").replace("_", " ")
            lines.append(f"| {name} / pipeline (fp32), classifying | {number(value)}x | none: fp32 is held to it |")
    return "\n".join(lines) + "\n"


def block_first_translation(results: dict) -> str:
    """How long `attnkit translate` of one sentence takes, start to exit: eager, compiled cold and warm; one table
    per machine (first_translation.json, then first_translation_<machine>.json for each other machine)."""
    names = per_machine(results, "first_translation")
    if not names:
        return absent("first_translation")
    return "\n".join(_first_translation(results[n], n) for n in names)


def _first_translation(r: dict, name: str) -> str:
    lines = [f"**{machine(r)}.** " + _ran(r, name, f"checkpoint `{text(_local(r.get('checkpoint')))}`") + ".", "",
             "| seconds to the first translation | `--no-compile` | `--compile`, cold cache | "
             "`--compile`, warm cache | "
             "warm / cold | same translation |", "|---|---|---|---|---|---|"]
    for search, m in r.get("metrics", {}).items():
        lines.append(f"| {text(search)} | {number(m.get('eager'), 1)} | {number(m.get('compiled_cold'), 1)} | "
                     f"{number(m.get('compiled_warm'), 1)} | {number(m.get('warm_over_cold'))} | "
                     f"{number(m.get('same_translation'))} |")
    return "\n".join(lines) + "\n"


def block_serving(results: dict) -> str:
    """``attnkit serve`` under load (batching against one request at a time and offline decoding) and soaked in
    faults, each machine's results file in turn."""
    lines = []
    if not per_machine(results, "serve_load"):
        lines += [absent("serve_load"), ""]
    for name in per_machine(results, "serve_load"):
        r = results[name]
        m, s = r.get("metrics", {}), r.get("setup", {})
        tput, lat = m.get("throughput_sentences_per_s", {}), get(m, "latency_ms", "concurrent", default={})
        compiled = {True: "compiled decoding in the server and offline", False: "eager decoding in the server "
                    "and offline"}.get(s.get("compiled"), "eager decoding (compilation not recorded)")
        lines += [_ran(r, name, f"{number(s.get('threads'), 0)} torch thread, {compiled}; checkpoint "
                       f"`{text(s.get('checkpoint'))}`") + f": {number(s.get('clients'), 0)} clients with one "
                  f"Multi30k sentence each got {number(tput.get('concurrent'), 1)} sentences/s, "
                  f"{number(get(m, 'ratios', 'over_sequential'), 1)}x the {number(tput.get('sequential'), 1)}/s of "
                  f"the same requests sent one at a time (target {number(get(m, 'targets', 'over_sequential'), 1)}x) "
                  f"and {number(get(m, 'ratios', 'of_offline'))} of offline decoding on the same thread "
                  f"({number(tput.get('offline'), 1)}/s; target {number(get(m, 'targets', 'of_offline'))}; the load "
                  f"generator shares the cores); outputs identical to offline: "
                  f"{number(get(m, 'met', 'identical_outputs'))}. Latency p50/p95/p99 {number(lat.get('p50'), 0)}/"
                  f"{number(lat.get('p95'), 0)}/{number(lat.get('p99'), 0)} ms; the server's resident memory grew "
                  f"{number(get(m, 'server_rss_mib', 'growth'), 1)} MiB under the load.", ""]
    if not per_machine(results, "serve_soak"):
        lines.append(absent("serve_soak"))
    for name in per_machine(results, "serve_soak"):
        r = results[name]
        m, s = r.get("metrics", {}), r.get("setup", {})
        rss, met = m.get("server_rss_mib", {}), m.get("met", {})
        server = _sub(r"/\S*/(runs/)", r"\1", s.get("server") or "")  # this machine's absolute paths, relative
        lines.append(
            _ran(r, name, f"server `{text(server)}`") + ": "
            f"{number(s.get('clients'), 0)} clients for {number(s.get('duration_s'), 0)} s, "
            f"{number(m.get('answers'), 0)} answers ({number(m.get('answers_200'), 0)} of them 200, "
            f"{number(get(m, 'queue_full', 'total'), 0)} answered 429 while the queue was full, "
            f"{number(get(m, 'queue_full', 'by_kind', 'burst'), 0)} of those the bursts' own). "
            f"5xx answers: {number(get(m, 'status_5xx', 'seen_by_clients'), 0)}; tracebacks in the server's log: "
            f"{number(m.get('server_tracebacks_logged'), 0)}; every kind served: "
            f"{number(met.get('every_kind_served'))}; repeated requests answered as the first time: "
            f"{number(met.get('answers_stable'))}; every slot released after the load: "
            f"{number(met.get('slots_released'))}. Resident memory {number(rss.get('started'), 0)} MiB at the "
            f"start, at most {number(rss.get('max'), 0)}, {number(rss.get('growth_second_half'), 1)} MiB of growth "
            f"over the second half (bound {number(rss.get('bound_second_half'), 0)}).")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _times(value, digits: int = 2) -> str:
    """"1.22x"; "not recorded" for a missing ratio."""
    return NOT_RECORDED if value is None else f"{number(value, digits)}x"


def _percent(fraction, digits: int = 1) -> str:
    return NOT_RECORDED if fraction is None else f"{number(100 * fraction, digits)}%"


def block_side_by_side(results: dict) -> str:
    """The headline comparisons: the attention op, training and translation against other systems."""
    rows = ["| comparison | measured | target |", "|---|---|---|"]
    sources = []
    a = results.get("attention_op")
    if a is None:
        rows.append(f"| attention op | {absent('attention_op').strip()} | |")
    else:
        m = a.get("metrics", {})
        speed, ceiling = m.get("speedup_vs_torch_mha_causal_n1024", {}), get(m, "ceiling", default={})
        attnkit, naive = get(a, "systems", "attnkit", "fwd/causal/n=4096", "op_mb"), get(
            a, "systems", "naive", "fwd/causal/n=4096", "op_mb")
        rows.append(
            f"| attention op, n = 1024 causal: `torch.nn.MultiheadAttention` time / attnkit's | "
            f"{_times(speed.get('fwd'))} forward, {_times(speed.get('fwd_bwd'))} forward+backward; the most any "
            f"implementation could reach at the rate BLAS reaches on the attention's own products: "
            f"{_times(get(ceiling, 'fwd', 'ceiling_vs_torch_mha_at_attention_products_rate'))} and "
            f"{_times(get(ceiling, 'fwd_bwd', 'ceiling_vs_torch_mha_at_attention_products_rate'))} | "
            f"{_times(get(m, 'targets', 'speedup_vs_torch_mha_causal_n1024'), 1)} |")
        rows.append(
            f"| attention op, n = 4096 causal forward: naive softmax(QK^T)V memory / attnkit's | "
            f"**{_times(get(m, 'naive_memory_over_attnkit_causal_n4096', 'fwd'), 1)}** less "
            f"({number(attnkit, 1)} MB against {number(naive, 1)} MB) | "
            f"{_times(get(m, 'targets', 'naive_memory_over_attnkit_n4096'), 1)} |")
        sources.append(_ran(a, "attention_op"))
    trained = per_machine(results, "train_throughput")
    if not trained:
        rows.append(f"| training | {absent('train_throughput').strip()} | |")
    for name in trained:  # every machine's run: the fraction of peak moves with the machine more than anything
        t = results[name]
        m, s = t.get("metrics", {}), t.get("systems", {})
        rows.append(
            f"| training, Multi30k batches, {machine(t)}{_kernels(t)} ({date(t)}): attnkit / Hugging Face Marian "
            f"tokens/s | "
            f"**{_times(m.get('speedup_vs_huggingface'))}** ({number(get(s, 'attnkit', 'tokens_per_s'), 0)} against "
            f"{number(get(s, 'huggingface_marian', 'tokens_per_s'), 0)}); "
            f"{_percent(get(s, 'attnkit', 'fraction_of_matmul_peak'))} of the "
            f"{number(m.get('matmul_peak_gflop_per_s'), 1)} GFLOP/s matmul peak (Hugging Face "
            f"{_percent(get(s, 'huggingface_marian', 'fraction_of_matmul_peak'))}) | "
            f"{_times(get(m, 'targets', 'speedup_vs_huggingface'), 1)}; "
            f"{_percent(get(m, 'targets', 'fraction_of_matmul_peak'), 0)} |")
        sources.append(_ran(t, name))
    r = results.get("translate_throughput")
    if r is None:
        rows.append(f"| translation | {absent('translate_throughput').strip()} | |")
    else:
        m, s = r.get("metrics", {}), r.get("systems", {})

        def cells(key: str, theirs: str, batch: str) -> str:
            eager, compiled = m.get(f"attnkit_over_{key}", {}), m.get(f"attnkit_compiled_over_{key}", {})
            ours = [(search, number(get(s, "attnkit_compiled", f"{search}/{batch}", "tokens_per_s"), 0),
                     number(get(s, theirs, f"{search}/{batch}", "tokens_per_s"), 0)) for search in ("greedy", "beam5")]
            return (f"eager {_times(eager.get('greedy'))} greedy, {_times(eager.get('beam5'))} beam 5; compiled (the "
                    f"default) {_times(compiled.get('greedy'))} greedy ({ours[0][1]} against {ours[0][2]} tokens/s), "
                    f"{_times(compiled.get('beam5'))} beam 5 ({ours[1][1]} against {ours[1][2]})")

        rows.append(f"| translation, batch 64: attnkit / CTranslate2 fp32 | "
                    f"{cells('ctranslate2_fp32_batch64', 'ctranslate2_fp32', 'batch64')} | "
                    f"{_times(get(m, 'targets', 'attnkit_over_ctranslate2_fp32_batch64'), 0)} |")
        rows.append(f"| translation, batch 1: attnkit / Hugging Face `generate` | "
                    f"{cells('huggingface_batch1', 'huggingface', 'batch1')} | "
                    f"{_times(get(m, 'targets', 'attnkit_over_huggingface_batch1'), 0)} |")
        sources.append(_ran(r, "translate_throughput"))
    for name in per_machine(results, "decode_precision"):  # each machine's decoding cells: the lowest per precision
        d = results[name]
        lowest: dict[str, float] = {}
        for key, value in d.get("ratios", {}).items():
            pair = key.split("/", 1)[0]
            if "_over_ctranslate2_" in pair and isinstance(value, (int, float)):
                lowest[pair] = min(value, lowest.get(pair, value))
        if not lowest:
            continue
        measured = "; ".join(f"{text(pair.replace('_over_', ' / ').replace('_', ' '))} {_times(value)}"
                             for pair, value in lowest.items())
        rows.append(f"| translation, {machine(d)} ({date(d)}): attnkit / CTranslate2 at each precision, the lowest of "
                    f"the four cells (batch 1 and 64, greedy and beam 5) | {measured} | "
                    f"{_times(get(d, 'metrics', 'targets', 'over_ctranslate2'), 0)} |")
        sources.append(_ran(d, name))
    return "\n".join(rows) + ("\n\nRun: " + "; ".join(sources) + ".\n" if sources else "\n")


# the recipe trained in fp32 and in bf16, one core each, one pair a machine: (the fp32 run's results, the bf16 run's)
RECIPE_PRECISIONS = [("multi30k_en_de_1core_fp32_epyc", "multi30k_en_de_1core_bf16_epyc"),
                     ("multi30k_en_de_1core_fp32_zen5", "multi30k_en_de_1core_bf16_zen5")]


def block_train_precision_recipe(results: dict) -> str:
    """The Multi30k recipe trained in fp32 and in bf16, one core each, for its 60 training minutes, on each machine
    that has both runs: throughput, epochs, validation after the same steps, test BLEU."""
    pairs = [dict(zip(("fp32", "bf16"), names)) for names in RECIPE_PRECISIONS if all(n in results for n in names)]
    if not pairs:
        return absent(" and ".join(n for names in RECIPE_PRECISIONS for n in names))
    lines: list[str] = []
    for names in pairs:
        runs = {p: results[name] for p, name in names.items()}
        shared = set.intersection(*({v["step"] for v in r.get("validation", [])} for r in runs.values()))
        step = max(shared, default=None)
        lines += [f"**{machine(runs['fp32'])}.**", ""] + [f"- {p}: {_ran(r, names[p])}" for p, r in runs.items()]
        lines += ["", "| training precision | target tokens/s | steps | epochs | training minutes | valid loss at "
                      f"step {number(step, 0)} | valid BLEU there | test BLEU (sacreBLEU) | test BLEU (the paper's) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p, r in runs.items():
            at = next((v for v in r.get("validation", []) if v["step"] == step), {})
            lines.append(f"| {p} | {number(r.get('tokens_per_s'), 0)} | {number(r.get('steps'), 0)} | {epochs(r)} | "
                         f"{minutes(r)} | {number(at.get('valid_loss'), 4)} | {number(at.get('valid_bleu'))} | "
                         f"{number(get(r, 'metrics', 'bleu'))} | {number(get(r, 'metrics', 'paper_bleu'))} |")
        fp32, bf16 = runs["fp32"], runs["bf16"]
        speed = bf16["tokens_per_s"] / fp32["tokens_per_s"] if fp32.get("tokens_per_s") else None
        lines += ["", f"bf16 / fp32 target tokens/s: {_times(speed)}.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def block_train_mkl_kernels(results: dict) -> str:
    """The training bench on one machine with MKL's AVX-512 kernels (attnkit.mkl, the default) and with MKL's own
    choice (``ATTNKIT_MKL=vendor``, train_throughput_<machine>_mkl_vendor.json): each system's speed with each."""
    pairs = [(n.removesuffix("_mkl_vendor"), n) for n in results
             if n.startswith("train_throughput_") and n.endswith("_mkl_vendor")
             and n.removesuffix("_mkl_vendor") in results]
    if not pairs:
        return absent("train_throughput_<machine>_mkl_vendor")
    lines: list[str] = []
    for features_name, vendor_name in pairs:
        features, vendor = results[features_name], results[vendor_name]
        lines += [f"**{machine(features)}.** MKL's kernels: {text(features.get('mkl_kernels'))} "
                  f"({link(features_name, '../bench/results/')}), against {text(vendor.get('mkl_kernels'))} "
                  f"with `ATTNKIT_MKL=vendor` ({link(vendor_name, '../bench/results/')}):", "",
                  "| system | target tokens/s, MKL's own choice | with its AVX-512 kernels | speed-up | of the fp32 "
                  "matmul peak, MKL's own choice | with its AVX-512 kernels |", "|---|---|---|---|---|---|"]
        for system, v in features.get("systems", {}).items():
            w = get(vendor, "systems", system, default={})
            speed = v["tokens_per_s"] / w["tokens_per_s"] if w.get("tokens_per_s") and v.get("tokens_per_s") else None
            lines.append(f"| {text(system)} | {number(w.get('tokens_per_s'), 0)} | {number(v.get('tokens_per_s'), 0)} "
                         f"| {_times(speed)} | {_percent(w.get('fraction_of_matmul_peak'))} | "
                         f"{_percent(v.get('fraction_of_matmul_peak'))} |")
        peaks = [get(r, "metrics", "matmul_peak_gflop_per_s") for r in (vendor, features)]
        lines += ["", "fp32 matmul peak, each run's own: " + " and ".join(f"{number(p, 1)} GFLOP/s" for p in peaks)
                  + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


TRANSLATE_SYSTEMS = {"attnkit": "attnkit `--no-compile`", "attnkit_compiled": "attnkit, compiled (the default)",
                     "huggingface": "Hugging Face `generate`", "ctranslate2_fp32": "CTranslate2 fp32",
                     "ctranslate2_int8": "CTranslate2 int8"}
TRANSLATE_CHECKS = {"attnkit_batched_greedy_equals_unbatched": "attnkit's batched greedy equals its unbatched greedy",
                    "huggingface_greedy_equals_attnkit": "Hugging Face's greedy equals attnkit's",
                    "ctranslate2_fp32_greedy_equals_attnkit": "CTranslate2 fp32's greedy equals attnkit's",
                    "attnkit_compiled_greedy_equals_attnkit": "attnkit's compiled greedy equals its eager greedy"}


def block_translate_throughput(results: dict) -> str:
    """Translation tokens/s of every system at each search and batch size, and their outputs checked."""
    r = results.get("translate_throughput")
    if r is None:
        return absent("translate_throughput")
    systems = r.get("systems", {})
    cells = list(next(iter(systems.values()), {}))
    extra = (f"checkpoint `{text(_local(r.get('checkpoint')))}`, the first {number(r.get('sentences'), 0)} "
             "Multi30k test sentences")
    lines = [_ran(r, "translate_throughput", extra) + ", tokens/s:", "",
             "| system | " + " | ".join(f"{c.replace('beam5', 'beam 5').replace('/batch', ', batch ')}" for c in cells)
             + " | test BLEU, greedy / beam 5 (batch 64) |", "|---|" + "---|" * (len(cells) + 1)]
    for name, v in systems.items():
        bleu = " / ".join(number(get(v, f"{s}/batch64", "bleu")) for s in ("greedy", "beam5"))
        lines.append(f"| {TRANSLATE_SYSTEMS.get(name, text(name))} | "
                     + " | ".join(number(get(v, c, "tokens_per_s"), 1) for c in cells) + f" | {bleu} |")
    checks = get(r, "metrics", "checks", default={})
    total = checks.get("sentences")
    said = [f"{TRANSLATE_CHECKS.get(k, k.replace('_', ' '))} on {number(v, 0)} of {number(total, 0)}"
            for k, v in checks.items() if k != "sentences"]
    lines += ["", "Outputs checked: " + ("; ".join(said) if said else NOT_RECORDED) + " sentences."]
    return "\n".join(lines) + "\n"


COMPILE_STEPS = {"eager": "eager", "compiled_python_wrapper": "`torch.compile`, Python wrapper",
                 "compiled_cpp_wrapper": "`torch.compile`, C++ wrapper", "ahead_of_time": "ahead of time (AOTInductor)"}


def block_compile_step(results: dict) -> str:
    """Greedy decoding at batch 1 through each kind of decoding step."""
    r = results.get("compile_step")
    if r is None:
        return absent("compile_step")
    m = r.get("metrics", {})
    extra = (f"{text(m.get('search'))}, batch {number(m.get('batch_size'), 0)}, checkpoint "
             f"`{text(_local(r.get('checkpoint')))}`")
    lines = [_ran(r, "compile_step", extra) + ":", "",
             "| decoding step | tokens/s | over eager | build and warm-up | outputs equal to eager decoding's |",
             "|---|---|---|---|---|"]
    for name, v in r.get("systems", {}).items():
        lines.append(f"| {COMPILE_STEPS.get(name, text(name))} | {number(v.get('tokens_per_s'), 1)} | "
                     f"{_times(get(m, 'speed_over_eager', name))} | "
                     f"{number(v.get('compile_and_warmup_seconds'), 1)} s | "
                     f"{number(v.get('same_as_eager'), 0)} of {number(m.get('sentences'), 0)} |")
    return "\n".join(lines) + "\n"


def block_attention_op(results: dict) -> str:
    """The attention op against torch.nn.MultiheadAttention, and what bounds the ratio."""
    r = results.get("attention_op")
    if r is None:
        return absent("attention_op")
    m, shape = r.get("metrics", {}), r.get("shape", {})
    c = m.get("ceiling", {})
    lengths = shape.get("lengths") or []
    extra = (f"batch {number(shape.get('batch'), 0)}, {number(shape.get('heads'), 0)} heads, d_head "
             f"{number(shape.get('d_head'), 0)}, n from {min(lengths) if lengths else NOT_RECORDED} to "
             f"{max(lengths) if lengths else NOT_RECORDED}")
    speed = m.get("speedup_vs_torch_mha_causal_n1024", {})

    def row(label: str, fwd: str, fwd_bwd: str) -> str:
        return f"| {label} | {fwd} | {fwd_bwd} |"

    lines = [_ran(r, "attention_op", extra) + ".", "", "| n = 1024, causal | forward | forward+backward |",
             "|---|---|---|",
             row("`torch.nn.MultiheadAttention` time / attnkit's", _times(speed.get("fwd")),
                 _times(speed.get("fwd_bwd"))),
             row("the four projections alone", f"{number(get(c, 'fwd', 'projections_ms'), 1)} ms",
                 f"{number(get(c, 'fwd_bwd', 'projections_ms'), 1)} ms"),
             row(f"the most any implementation could reach at the square-matmul peak "
                 f"({number(c.get('matmul_peak_gflop_per_s'), 1)} GFLOP/s), softmax and masking free",
                 _times(get(c, "fwd", "ceiling_vs_torch_mha")), _times(get(c, "fwd_bwd", "ceiling_vs_torch_mha"))),
             row(f"the same at the rate BLAS reaches on the attention's own products as whole batched matmuls "
                 f"({number(c.get('attention_products_gflop_per_s'), 1)} GFLOP/s)",
                 _times(get(c, "fwd", "ceiling_vs_torch_mha_at_attention_products_rate")),
                 _times(get(c, "fwd_bwd", "ceiling_vs_torch_mha_at_attention_products_rate"))),
             row("attnkit's attention on the causal triangle, GFLOP/s",
                 number(get(c, "fwd", "attnkit_attention_gflop_per_s"), 1),
                 number(get(c, "fwd_bwd", "attnkit_attention_gflop_per_s"), 1))]
    ours, rate = get(c, "fwd", "attnkit_attention_gflop_per_s"), c.get("attention_products_gflop_per_s")
    lines += ["", f"Target: {_times(get(m, 'targets', 'speedup_vs_torch_mha_causal_n1024'), 1)} faster than "
              f"`torch.nn.MultiheadAttention`. attnkit's forward attention runs at "
              f"{_percent(ours / rate, 0) if ours is not None and rate else NOT_RECORDED} of the rate BLAS reaches "
              "on those products, with the full matrix never built."]
    naive, attnkit = (get(r, "systems", s, "fwd/causal/n=4096", "op_mb") for s in ("naive", "attnkit"))
    lines.append(f"At n = 4096, causal, forward, a naive softmax(QK^T)V takes {number(naive, 1)} MB against attnkit's "
                 f"{number(attnkit, 1)} MB: {_times(get(m, 'naive_memory_over_attnkit_causal_n4096', 'fwd'), 1)} "
                 f"(target {_times(get(m, 'targets', 'naive_memory_over_attnkit_n4096'), 1)}).")
    return "\n".join(lines) + "\n"


def block_threads(results: dict) -> str:
    """The README's sentence on the thread default, from the demo trained with one of the cores busy."""
    r = results.get("threads_demo")
    if r is None:
        return absent("threads_demo")
    m = r.get("metrics", {})
    return (f"with {number(r.get('busy_processes'), 0)} of "
            f"{number(get(r, 'machine', 'cpus'), 0)} cores busy, the demo trained {number(m.get('speedup'), 1)}x "
            f"faster than torch's default ({link('threads_demo', 'bench/results/')}).\n")


# NAME in the markers -> the file that holds the block and how it is written
BLOCKS = {
    "translation": ("docs/results.md", block_translation),
    "by-length-tatoeba": ("docs/results.md", lambda r: block_by_length(r, "bleu_by_length_tatoeba")),
    "by-length-multi30k": ("docs/results.md", lambda r: block_by_length(r, "bleu_by_length_multi30k")),
    "captioning": ("docs/results.md", block_captioning),
    "language-models": ("docs/results.md", block_language_models),
    "transfer": ("docs/results.md", block_transfer),
    "fine-tuning": ("docs/results.md", block_fine_tuning),
    "sst2-pretraining": ("docs/results.md", block_sst2_pretraining),
    "vqa": ("docs/results.md", block_vqa),
    "speech": ("docs/results.md", block_speech),
    "speech-multi30k": ("docs/results.md", block_speech_multi30k),
    "speech-decoding": ("docs/results.md", block_speech_decoding),
    "complexity": ("docs/results.md", block_complexity),
    "sources": ("docs/results.md", block_sources),
    "readme": ("README.md", block_readme),
    "threads": ("README.md", block_threads),
    "decode-precision": ("docs/performance.md", block_decode_precision),
    "finetune-speed": ("docs/performance.md", block_finetune_speed),
    "train-throughput": ("docs/performance.md", block_train_throughput),
    "first-translation": ("docs/performance.md", block_first_translation),
    "serving": ("docs/performance.md", block_serving),
    "side-by-side": ("docs/performance.md", block_side_by_side),
    "train-precision-recipe": ("docs/performance.md", block_train_precision_recipe),
    "train-mkl-kernels": ("docs/performance.md", block_train_mkl_kernels),
    "translate-throughput": ("docs/performance.md", block_translate_throughput),
    "compile-step": ("docs/performance.md", block_compile_step),
    "attention-op": ("docs/performance.md", block_attention_op),
}


def render(text: str, path: str, results: dict, sources: dict | None = None) -> str:
    """``text`` (the file at ``path``) with each of its generated blocks written anew from ``results``; ``sources``,
    where given, gets each block's [offset, shown, format spec, source] list under its name (:func:`_written`)."""
    global _dirty
    names = OPENING.findall(text)
    unknown = sorted(set(names) - {n for n, (p, _) in BLOCKS.items() if p == path})
    missing = sorted({n for n, (p, _) in BLOCKS.items() if p == path} - set(names))
    if unknown or missing or len(names) != len(set(names)) or len(BLOCK.findall(text)) != len(names):
        raise SystemExit(f"{path}: generated-block markers wrong: unknown {unknown}, missing {missing}, "
                         "or one is repeated or unclosed")
    _dirty = {n for n, r in results.items() if dirty(r)} if path in DIRTY_NOTED else set()

    def block(m: re.Match) -> str:
        body, found = _written(BLOCKS[m.group("name")][1], results)
        if DIRTY_MARK in body:
            body += "\n" + DIRTY_NOTE + "\n"
        if sources is not None:
            sources[m.group("name")] = found
        return m.group(1) + body + m.group(4)

    try:
        return BLOCK.sub(block, text)
    finally:
        _dirty = set()


def sources_json(sources: dict[str, dict[str, list]]) -> str:
    """docs/results_sources.json's text: for each page and block, one line per value shown,
    [offset in the block, as shown, format spec, {"file": JSON, "key": [path], "ops": [...]} or a computation]."""
    lines = ["{", f' "about": {json.dumps(SOURCES_ABOUT)},']
    for i, (path, blocks) in enumerate(sorted(sources.items())):
        lines.append(f" {json.dumps(path)}: {{")
        for j, (name, found) in enumerate(blocks.items()):
            comma = "," if j < len(blocks) - 1 else ""
            if not found:
                lines.append(f"  {json.dumps(name)}: []{comma}")
                continue
            lines.append(f"  {json.dumps(name)}: [")
            lines += [f"   {json.dumps(entry, ensure_ascii=False)}" + ("," if k < len(found) - 1 else "")
                      for k, entry in enumerate(found)]
            lines.append(f"  ]{comma}")
        lines.append(" }" + ("," if i < len(sources) - 1 else ""))
    return "\n".join(lines + ["}"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if the docs are stale")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    args = parser.parse_args(argv)
    results = load_all(args.root / "bench" / "results")
    written, sources = {}, {}
    for path in sorted({p for p, _ in BLOCKS.values()}):
        old = (args.root / path).read_text(encoding="utf-8")
        sources[path] = {}
        written[path] = (old, render(old, path, results, sources[path]))
    file = args.root / SOURCES
    written[str(SOURCES)] = (file.read_text(encoding="utf-8") if file.is_file() else "", sources_json(sources))
    stale = []
    for path, (old, new) in written.items():
        if new == old:
            continue
        stale.append(path)
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"{path} (now)",
                                                       f"{path} (from bench/results/*.json)"))
        else:
            (args.root / path).write_text(new, encoding="utf-8")
            print(f"bench/results.py: wrote {path}" if path == str(SOURCES) else
                  f"bench/results.py: rewrote the generated blocks of {path}")
    if args.check and stale:
        print(f"bench/results.py --check: {', '.join(stale)} disagree with bench/results/*.json; run `make results`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
