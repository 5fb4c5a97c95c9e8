"""Reading labelled sentences and sentence pairs: GLUE's SST-2, MRPC and STS-B, and a user's own CSV, TSV or JSONL.

Every reader validates as it goes and stops at the first problem with one line naming the file, the line and the
column: a missing column, an empty text, a non-numeric score, a label the training file never had, an empty
file, a header without a named column. Nothing is silently dropped. Files may be gzipped (``.gz``) and may start
with a UTF-8 byte order mark.

TSV is read as GLUE writes it: fields split at tabs, quote characters kept as they are (GLUE's texts contain
unbalanced quotes). CSV is read with the csv module's quoting (strict: a quote that never closes is an error).
JSONL is one JSON object per line.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from attnkit.data.corpus import resolve_data_dir
from attnkit.errors import AttnkitError, describe_os_error


@dataclass
class Labelled:
    """Sentences (``texts``), their second sentences for pair tasks (``pairs``) and their labels.

    ``labels`` are strings for classification, floats for regression, None for an unlabelled file (GLUE's test
    splits, which carry an ``index`` instead). ``label_names`` is the sorted label set for classification.
    ``lines`` is the file line each row starts on; ``label_column`` the column its labels came from.
    """

    texts: list[str]
    pairs: list[str] | None = None
    labels: list[str] | list[float] | None = None
    origin: str = ""
    label_names: list[str] | None = None
    index: list[str] | None = None
    lines: list[int] = field(default_factory=list)
    label_column: str | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def first(self, n: int) -> Labelled:
        """The first ``n`` rows (all of them for 0), the label set kept: a slice is read as its whole file is."""
        if not n or n >= len(self.texts):
            return self

        def cut(rows):
            return None if rows is None else rows[:n]

        return replace(self, texts=self.texts[:n], pairs=cut(self.pairs), labels=cut(self.labels),
                       index=cut(self.index), lines=self.lines[:n])


# --- reading bytes, decoding, splitting into rows


def _read_bytes(path: Path) -> bytes:
    """The file's bytes: plain or .gz, a leading UTF-8 byte order mark removed."""
    if not path.exists():
        raise AttnkitError(f"{path}: file not found")
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise AttnkitError(f"{path}: a broken or truncated gzip file ({e})") from None
    except OSError as e:
        raise AttnkitError(describe_os_error(e, str(path))) from None
    return raw[len(codecs.BOM_UTF8):] if raw.startswith(codecs.BOM_UTF8) else raw


def _decode(line: bytes, i: int, name: str) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AttnkitError(f"{name}:{i}: invalid UTF-8 at byte {e.start}") from None


def _lines(raw: bytes, name: str) -> Iterator[tuple[int, str]]:
    """Numbered lines without their newline, each decoded only when reached (the first problem wins)."""
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    for i, line in enumerate(lines, 1):
        yield i, _decode(line, i, name).removesuffix("\r")


def _tsv_rows(raw: bytes, name: str) -> Iterator[tuple[int, list[str]]]:
    for i, line in _lines(raw, name):
        yield i, ([] if line == "" else line.split("\t"))


def _csv_rows(raw: bytes, name: str) -> Iterator[tuple[int, list[str]]]:
    """Records and the line each starts on; a quoted field may span lines (the csv module's line ends)."""
    pieces = (_decode(piece, i, name) for i, piece in enumerate(raw.splitlines(keepends=True), 1))
    reader = csv.reader(pieces, strict=True)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise AttnkitError(f"{name}:{start}: a row the csv module cannot read ({e})") from None
        yield start, row
        start = reader.line_num + 1


# --- checking one row


def _show(values: Sequence[str]) -> str:
    return ", ".join(repr(v) for v in values)


@dataclass
class _Spec:
    text: str
    text_pair: str | None = None
    label: str | None = None
    index: str | None = None
    regression: bool = False
    score_range: tuple[float, float] | None = None  # a regression label outside it is an error
    range_name: str = ""

    def columns(self) -> list[str]:
        return [c for c in (self.text, self.text_pair, self.label, self.index) if c is not None]


class _Builder:
    """Collects checked rows into a :class:`Labelled`."""

    def __init__(self, name: str, spec: _Spec):
        self.name, self.spec = name, spec
        self.texts: list[str] = []
        self.pairs: list[str] = []
        self.labels: list = []
        self.index: list[str] = []
        self.lines: list[int] = []

    def _text(self, line: int, column: str, value) -> str:
        if not isinstance(value, str):
            raise AttnkitError(f"{self.name}:{line}: a text that is {_json_kind(value)}, not a string "
                               f"(column {column})")
        if not value.strip():
            raise AttnkitError(f"{self.name}:{line}: empty text (column {column})")
        return value

    def _label(self, line: int, column: str, value):
        spec = self.spec
        if value is None:
            raise AttnkitError(f"{self.name}:{line}: no label (null) (column {column})")
        if isinstance(value, (list, dict)):
            raise AttnkitError(f"{self.name}:{line}: a label that is {_json_kind(value)} (column {column})")
        if spec.regression:
            if isinstance(value, bool):
                raise AttnkitError(f"{self.name}:{line}: score {json.dumps(value)} is not a number (column {column})")
            if isinstance(value, str):
                if not value.strip():
                    raise AttnkitError(f"{self.name}:{line}: empty score (column {column})")
                try:
                    score = float(value)
                except ValueError:
                    raise AttnkitError(f"{self.name}:{line}: score {value!r} is not a number "
                                       f"(column {column})") from None
            else:
                score = float(value)
            if not math.isfinite(score):
                raise AttnkitError(f"{self.name}:{line}: score {value!r} is not a finite number (column {column})")
            if spec.score_range is not None and not spec.score_range[0] <= score <= spec.score_range[1]:
                lo, hi = spec.score_range
                raise AttnkitError(f"{self.name}:{line}: score {value!r} is outside {spec.range_name}'s "
                                   f"{lo:g} to {hi:g} (column {column})")
            return score
        label = json.dumps(value) if isinstance(value, bool) else str(value).strip()
        if not label:
            raise AttnkitError(f"{self.name}:{line}: empty label (column {column})")
        return label

    def add(self, line: int, values: dict) -> None:
        spec = self.spec
        self.texts.append(self._text(line, spec.text, values[spec.text]))
        if spec.text_pair is not None:
            self.pairs.append(self._text(line, spec.text_pair, values[spec.text_pair]))
        if spec.label is not None:
            self.labels.append(self._label(line, spec.label, values[spec.label]))
        if spec.index is not None:
            value = values[spec.index]
            if isinstance(value, (list, dict)) or value is None or (isinstance(value, str) and not value.strip()):
                raise AttnkitError(f"{self.name}:{line}: empty or invalid index (column {spec.index})")
            self.index.append(str(value).strip())
        self.lines.append(line)

    def result(self, header_line: int | None) -> Labelled:
        spec = self.spec
        if not self.texts:
            where = f"{self.name}:{header_line}: a header and no rows" if header_line else f"{self.name}: no rows"
            raise AttnkitError(where)
        labels = self.labels if spec.label is not None else None
        names = None if labels is None or spec.regression else _sorted_labels(set(labels))
        return Labelled(texts=self.texts, pairs=self.pairs if spec.text_pair is not None else None, labels=labels,
                        origin=self.name, label_names=names, index=self.index if spec.index is not None else None,
                        lines=self.lines, label_column=spec.label)


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return {list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _sorted_labels(labels: set[str]) -> list[str]:
    """Sorted label names: numerically when every one is an integer ("2" before "10"), else as strings."""
    if all(re.fullmatch(r"[+-]?\d+", label) for label in labels):
        return sorted(labels, key=lambda s: (int(s), s))
    return sorted(labels)


# --- tables (CSV, TSV) and JSON lines


def _read_table(name: str, rows: Iterator[tuple[int, list[str]]], spec: _Spec,
                header: list[str] | None = None, widths: set[int] | None = None) -> Labelled:
    """Rows of fields under a header (the first row, or ``header`` for a file without one).

    ``widths``: the field counts a row may have (the header's width when None)."""
    header_line = None
    if header is None:
        first = next(rows, None)
        if first is None:
            raise AttnkitError(f"{name}: empty file (no header, no rows)")
        header_line, cells = first
        header = [c.strip() for c in cells]
        for column in spec.columns():
            if column not in header:
                raise AttnkitError(f"{name}:{header_line}: the header has no column {column!r}; its columns are "
                                   f"{_show(header)} (column {column})")
            if header.count(column) > 1:
                raise AttnkitError(f"{name}:{header_line}: the header has column {column!r} twice (column {column})")
    widths = widths or {len(header)}
    positions = {column: header.index(column) for column in spec.columns()}
    out = _Builder(name, spec)
    for line, fields in rows:
        n = len(fields)
        if n == 0:
            raise AttnkitError(f"{name}:{line}: an empty line where a row is expected (column {header[0]})")
        if n not in widths:
            if n > max(widths):
                raise AttnkitError(f"{name}:{line}: {n} columns where the header has {max(widths)}: an extra value "
                                   f"{fields[max(widths)]!r} (column {max(widths) + 1}, after {header[-1]!r})")
            raise AttnkitError(f"{name}:{line}: missing column: the row has {n} of the header's {len(header)} "
                               f"columns (column {header[n]})")
        out.add(line, {column: fields[i] for column, i in positions.items()})
    return out.result(header_line)


def _read_jsonl(name: str, data: bytes, spec: _Spec) -> Labelled:
    out = _Builder(name, spec)
    for line, raw in _lines(data, name):
        if not raw.strip():
            raise AttnkitError(f"{name}:{line}: an empty line where a JSON object is expected "
                               f"(column {spec.text})")
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise AttnkitError(f"{name}:{line}: not valid JSON ({e.msg} at character {e.colno})") from None
        if not isinstance(obj, dict):
            raise AttnkitError(f"{name}:{line}: {_json_kind(obj)} where a JSON object is expected")
        for column in spec.columns():
            if column not in obj:
                raise AttnkitError(f"{name}:{line}: missing column; the object has {_show(list(obj))} "
                                   f"(column {column})")
        out.add(line, obj)
    return out.result(None)


_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def _format_of(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    fmt = _FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise AttnkitError(f"{path}: cannot tell the format from the file name; name it .csv, .tsv or .jsonl, "
                           f"or pass format='csv', 'tsv' or 'jsonl'")
    return fmt


def _read(path: str | Path, spec: _Spec, fmt: str | None = None, header: list[str] | None = None,
          widths: set[int] | None = None) -> Labelled:
    path = Path(path)
    fmt = _format_of(path) if fmt is None else fmt.lower()
    if fmt not in ("csv", "tsv", "jsonl"):
        raise AttnkitError(f"{path}: unknown format {fmt!r}; the formats are 'csv', 'tsv', 'jsonl'")
    raw, name = _read_bytes(path), str(path)
    if fmt == "jsonl":
        return _read_jsonl(name, raw, spec)
    rows = _csv_rows(raw, name) if fmt == "csv" else _tsv_rows(raw, name)
    return _read_table(name, rows, spec, header, widths)


def read_labelled(path: str | Path, text: str = "text", text_pair: str | None = None, label: str | None = None,
                  format: str | None = None, *, regression: bool = False, index: str | None = None) -> Labelled:
    """A user's own labelled file: CSV or TSV with a header row, or JSONL (one object per line).

    ``text``, ``text_pair``, ``label`` and ``index`` name the columns (keys in JSONL) to read; ``label=None``
    reads an unlabelled file. ``format`` is 'csv', 'tsv' or 'jsonl' (from the extension, before any .gz, when
    None). ``regression=True`` reads labels as float scores (a non-numeric one is an error); otherwise labels
    are strings and ``label_names`` their sorted set."""
    spec = _Spec(text=text, text_pair=text_pair, label=label, index=index, regression=regression)
    return _read(path, spec, format)


def label_set(train: Labelled) -> list[str]:
    """The sorted label names of a training file, the set every other split's labels must come from."""
    if train.labels is None:
        raise AttnkitError(f"{train.origin}: an unlabelled file has no label set")
    if any(isinstance(label, float) for label in train.labels):
        raise AttnkitError(f"{train.origin}: regression scores have no label set")
    return _sorted_labels(set(train.labels))


def check_labels(dev: Labelled, names: Sequence[str], origin: str = "the training file") -> None:
    """Every label of ``dev`` must be one of ``names`` (the labels of ``origin``, usually the training file)."""
    if dev.labels is None:
        return
    known = set(names)
    for i, label in enumerate(dev.labels):
        if label not in known:
            line = dev.lines[i] if i < len(dev.lines) else i + 1
            raise AttnkitError(f"{dev.origin}:{line}: label {label!r} is not among the labels of {origin} "
                               f"({', '.join(names)}) (column {dev.label_column or 'label'})")


# --- GLUE


@dataclass(frozen=True)
class _Glue:
    """A GLUE task's files: its folder, columns and labels. ``sts_layout``: its dev and test splits may also come
    in the STS benchmark's own layout (no header, 7 or 9 fields, the score 5th)."""

    name: str
    folder: str
    text: str
    text_pair: str | None
    label: str
    regression: bool = False
    labels: tuple[str, ...] = ()
    sts_layout: bool = False


_GLUE = {g.name: g for g in (
    _Glue("sst2", "SST-2", "sentence", None, "label", labels=("0", "1")),
    _Glue("mrpc", "MRPC", "#1 String", "#2 String", "Quality", labels=("0", "1")),
    _Glue("stsb", "STS-B", "sentence1", "sentence2", "score", regression=True, sts_layout=True),
)}
GLUE_TASKS = tuple(_GLUE)
GLUE_SPLITS = ("train", "dev", "test")

# the STS benchmark's own format (sts-{dev,test}.tsv): no header; 22 dev lines carry two source columns more
_STS_COLUMNS = ["genre", "filename", "year", "old_index", "score", "sentence1", "sentence2", "source1", "source2"]


def _glue_dir(data_dir: str | Path | None) -> Path:
    base = resolve_data_dir(None if data_dir is None else str(data_dir))
    return base / "glue" if (base / "glue").is_dir() else base


def read_glue(task: str, split: str, data_dir: str | Path | None = None) -> Labelled:
    """A GLUE split as the GLUE data puts it under ``glue/``: ``task`` is sst2, mrpc or stsb (any case, with or
    without a hyphen), ``split`` train, dev or test. ``data_dir`` holds ``glue/`` (or is it); None resolves it
    as the other readers do. The test splits are unlabelled and carry GLUE's index column. STS-B's dev (and test)
    may be in the STS benchmark's own format (``sts-dev.tsv``), read when GLUE's ``dev.tsv`` is not there."""
    key = re.sub(r"[-_ ]", "", task.lower())
    if key not in _GLUE:
        raise AttnkitError(f"unknown GLUE task {task!r}; the tasks read here are {', '.join(GLUE_TASKS)}")
    if split not in GLUE_SPLITS:
        raise AttnkitError(f"unknown GLUE split {split!r}; the splits are {', '.join(GLUE_SPLITS)}")
    glue = _GLUE[key]
    folder = _glue_dir(data_dir) / glue.folder
    label = None if split == "test" else glue.label
    spec = _Spec(text=glue.text, text_pair=glue.text_pair, label=label, index="index" if split == "test" else None,
                 regression=glue.regression, score_range=(0.0, 5.0) if glue.regression else None,
                 range_name=glue.folder)
    path = folder / f"{split}.tsv"
    if glue.sts_layout and split != "train" and not path.exists() and (folder / f"sts-{split}.tsv").exists():
        # the original format is labelled in both dev and test, and has no index column
        original = _Spec(text="sentence1", text_pair="sentence2", label="score", regression=True,
                         score_range=(0.0, 5.0), range_name=glue.folder)
        return _read(folder / f"sts-{split}.tsv", original, "tsv", header=_STS_COLUMNS, widths={7, 9})
    if not path.exists():
        there = sorted(p.name for p in folder.glob("*.tsv")) if folder.is_dir() else []
        have = f"; {folder} has {', '.join(there)}" if there else ""
        raise AttnkitError(f"{path}: file not found (GLUE {glue.folder} {split}){have}")
    data = _read(path, spec, "tsv")
    if glue.labels and data.labels is not None:
        check_labels(data, list(glue.labels), f"GLUE {glue.folder}")
        data.label_names = list(glue.labels)
    return data


# --- files of any of these layouts, recognised by their first line


def first_fields(path: Path, fmt: str) -> list[str]:
    """The fields of a TSV or CSV file's first line (gzip and a byte order mark allowed; [] for an empty file)."""
    first = _read_bytes(path).split(b"\n", 1)[0].decode("utf-8", errors="replace").removesuffix("\r")
    if not first:
        return []
    return [f.strip() for f in (next(csv.reader([first])) if fmt == "csv" else first.split("\t"))]


def table_format(path: Path) -> str | None:
    """csv, tsv or jsonl from the file name (before any .gz), None for anything else."""
    suffixes = [x.lower() for x in path.suffixes if x.lower() != ".gz"]
    return {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(
        suffixes[-1] if suffixes else "")


def glue_task_of(fields: list[str], own: str, pairs: bool) -> str | None:
    """The GLUE task (sst2, mrpc, stsb) whose file layout a first line ``fields`` is, for a model trained on
    ``own`` (a data format) that reads pairs or not: its own task when it is a GLUE one, else one whose text columns
    the header names (a pair task for a model of pairs). STS-B also comes in the STS benchmark's own layout: no
    header, 7 or 9 fields, the score 5th."""
    tasks = [own] if own in _GLUE else [t for t, g in _GLUE.items() if (g.text_pair is not None) == pairs]
    for task in tasks:
        g = _GLUE[task]
        if g.text in fields and (g.text_pair is None or g.text_pair in fields) and (
                g.label in fields or "index" in fields):
            return task
    for task in tasks:
        if _GLUE[task].sts_layout and len(fields) in (7, 9):
            try:
                float(fields[4])
                return task
            except ValueError:
                pass
    return None


def read_glue_file(path: Path, task: str, fields: list[str], labelled: bool):
    """A GLUE file of ``task`` (any split: a test file's index column is read, its missing labels are None)."""
    g = _GLUE[task]
    score_range = (0.0, 5.0) if g.regression else None
    if g.sts_layout and g.text not in fields:  # the STS benchmark's own layout: labelled, no header
        spec = _Spec(text="sentence1", text_pair="sentence2", label="score", regression=True,
                     score_range=score_range, range_name=g.folder)
        return _read(path, spec, "tsv", header=_STS_COLUMNS, widths={7, 9})
    has_label = g.label in fields
    if labelled and not has_label:
        raise AttnkitError(f"{path}:1: no {g.label!r} column: an unlabelled GLUE {g.folder} file (a test split) "
                           "has nothing to score against")
    spec = _Spec(text=g.text, text_pair=g.text_pair, label=g.label if labelled else None,
                 index="index" if not has_label and "index" in fields else None, regression=g.regression,
                 score_range=score_range, range_name=g.folder)
    return _read(path, spec, "tsv")
