"""Reading parallel text: aligned plain or gzipped files, Multi30k, Tatoeba.

Every reader validates as it goes and names the file and line of the first problem:
files of different lengths, bytes that are not UTF-8, a side that is empty.
"""

from __future__ import annotations

import gzip
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from attnkit.errors import AttnkitError, describe_os_error


@dataclass
class Parallel:
    src: list[str]
    tgt: list[str]
    origin: str = ""


def resolve_data_dir(option: str | None = None) -> Path:
    """The data directory: an explicit option, then $ATTNKIT_DATA, then ../shared/data."""
    for candidate in (option, os.environ.get("ATTNKIT_DATA")):
        if candidate:
            return Path(candidate)
    for base in (Path.cwd(), Path(__file__).resolve().parents[3]):
        shared = base.parent / "shared" / "data"
        if shared.is_dir():
            return shared
    raise AttnkitError("no data directory: pass --data-dir or set ATTNKIT_DATA")


def read_text(path: Path) -> str:
    """A user's UTF-8 text file, whole; a missing, unreadable or non-UTF-8 file is one line naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AttnkitError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise AttnkitError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise AttnkitError(f"{path}: cannot read ({e.strerror or e})") from None


def read_lines(path: str | Path) -> list[str]:
    """Lines of a plain or .gz UTF-8 file, without their newline."""
    path = Path(path)
    if not path.exists():
        raise AttnkitError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise AttnkitError(f"{path}: a broken or truncated gzip file ({e})") from None
    except OSError as e:
        raise AttnkitError(describe_os_error(e, str(path))) from None
    return _decode_lines(raw, str(path))


def _decode_lines(raw: bytes, name: str) -> list[str]:
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise AttnkitError(f"{name}:{i}: invalid UTF-8 at byte {e.start}") from None
    return out


def check_pairs(src: list[str], tgt: list[str], src_name: str, tgt_name: str) -> None:
    for i, (s, t) in enumerate(zip(src, tgt), 1):
        if not s.strip():
            raise AttnkitError(f"{src_name}:{i}: empty source sentence")
        if not t.strip():
            raise AttnkitError(f"{tgt_name}:{i}: empty target sentence")


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> Parallel:
    """Two line-aligned files (plain or .gz)."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise AttnkitError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: files are not aligned")
    check_pairs(src, tgt, str(src_path), str(tgt_path))
    return Parallel(src, tgt, f"{src_path} | {tgt_path}")


def multi30k_paths(data_dir: str | Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    raw = Path(data_dir) / "multi30k" / "task1" / "raw"
    return raw / f"{split}.{src_lang}.gz", raw / f"{split}.{tgt_lang}.gz"


def read_multi30k(data_dir: str | Path, split: str, src_lang: str = "en", tgt_lang: str = "de") -> Parallel:
    """Multi30k task 1: ``multi30k/task1/raw/{split}.{lang}.gz`` (train, val, test_2016_flickr)."""
    return read_parallel(*multi30k_paths(data_dir, split, src_lang, tgt_lang))


def read_tatoeba(path: str | Path, reverse: bool = False) -> Parallel:
    """Tatoeba/manythings pairs ``English<TAB>Other[<TAB>attribution]`` from a .txt or the .zip export.

    ``reverse`` makes the second column the source.
    """
    path = Path(path)
    if not path.exists():
        raise AttnkitError(f"{path}: file not found")
    try:
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.endswith(".txt") and not Path(n).name.startswith("_")]
                if len(names) != 1:
                    raise AttnkitError(f"{path}: expected one pairs .txt inside, found {names}")
                raw, name = z.read(names[0]), f"{path}:{names[0]}"
        else:
            raw, name = path.read_bytes(), str(path)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        raise AttnkitError(f"{path}: a broken zip file ({e})") from None
    except OSError as e:
        raise AttnkitError(describe_os_error(e, str(path))) from None
    src, tgt = [], []
    for i, line in enumerate(_decode_lines(raw, name), 1):
        cols = line.split("\t")
        if len(cols) < 2:
            raise AttnkitError(f"{name}:{i}: expected two tab-separated columns")
        a, b = (cols[1], cols[0]) if reverse else (cols[0], cols[1])
        src.append(a)
        tgt.append(b)
    check_pairs(src, tgt, name, name)
    return Parallel(src, tgt, name)


def write_lines(path: str | Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
