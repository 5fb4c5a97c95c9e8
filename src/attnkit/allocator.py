"""The memory allocator attnkit's processes run on: jemalloc where the system has it, else glibc's malloc.

A decoding step allocates and frees some thirty tensors (each layer's keys, values and activations, the logits),
and a long-lived process (a server, a bench, a job that translates a large file) does so millions of times at
shapes that change as batches and lengths change. Under glibc's malloc such a process slowed as it went: in one
process that decoded the Multi30k test set at batch 1 and 64, greedily and with beam 5, attnkit's compiled fp32
beam search of one sentence at a time ran at 0.82x CTranslate2's, against 0.97-1.00x when it ran alone beside
CTranslate2, and a profile of it spent a tenth of its time in glibc's ``malloc``, ``free`` and
``malloc_consolidate`` (AMD EPYC Zen 5). Run under jemalloc, the same bench had attnkit's fp32 at 0.996-1.16x
CTranslate2 float32 across its four cells (docs/performance.md). jemalloc is kept told never to hand freed pages back
(:data:`JEMALLOC_CONF`, the Makefile's setting): its default decay made a training step slower.

A C library's allocator is chosen when a process starts (``LD_PRELOAD``), so the ``attnkit`` command line (and the
benches, which measure what it does) begin with :func:`relaunch_under_jemalloc`: where a jemalloc library is found
and the process does not run on it yet, the process starts again, the same command line, with jemalloc preloaded,
before anything heavy (torch) is imported. ``ATTNKIT_ALLOCATOR=system`` keeps the C library's own. Python code that
imports attnkit runs on the allocator its interpreter started with: ``LD_PRELOAD=libjemalloc.so.2
MALLOC_CONF=...`` gives it jemalloc, and :func:`attnkit.fast.keep_freed_memory` tunes glibc's.

This module imports nothing heavy: it runs before torch is loaded.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Mapping

from attnkit.errors import environment_choice

# never return freed pages to the system (dirty and muzzy decay off), and split a kept free extent for requests down
# to 1/1024 of its size (by default 1/64), so that bf16 training's varied requests reuse what is kept
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1,lg_extent_max_active_fit:10"
CHOICES = ("jemalloc", "system")
# set in the environment of the process started again, so that a library that cannot be preloaded (the dynamic
# loader then only warns) does not start it again and again
_RELAUNCHED = "ATTNKIT_ALLOCATOR_RELAUNCHED"


class AllocatorError(ValueError):
    """``ATTNKIT_ALLOCATOR`` names no allocator attnkit knows."""


def choice(environ: Mapping[str, str]) -> str:
    """The allocator ``ATTNKIT_ALLOCATOR`` asks for: "jemalloc" (the default) or "system"."""
    return environment_choice(environ, "ATTNKIT_ALLOCATOR", CHOICES, AllocatorError)


def find_jemalloc() -> str | None:
    """The name of the system's jemalloc library, as the dynamic loader finds it (Debian's ``libjemalloc2``:
    "libjemalloc.so.2"), or None."""
    return ctypes.util.find_library("jemalloc")


def loaded_libraries(maps: str) -> set[str]:
    """The file names of the shared libraries in ``maps`` (a ``/proc/<pid>/maps``)."""
    return {os.path.basename(line.split()[-1]) for line in maps.splitlines()
            if len(line.split()) >= 6 and ".so" in line.split()[-1]}


def running_under_jemalloc() -> bool:
    """Whether this process has a jemalloc library loaded (Linux; False where ``/proc/self/maps`` is missing)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return False
    return any(name.startswith("libjemalloc") for name in loaded_libraries(maps))


def current() -> str:
    """The allocator this process runs on: "jemalloc" or "system" (the C library's)."""
    return "jemalloc" if running_under_jemalloc() else "system"


def relaunch_environment(environ: Mapping[str, str], library: str | None, under_jemalloc: bool) -> dict | None:
    """The environment to start this process again in, with jemalloc ``library`` preloaded; None where it should
    go on as it is: jemalloc already runs it, none was found, ``ATTNKIT_ALLOCATOR=system``, the user preloads an
    allocator of their own (tcmalloc, mimalloc), or it was started again once already. ``MALLOC_CONF`` set by the
    user is kept."""
    if choice(environ) != "jemalloc" or under_jemalloc or library is None or environ.get(_RELAUNCHED) \
            or "malloc" in environ.get("LD_PRELOAD", ""):
        return None
    preload = " ".join(filter(None, (library, environ.get("LD_PRELOAD", ""))))
    return {**environ, "LD_PRELOAD": preload, "MALLOC_CONF": environ.get("MALLOC_CONF", JEMALLOC_CONF),
            _RELAUNCHED: "1"}


def command_line_allocator(environ: Mapping[str, str], library: str | None) -> str:
    """The allocator an ``attnkit`` command started with ``environ`` runs on, where the system's jemalloc library is
    ``library`` (:func:`find_jemalloc`; None: none): "jemalloc" where it is preloaded or the command starts again
    under it, else "system"."""
    if "jemalloc" in environ.get("LD_PRELOAD", ""):
        return "jemalloc"
    return "system" if relaunch_environment(environ, library, under_jemalloc=False) is None else "jemalloc"


def relaunch_under_jemalloc() -> None:
    """Start this process again under jemalloc (see the module's text) where that applies; else return. Call it
    before reading any input: the new process reads stdin from where this one was."""
    env = relaunch_environment(os.environ, find_jemalloc(), running_under_jemalloc())
    argv = getattr(sys, "orig_argv", None)  # the interpreter's own command line, options included
    if env is None or not argv or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
