"""What the command line reads from its user: lines of a file or of stdin, the latter in chunks as they arrive
(:class:`StreamLines`), a list of image files, and the inputs of a classifier (:class:`ClassifierInput`): plain
lines, tab-separated pairs, GLUE files, and TSV, CSV or JSONL files with a header row.

Every problem stops the reading with one line naming the file (or stdin) and line, and for a classifier's input
the checkpoint it does not suit; the messages name the command line's options (``--text-column``, ``--format``)
where one of them would fix the input.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnkit import registry
from attnkit.data.corpus import read_lines
from attnkit.data.labelled import (
    Labelled,
    first_fields,
    glue_task_of,
    read_glue_file,
    read_labelled,
    table_format,
)
from attnkit.errors import AttnkitError

if TYPE_CHECKING:
    from attnkit.config import DataConfig

CLASSIFY_FORMATS = ("lines", "tsv", "glue")


class StreamLines:
    """The lines of a file descriptor (default stdin) in chunks: each chunk is what has arrived by then.

    Iterating waits for one whole line (or the end), then takes every further line that can be read without
    waiting (``select`` on the descriptor), up to about ``max_tokens`` source tokens (whitespace words + 1 per
    line, a stand-in for the tokenizer's count). Typed or piped one at a time, a line is a chunk of its own; a
    piped file comes in chunks of about a batch. Lines must be UTF-8: anything else is an AttnkitError naming
    the line."""

    def __init__(self, fd: int | None = None, max_tokens: int = 4000, name: str = "stdin"):
        if fd is None:
            try:
                fd = sys.stdin.fileno()
            except (AttributeError, OSError, ValueError):
                raise AttnkitError(f"{name}: no standard input to read (give --input FILE)") from None
        self.fd = fd
        self.max_tokens, self.name = max_tokens, name
        self.buffer, self.eof, self.line_number = b"", False, 0

    def _ready(self) -> bool:
        try:
            return bool(select.select([self.fd], [], [], 0)[0])
        except (OSError, ValueError):  # a descriptor select cannot wait on: read only when a line is needed
            return False

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 1 << 16)
        except OSError as e:
            raise AttnkitError(f"{self.name}: cannot read ({e.strerror})") from None
        if data:
            self.buffer += data
        else:
            self.eof = True

    def _decode(self, raw: bytes) -> str:
        self.line_number += 1
        try:
            return raw.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError as e:
            raise AttnkitError(f"{self.name}: line {self.line_number} is not UTF-8 (byte 0x{raw[e.start]:02x} at "
                               f"byte {e.start + 1} of the line)") from None

    def __iter__(self):
        while True:
            chunk, tokens = [], 0
            while tokens < self.max_tokens:
                end = self.buffer.find(b"\n")
                if end >= 0:
                    line = self._decode(self.buffer[:end])
                    self.buffer = self.buffer[end + 1:]
                    chunk.append(line)
                    tokens += len(line.split()) + 1
                elif self.eof:
                    if self.buffer:  # a last line without its newline
                        chunk.append(self._decode(self.buffer))
                        self.buffer = b""
                    break
                elif chunk and not self._ready():
                    break
                else:
                    self._read()
            if not chunk:
                return
            yield chunk


def is_stdin(path: str | None) -> bool:
    """Whether an ``--input`` option names standard input: not given, or ``-``."""
    return not path or path == "-"


def read_input(path: str | None) -> list[str]:
    """The lines of the file ``path`` (plain or .gz), or with None or ``-`` all of stdin."""
    if not is_stdin(path):
        return read_lines(path)
    return [line for chunk in StreamLines() for line in chunk]


def image_list(path: str, image_dir: str | None = None) -> list[str]:
    """The image files a ``--list`` file names, one a line (blank lines skipped), each found in ``image_dir``
    (default: the list's own directory) unless absolute; a missing one is an error naming its line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise AttnkitError(f"--list {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise AttnkitError(f"--list {path}: not UTF-8 text") from None
    base = Path(image_dir) if image_dir else Path(path).parent
    images = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        image = base / line.strip()
        if not image.is_file():
            raise AttnkitError(f"--list {path}, line {n}: {image}: no such image file")
        images.append(str(image))
    if not images:
        raise AttnkitError(f"--list {path}: names no image")
    return images


@dataclass
class ClassifierInput:
    """Reads the inputs of one classifier: ``data`` is its config's data section (the columns it was trained on),
    ``takes_pairs`` whether it reads sentence pairs, ``regression`` whether it predicts a score (a file's labels
    are then numbers), ``checkpoint`` where it came from (named when an input does not suit it)."""

    data: DataConfig
    takes_pairs: bool
    regression: bool
    checkpoint: Path

    def rows(self, lines: list[str], first: int, name: str, fmt: str) -> tuple[list[str], list[str] | None]:
        """Plain input lines -> (texts, pairs or None). ``tsv``: one sentence, or two separated by a tab (a pair);
        ``lines``: the whole line is one sentence. An empty line, an empty sentence, a pair for a model of single
        sentences or a single sentence for a model of pairs is an error naming the line (``first``: the number of
        ``lines[0]`` in ``name``)."""
        texts, pairs = [], []
        for i, line in enumerate(lines, first):
            if i == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                raise AttnkitError(f"{name}:{i}: an empty line, where a sentence to classify is expected")
            fields = [line] if fmt == "lines" else line.split("\t")
            if len(fields) > 2:
                raise AttnkitError(f"{name}:{i}: {len(fields)} tab-separated fields; expected one sentence, or two "
                                   "(a pair)")
            if len(fields) == 2 and not self.takes_pairs:
                raise AttnkitError(f"{name}:{i}: a sentence pair (two tab-separated sentences) given to a model of "
                                   f"single sentences ({self.checkpoint})")
            if len(fields) == 1 and self.takes_pairs:
                how = " (--format tsv)" if fmt == "lines" else ""
                raise AttnkitError(f"{name}:{i}: one sentence given to a model of sentence pairs ({self.checkpoint}); "
                                   f"give two per line, separated by a tab{how}")
            for k, text in enumerate(fields, 1):
                if not text.strip():
                    raise AttnkitError(f"{name}:{i}: an empty {'first' if k == 1 else 'second'} sentence "
                                       f"(field {k})")
            texts.append(fields[0])
            if len(fields) == 2:
                pairs.append(fields[1])
        return texts, (pairs if self.takes_pairs else None)

    def table(self, path: Path, labelled: bool, fmt: str | None = None, text_column: str | None = None,
              pair_column: str | None = None, label_column: str | None = None) -> Labelled | None:
        """A file with named columns as :class:`Labelled`, or None when it is none (plain lines or tab-separated
        pairs).

        The columns: ``text_column`` (and ``pair_column``, ``label_column``) when given; else a GLUE file's
        (``fmt`` "glue", or a .tsv file whose header is GLUE's for the checkpoint's task); else the columns the
        checkpoint was trained on (``data.text_column`` ...) when a .tsv file's header has them, or it is CSV or
        JSONL. ``labelled``: read the labels too (a file without them is an error)."""
        data = self.data
        own_files = bool(registry.data_format(data.format).needs)  # trained on your own files, with their columns
        label = None
        if labelled:
            label = label_column or (data.label_column if own_files else "label")
        if text_column is not None:
            table = "tsv" if fmt == "tsv" else table_format(path)
            if table is None:
                also = "" if labelled else " (or pass --format tsv)"
                raise AttnkitError(f"{path}: --text-column reads a file with a header row, TSV, CSV or JSONL by its "
                                   f"name: name it .tsv, .csv or .jsonl{also}")
            return read_labelled(path, text_column, pair_column, label, format=table, regression=self.regression)
        if pair_column is not None:
            raise AttnkitError("--pair-column: give --text-column too (the first sentence's column)")
        table = table_format(path)
        fields = first_fields(path, table or "tsv") if table != "jsonl" else []
        glue = fmt == "glue" or (fmt is None and table == "tsv")
        task = glue_task_of(fields, data.format, self.takes_pairs) if glue else None
        if task is not None:
            return read_glue_file(path, task, fields, labelled)
        if fmt == "glue":
            raise AttnkitError(f"{path}:1: not a GLUE file for this model: its first line has the fields "
                               f"{', '.join(map(repr, fields)) or 'none'}; GLUE's headers name SST-2's sentence, "
                               "MRPC's #1 String and #2 String, STS-B's sentence1 and sentence2")
        own = own_files and data.text_column in fields and (
            not data.text_pair_column or data.text_pair_column in fields)
        if own_files and table is not None and (own or table != "tsv" or labelled) and fmt is None:
            return read_labelled(path, data.text_column, data.text_pair_column or None, label, format=table,
                                 regression=self.regression)
        if labelled or table in ("csv", "jsonl"):
            header = f" (its first line: {', '.join(fields)})" if fields else ""
            raise AttnkitError(f"{path}: which columns{header}? give --text-column (and --pair-column for pairs"
                               f"{', --label-column' if labelled else ''})")
        return None

    def check_pairs(self, data: Labelled) -> None:
        """Pairs for a model of pairs, single sentences for a model of single sentences (one line naming the
        file)."""
        if (data.pairs is not None) != self.takes_pairs:
            what = ("sentence pairs given to a model of single sentences" if data.pairs is not None
                    else "single sentences given to a model of sentence pairs (give --pair-column)")
            raise AttnkitError(f"{data.origin}:{data.lines[0] if data.lines else 1}: {what} ({self.checkpoint})")

    def labelled(self, path: Path, text_column: str | None = None, pair_column: str | None = None,
                 label_column: str | None = None) -> Labelled:
        """A labelled file to score the classifier on (see :meth:`table`), its rows checked against the model."""
        if not path.exists():
            raise AttnkitError(f"--data {path}: file not found")
        data = self.table(path, True, None, text_column, pair_column, label_column)
        self.check_pairs(data)
        return data

    def chunks(self, path: str | None, fmt: str | None, size: int, text_column: str | None = None,
               pair_column: str | None = None) -> Iterable[tuple[list[str], list[str] | None]]:
        """The inputs to classify in chunks of at most ``size``: (texts, pairs or None) each. A file is read and
        checked whole before the first chunk (so a bad row never leaves half an output); stdin (``path`` None or
        ``-``) is read as it arrives (:class:`StreamLines`), each chunk checked when it comes."""
        if fmt == "lines" and (text_column or pair_column):
            raise AttnkitError(f"--{'text' if text_column else 'pair'}-column: names a column of a file with a "
                               "header row, which --format lines is not")
        if not is_stdin(path):
            file = Path(path)
            if not file.exists():
                raise AttnkitError(f"{file}: file not found")
            data = None if fmt == "lines" else self.table(file, False, fmt, text_column, pair_column)
            if data is not None:
                self.check_pairs(data)
                texts, pairs = data.texts, data.pairs
            else:
                texts, pairs = self.rows(read_input(path), 1, path, fmt or "tsv")
            return [(texts[i:i + size], None if pairs is None else pairs[i:i + size])
                    for i in range(0, len(texts), size)]
        if text_column is not None or fmt == "glue":
            raise AttnkitError(f"{'--text-column' if text_column else '--format glue'}: reads a file with a "
                               "header row; give --input FILE")
        return self._stream(fmt, size)

    def _stream(self, fmt: str | None, size: int) -> Iterator[tuple[list[str], list[str] | None]]:
        done = 0
        for chunk in StreamLines(max_tokens=4000):
            for i in range(0, len(chunk), size):
                part = chunk[i:i + size]
                yield self.rows(part, done + 1, "stdin", fmt or "tsv")
                done += len(part)


__all__ = ["CLASSIFY_FORMATS", "ClassifierInput", "StreamLines", "image_list", "is_stdin", "read_input"]
