"""The commands that write checkpoints and what goes with them: export (Hugging Face, CTranslate2, ONNX),
import-marian, average, and shortlist (a translation model's vocabulary map). None writes over an input or a
non-empty directory unless asked."""

from __future__ import annotations

import sys
from pathlib import Path

from attnkit.cli.common import at_least, check_output
from attnkit.errors import AttnkitError


def add_shortlist(sub) -> None:
    p = sub.add_parser("shortlist", help="learn a vocabulary map (which target tokens may translate each source "
                                         "token) from a run's training pairs, for translate --shortlist")
    p.add_argument("checkpoint", help="a checkpoint or run directory of a translation model")
    p.add_argument("--output", "-o", help="default: vmap.txt in the run directory")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--per-source", type=at_least(0), default=20,
                   help="each source token's most likely translations kept (IBM Model 1), beyond the frequent ones")
    p.add_argument("--frequent", type=at_least(0), default=100,
                   help="the most frequent target tokens, always candidates")
    p.set_defaults(func=cmd_shortlist)


def add_average(sub) -> None:
    p = sub.add_parser("average", help="average the weights of checkpoints")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--output", "-o", required=True, help="a new (or empty) directory; never one of the inputs")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --output")
    p.set_defaults(func=cmd_average)


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write a Transformer checkpoint as a Hugging Face MarianMTModel, a "
                                      "CTranslate2 model, or ONNX graphs (encoder, one decoder step)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--to", required=True, choices=("huggingface", "ctranslate2", "onnx"))
    p.add_argument("--output", "-o", required=True, help="the directory to write")
    p.add_argument("--vmap", help="a vocabulary map (attnkit shortlist) for the CTranslate2 export to carry "
                                  "(translate_batch(..., use_vmap=True))")
    p.set_defaults(func=cmd_export)


def add_import_marian(sub) -> None:
    p = sub.add_parser("import-marian", help="a Hugging Face MarianMTModel directory -> an attnkit checkpoint")
    p.add_argument("hf_dir")
    p.add_argument("--output", "-o", required=True, help="the checkpoint directory to write")
    p.set_defaults(func=cmd_import_marian)


def cmd_shortlist(args) -> int:
    """Learn a vocabulary map from the run's training pairs (IBM Model 1) and write it, CTranslate2's vmap.txt."""
    from attnkit.checkpoint import load_checkpoint
    from attnkit.data import encode_pairs
    from attnkit.data.prepare import load_split
    from attnkit.data.shortlist import build_vocabulary_map

    module, cfg, toks, directory = load_checkpoint(args.checkpoint)
    if "translate" not in module.capabilities or not hasattr(toks, "tgt"):
        raise AttnkitError(f"{args.checkpoint}: a {module.family} model does not translate; a shortlist is a "
                           "translation model's")
    out = Path(args.output) if args.output else \
        (directory.parent.parent if directory.parent.name == "checkpoints" else directory) / "vmap.txt"
    check_output(out)
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
    check_output(out, directory=True)
    print(import_marian(args.hf_dir, args.output))
    return 0
