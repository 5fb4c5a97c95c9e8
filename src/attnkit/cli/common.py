"""What the commands share: the parser whose refused option values are one line, the argparse types that check an
option's range once for every command that has it, the decoding options, and the checks made before any work
(an output that cannot be written, a source line too long)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from attnkit.errors import AttnkitError


class OptionError(AttnkitError):
    """An option's value its argparse type refused: one line naming the option and the value, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a value an option's type refuses (out of range, not a number) ends, as every
    other user error does, in argparse's own one line (``argument --beam: expected ...``) and exit status 2, without
    the usage text; other usage errors (a missing or unknown option) print the usage as argparse does."""

    def error(self, message: str):
        refused = sys.exc_info()[1]
        if isinstance(refused, argparse.ArgumentError) and isinstance(refused.__context__,
                                                                      argparse.ArgumentTypeError):
            raise OptionError(message) from None
        super().error(message)


# --- argparse types: each range written once, its refusal naming the value (argparse names the option)

def at_least(low: int, most: int | None = None):
    """The argparse type of an integer option of at least ``low`` (and at most ``most``)."""
    span = f"from {low} to {most}" if most is not None else f"of at least {low}"

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {text!r}")
        return value

    integer.__name__ = f"integer {span}"
    return integer


def _real(text: str, ok, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """The argparse type of a finite number (no nan, no inf)."""
    return _real(text, math.isfinite, "a finite number")


def finite_nonnegative(text: str) -> float:
    """The argparse type of a finite number of at least 0 (a wait, a temperature)."""
    return _real(text, lambda v: 0 <= v < math.inf, "a finite number of at least 0")


def positive_float(text: str) -> float:
    """The argparse type of a finite number above 0 (a timeout in seconds)."""
    return _real(text, lambda v: 0 < v < math.inf, "a finite number above 0")


def probability_mass(text: str) -> float:
    """The argparse type of a probability mass above 0 and at most 1 (nucleus sampling's top-p)."""
    return _real(text, lambda v: 0 < v <= 1, "a number above 0 and at most 1")


# --- options several commands have

def add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=at_least(1), default=None,
                   help="beam size (1 = greedy; default: the checkpoint's config)")
    p.add_argument("--len-penalty", type=finite_float, default=None)
    p.add_argument("--batch-tokens", type=at_least(1), default=4000, help="source tokens per batch")
    p.add_argument("--n-best", type=at_least(1), default=1)
    add_compile_arg(p)
    add_precision_arg(p)
    p.add_argument("--shortlist", nargs="?", const=True, default=False, metavar="VMAP",
                   help="score only each batch's candidate target tokens, from a vocabulary map (CTranslate2's "
                        "vmap.txt format; default: the one attnkit shortlist wrote for the run): faster, and a "
                        "sentence's output may then depend on the sentences batched with it")


def add_compile_arg(p: argparse.ArgumentParser) -> None:
    from attnkit.fast import COMPILE_PAYS_AT

    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the decoding steps ahead of time (AOTInductor): about a minute on a model's first "
                        "run on this machine, seconds after, as the steps are kept in the user's cache "
                        "($ATTNKIT_CACHE, else ~/.cache/attnkit). Default: a Transformer translation model compiles "
                        f"for a server or a file of {COMPILE_PAYS_AT} sentences or more, which repay its start; "
                        "others, and every model with ATTNKIT_COMPILE=0, decode eagerly")


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="what decoding (or classifying) computes in: bf16 needs a CPU with AVX512_BF16 or AMX, "
                        "int8 one with VNNI or AMX (else refused in one line); default fp32")


# --- checks before any work, and writing results as they come

def check_output(path: str | Path | None, option: str = "--output", directory: bool = False) -> None:
    """That ``path`` can be written (a file, or with ``directory`` a directory), checked before any work so that
    no test set is translated for an output that cannot be kept. Nothing is created."""
    if path is None or str(path) == "-":
        return
    p = Path(path)
    if str(path) == "":
        raise AttnkitError(f"{option}: an empty path")
    if p.is_dir() and not directory:
        raise AttnkitError(f"{option} {p}: is a directory, where a file is expected")
    if directory and p.exists() and not p.is_dir():
        raise AttnkitError(f"{option} {p}: exists and is not a directory")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise AttnkitError(f"{option} {p}: permission denied")
        return
    parent = p.parent
    if directory:  # made with its parents: the nearest existing ancestor decides
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    if not parent.exists():
        raise AttnkitError(f"{option} {p}: its directory {parent} does not exist")
    if not parent.is_dir():
        raise AttnkitError(f"{option} {p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise AttnkitError(f"{option} {p}: cannot write in {parent} (permission denied)")


def check_source_lengths(model, lines: list[str], name: str, first_line: int = 1) -> None:
    """Bounded work: a line longer than the model's ``decode.max_source_tokens`` tokens (counted as the model
    counts them, :meth:`attnkit.api.Model.token_counts`) is refused with one line naming the user's file (or
    option) ``name`` and the line, before minutes of decoding; ``first_line`` is the number of ``lines[0]``."""
    limit = model.config.decode.max_source_tokens
    # a token covers at least one character (and one word marker): shorter lines need no counting
    long = [(i, line) for i, line in enumerate(lines, first_line) if len(line) >= limit]
    for (i, _), n in zip(long, model.token_counts([line for _, line in long]) if long else []):
        if n > limit:
            raise AttnkitError(f"{name}:{i}: {n} source tokens, more than decode.max_source_tokens = {limit} "
                               "(raise it with a checkpoint config edit, or split the line)")


def stream(output: str | None, chunks) -> int:
    """Write each chunk of lines to ``output`` (stdout when None) and flush it before the next chunk is made, so
    a reader at the end of a pipe sees results as they come; a reader that goes away (| head) ends it quietly."""
    try:
        out = open(output, "w", encoding="utf-8") if output else sys.stdout
    except OSError as e:
        raise AttnkitError(f"--output {output}: cannot write ({e.strerror})") from None
    try:
        for lines in chunks:
            out.write("".join(line + "\n" for line in lines))
            out.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
