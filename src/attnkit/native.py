"""A few lines of C that attnkit builds itself: compiled once with the system's C compiler, kept in attnkit's cache,
loaded with ctypes. :mod:`attnkit.mkl` builds its one-line library with it before torch is imported, and the fast
runtime's dropout its mask kernel (:mod:`attnkit.fast.dropout`). Where there is no compiler, or it fails, nothing is
built and each caller keeps its plain path.

This module imports nothing heavy: :mod:`attnkit.mkl` runs it before torch is loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def cache_root(environ: Mapping[str, str]) -> Path:
    """attnkit's cache: ``$ATTNKIT_CACHE``, else ``$XDG_CACHE_HOME/attnkit``, else ``~/.cache/attnkit``."""
    if environ.get("ATTNKIT_CACHE"):
        return Path(environ["ATTNKIT_CACHE"])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnkit"


def build(source: str, stem: str, directory: Path, flags: Sequence[str] = ("-O2",), key: str = "") -> Path | None:
    """The shared library compiled from the C ``source`` with ``flags``, built once into ``directory`` as
    ``<stem>_<digest>.so``: the digest covers the source, the flags and ``key`` (what else the machine code depends
    on, such as the CPU a ``-march=native`` build is for). None where there is no compiler or it fails. The file
    appears whole or not at all: a process that starts meanwhile builds its own copy."""
    digest = hashlib.sha256("\0".join([source, *flags, key]).encode()).hexdigest()[:16]
    path = directory / f"{stem}_{digest}.so"
    if path.is_file():
        return path
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as work:
            c_file = Path(work) / f"{stem}.c"
            c_file.write_text(source)
            built = Path(work) / path.name
            subprocess.run([compiler, *flags, "-shared", "-fPIC", "-o", str(built), str(c_file)],
                           check=True, capture_output=True, timeout=60)
            built.replace(path)
    except (OSError, subprocess.SubprocessError):
        return None
    return path
