"""`attnkit answer`: questions about images, answered by a visual question answering model, one line each; and
`attnkit evaluate --data` for such a model. Both call :meth:`attnkit.api.Model.answer`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnkit.cli.common import add_precision_arg, at_least, check_output, stream
from attnkit.errors import AttnkitError

ANSWER_OUTPUT = """output: one line per question, in input order: the answer, a tab, its probability with 4 decimals
(red<TAB>0.9981); with --json one JSON object a line {"image", "question", "answer", "probability",
"probabilities", "unknown_words"}. A word the model never saw is read as <unk>: it is listed in unknown_words (and
said on stderr), not an error."""


def add_answer(sub) -> None:
    p = sub.add_parser("answer", help="answer questions about images with a visual question answering model",
                       description="Answers one question about one image (IMAGE QUESTION), or every row of --input: "
                                   "a JSONL file of {\"image\": path, \"question\": text} rows, or a TSV file with a "
                                   "header row naming image and question (images relative to the file, or to "
                                   "--image-dir).",
                       epilog=ANSWER_OUTPUT)
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory of a VQA model")
    p.add_argument("pair", nargs="*", metavar="IMAGE QUESTION", help="an image file and a question about it")
    p.add_argument("--input", "-i", metavar="FILE", help="a JSONL or TSV file of image-question pairs")
    p.add_argument("--image-dir", metavar="DIR", help="--input: where its images are (default: beside the file)")
    p.add_argument("--output", "-o", metavar="FILE", help="the file to write (default: stdout)")
    p.add_argument("--json", action="store_true", help="one JSON object a line instead of answer<TAB>probability")
    p.add_argument("--show-attention", metavar="DIR",
                   help="write one figure per question: the image and each glimpse's attention over it")
    p.add_argument("--batch-size", type=at_least(1), default=64, help="questions answered together (default 64)")
    add_precision_arg(p)
    p.set_defaults(func=cmd_answer)


def _pairs(args) -> tuple[list[str], list[str], list[str]]:
    """(images, questions, where each came from) of the command line or of --input."""
    from attnkit.data.vqa import read_vqa_file

    if args.input and args.pair:
        raise AttnkitError("answer: give IMAGE QUESTION or --input FILE, not both")
    if args.image_dir and not args.input:
        raise AttnkitError("--image-dir: only with --input (the directory its images are in)")
    if args.input:
        data = read_vqa_file(args.input, args.image_dir, answers=False)
        return [str(p) for p in data.images], data.questions, [f"{args.input}:{n}" for n in data.lines]
    if len(args.pair) != 2:
        raise AttnkitError(f"answer: expected IMAGE QUESTION (two arguments), got {len(args.pair)}; or --input "
                           "FILE")
    image, question = args.pair
    if not Path(image).is_file():
        raise AttnkitError(f"{image}: image not found")
    if not question.strip():
        raise AttnkitError("QUESTION: empty (expected a question about the image)")
    return [image], [question], ["QUESTION"]


def cmd_answer(args) -> int:
    from attnkit.api import load
    from attnkit.data import load_image
    from attnkit.viz import plot_caption_attention

    check_output(args.output)
    check_output(args.show_attention, "--show-attention", directory=True)
    images, questions, where = _pairs(args)
    model = load(args.checkpoint, precision=args.precision)
    model.require("answer")
    for question, place in zip(questions, where):
        model.kind.check_question(question, place)
    rows, columns = model.kind.grid(model)

    def answered():
        for start in range(0, len(questions), args.batch_size):
            chunk = slice(start, start + args.batch_size)
            lines = []
            for i, a in enumerate(model.answer(images[chunk], questions[chunk], args.batch_size), start):
                if a.unknown_words:
                    print(f"{where[i]}: words never seen in training, read as <unk>: {' '.join(a.unknown_words)}",
                          file=sys.stderr)
                if args.json:
                    record = {"image": images[i], "question": questions[i], **a.to_json()}
                    record.pop("glimpses")
                    lines.append(json.dumps(record, ensure_ascii=False))
                else:
                    lines.append(f"{a.answer}\t{a.probability:.4f}")
                if args.show_attention and a.glimpses is not None:
                    out = Path(args.show_attention) / f"{i:05d}-{Path(images[i]).stem}.glimpses.png"
                    names = [f"glimpse {k + 1}" for k in range(a.glimpses.size(0))]
                    names[0] = f"{questions[i]}\n{names[0]} -> {a.answer}"
                    plot_caption_attention(load_image(images[i], 224), names, a.glimpses.flatten(1),
                                           (rows, columns), out, columns=len(names) + 1)
                    print(f"  attention: {out}", file=sys.stderr)
            yield lines

    return stream(args.output, answered())


def evaluate_answers(args) -> int:
    """`attnkit evaluate --data` for a VQA model: ``--data`` is a JSONL or TSV file of questions with their answers,
    or ``FORMAT:SPLIT`` of a registered VQA data format (``easy_vqa:test``); prints accuracy overall and per
    question type as one JSON object with ``n``."""
    from attnkit import registry
    from attnkit.api import load
    from attnkit.data.vqa import read_vqa_file

    model = load(args.checkpoint, precision=args.precision)
    model.require("answer")
    name, _, split = args.data.partition(":")
    if split and name in registry.FORMATS and not Path(args.data).exists():
        form = registry.data_format(name)
        if form.task != registry.family(model.family).task or form.needs:
            raise AttnkitError(f"--data {args.data}: {name} is not a corpus of questions this model reads")
        data = registry.resolve(form.reader)(model.config, split)
    else:
        data = read_vqa_file(args.data)
    scores, results = model.evaluate_answers(data)
    result = {"checkpoint": str(model.path), "data": args.data, "n": len(data), **scores}
    print(json.dumps(result))
    if args.output:
        Path(args.output).write_text("".join(f"{a.answer}\t{a.probability:.4f}\n" for a in results),
                                     encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0
