"""attnkit: train, decode, evaluate and show attention-based sequence models.

Subcommands: train, translate, evaluate, classify, align, plot-by-length, caption, answer, generate, embed, average,
export, import-marian, compile, demo, serve, bench. Every user error (bad config key, misaligned files, broken
checkpoint) ends as one line on stderr and exit status 2, checked before any work where it can be (option ranges,
by the options' argparse types; output paths); OS and file-format errors (a missing file, a directory, a full
disk, a broken gzip) become such lines in one place (main, attnkit.errors.describe). Anything else is a bug in
attnkit: one line saying so and exit status 1, the traceback with ATTNKIT_DEBUG=1. Nothing is replaced unless
asked: `train` into a run directory with checkpoints needs --resume or --overwrite, `average` never writes over an
input or a non-empty directory without --overwrite. Decoding refuses a source longer than [decode]
max_source_tokens.
Every subcommand takes --threads N; without it torch runs on the
cores no other process keeps busy (attnkit.threads). `attnkit translate` streams: each line read from a pipe or
a terminal is translated and written (flushed) before the next is waited for; `attnkit classify` likewise, a
chunk of inputs at a time.

The commands are faces over the Python API (:func:`attnkit.load`): each group lives in a module of this package
(train, decode, export, serve, data, bench); this one builds the parser and starts the process.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attnkit import __version__
from attnkit.cli.common import ArgumentParser, OptionError, at_least
from attnkit.errors import AttnkitError

# The command groups import torch, so they are imported when the parser is built, not with this module: main asks
# for MKL's kernels (attnkit.mkl) first, which only a process that has not loaded torch yet can
# what this package offers from its groups, for ``from attnkit.cli import cmd_translate``
_FROM_GROUPS = {"StreamLines": "attnkit.data.inputs",
                **{f"cmd_{name}": "attnkit.cli.decode" for name in (
                    "align", "caption", "classify", "compile", "embed", "evaluate", "generate", "transcribe",
                    "translate")},
                **{f"cmd_{name}": "attnkit.cli.export" for name in ("average", "export", "import_marian",
                                                                     "shortlist")},
                "cmd_bench": "attnkit.cli.bench", "cmd_plot_by_length": "attnkit.cli.bench",
                "cmd_data_fetch": "attnkit.cli.data", "cmd_serve": "attnkit.cli.serve",
                "cmd_train": "attnkit.cli.train", "cmd_demo": "attnkit.cli.train"}


def __getattr__(name: str):
    if name in _FROM_GROUPS:
        import importlib

        return getattr(importlib.import_module(_FROM_GROUPS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="attnkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE",
                        help="a Python file (or module) that registers model families or input kinds "
                             "(attnkit.register_family; docs/extending.md); repeatable, also ATTNKIT_PLUGINS")
    sub = parser.add_subparsers(dest="command", required=True)
    from attnkit.cli import answer, bench, data, decode, export, serve, train

    for add in (train.add_train, decode.add_translate, decode.add_transcribe, decode.add_evaluate,
                decode.add_classify, decode.add_align, bench.add_plot_by_length, decode.add_caption,
                answer.add_answer, decode.add_generate, decode.add_embed, export.add_shortlist, export.add_average,
                export.add_export, export.add_import_marian, decode.add_compile, serve.add_serve, train.add_demo,
                data.add_data, bench.add_bench):
        add(sub)
    return _add_threads_option(parser)


def _add_threads_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every subcommand (every parser without subcommands of its own) a --threads option, unless it
    has one already (bench complexity: its own default of 1)."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        if not any("--threads" in a.option_strings for a in parser._actions):
            parser.add_argument("--threads", type=at_least(1), default=None, metavar="N",
                                help="CPU threads for torch (default: the cores no other process keeps busy, "
                                     "or OMP_NUM_THREADS; see attnkit.threads)")
        return parser
    seen: set[int] = set()
    for action in subcommands:
        for sub in action.choices.values():
            if id(sub) not in seen:  # aliases share a parser
                seen.add(id(sub))
                _add_threads_option(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; ``argv`` None: this process's own, which first starts again under jemalloc where the system
    has it (attnkit.allocator), before torch is imported."""
    if argv is None:
        from attnkit.allocator import AllocatorError, relaunch_under_jemalloc
        from attnkit.mkl import MklChoiceError, choice, use_feature_kernels

        try:
            relaunch_under_jemalloc()
            choice(os.environ)
            use_feature_kernels()  # before torch is imported (attnkit.mkl)
        except (AllocatorError, MklChoiceError) as e:
            print(f"attnkit: error: {e}", file=sys.stderr)
            return 2
    try:
        args = build_parser().parse_args(argv)
    except OptionError as e:  # an option's value out of its range: one line, as every user error
        return _report(e)
    from attnkit.fast.memory import keep_freed_memory

    keep_freed_memory()
    try:
        _load_plugins(args.plugin)
        if getattr(args, "needs_torch", True):
            from attnkit.threads import configure

            configure(getattr(args, "threads", None))  # before any work: see attnkit.threads for the default
        code = args.func(args)
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the one place errors become lines: AttnkitError, OS and file-format errors, bugs
        return _report(e)
    # a rank of a distributed run (the process's own command line) ends as attnkit.train.distributed.end_process
    # says why; the module is only consulted where the command imported it
    distributed = sys.modules.get("attnkit.train.distributed")
    if argv is None and distributed is not None and distributed.joined():
        distributed.end_process(code)
    return code


def _load_plugins(files: list[str]) -> None:
    """Register what ``--plugin`` and ``ATTNKIT_PLUGINS`` name, the option's files kept in the environment so that
    the processes a command starts (torchrun's ranks) register them too."""
    from attnkit import registry

    for file in files:
        if not file.endswith(".py"):
            continue
        if not Path(file).is_file():
            raise AttnkitError(f"--plugin {file}: no such file")
    if files:
        named = [str(Path(f).resolve()) if f.endswith(".py") else f for f in files]
        known = [x for x in os.environ.get(registry.PLUGINS, "").split(os.pathsep) if x]
        os.environ[registry.PLUGINS] = os.pathsep.join(dict.fromkeys(known + named))
    registry.load_plugins()


def _report(e: Exception) -> int:
    """Print one line for ``e`` and return the exit status: 2 for the user's or the machine's errors (bad input,
    a missing file, a full disk, a broken gzip), 1 for a bug in attnkit, whose traceback is printed only with
    ATTNKIT_DEBUG=1."""
    from attnkit.errors import REPORT_BUGS, describe

    line = describe(e)
    if line is not None:
        if os.environ.get("ATTNKIT_DEBUG"):
            import traceback

            traceback.print_exception(e, file=sys.stderr)
        print(f"attnkit: error: {line.replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    if os.environ.get("ATTNKIT_DEBUG"):
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    detail = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    print(f"attnkit: internal error (a bug in attnkit, please report it to {REPORT_BUGS}): {detail}",
          file=sys.stderr)
    return 1


__all__ = ["build_parser", "main", *_FROM_GROUPS]
