"""BLEU against source length for several systems on one test set: the lectures' Bahdanau figure.

Each system is a trained checkpoint (or run directory: its best checkpoint); all are scored on the
same sentences, and the script refuses systems whose configs would give different test sets.

    python bench/bleu_by_length.py --data multi30k --edges 5,10,15,20,25 \\
        --system RNNencdec=runs/multi30k_en_de_rnnencdec/checkpoints/averaged \\
        --system RNNsearch=runs/multi30k_en_de_rnnsearch/checkpoints/averaged \\
        --system Transformer=runs/multi30k_en_de/checkpoints/averaged \\
        --out bench/results/bleu_by_length_multi30k.json

``--data multi30k`` scores test_2016_flickr. ``--data tatoeba`` scores Tatoeba's "test" plus its
"test_long" hold-out (trained with ``data.long_test_min_words``; see
``attnkit.data.prepare.tatoeba_split`` for why that split suits a by-length comparison).
The figure is written beside the JSON; ``attnkit plot-by-length JSON -o PNG`` redraws it.
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import shlex
import sys
import time
from pathlib import Path

from attnkit.checkpoint import load_checkpoint
from attnkit.data import Parallel, load_split
from attnkit.decode import translate
from attnkit.errors import AttnkitError
from attnkit.evaluate import bleu, bleu_by_length, chrf
from attnkit.evaluate.results import run_training, write_results
from attnkit.viz import plot_bleu_by_length
from attnkit.viz.curves import bucket_label


def test_set(cfg, data: str, data_dir: str | None) -> Parallel:
    if cfg.data.format != data:
        raise SystemExit(f"a {cfg.data.format} model cannot be scored on --data {data}")
    if data == "multi30k":
        return load_split(cfg.data, "test", data_dir)
    if cfg.data.long_test_min_words <= 0:
        raise SystemExit("Tatoeba models for this comparison are trained with data.long_test_min_words > 0, "
                         "so that the long held-out sentences stay out of training")
    test, long = load_split(cfg.data, "test", data_dir), load_split(cfg.data, "test_long", data_dir)
    return Parallel(test.src + long.src, test.tgt + long.tgt, test.origin)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", action="append", required=True, metavar="NAME=CHECKPOINT")
    ap.add_argument("--data", choices=("multi30k", "tatoeba"), default="multi30k")
    ap.add_argument("--edges", default="5,10,15,20,25", help="bucket edges in source words")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--data-dir")
    ap.add_argument("--limit", type=int, default=0, help="only the first N test sentences (a smoke test)")
    ap.add_argument("--out", default=None, help="default: bench/results/bleu_by_length_<data>.json")
    args = ap.parse_args()
    edges = tuple(int(e) for e in args.edges.split(","))
    out = Path(args.out or f"bench/results/bleu_by_length_{args.data}.json")

    systems, pairs = {}, None
    for spec in args.system:
        name, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--system {spec}: expected NAME=CHECKPOINT")
        model, cfg, toks, resolved = load_checkpoint(path)
        these = test_set(cfg, args.data, args.data_dir)
        if args.limit:
            these = Parallel(these.src[:args.limit], these.tgt[:args.limit], these.origin)
        if pairs is not None and (these.src, these.tgt) != (pairs.src, pairs.tgt):
            raise SystemExit(f"{name}: its config gives another test set than the first system's")
        pairs = these
        start = time.monotonic()
        hyps = [t.text[0] for t in translate(model, toks, pairs.src, beam_size=args.beam,
                                             len_penalty=cfg.decode.len_penalty, max_len_a=cfg.decode.max_len_a,
                                             max_len_b=cfg.decode.max_len_b)]
        b, c = bleu(hyps, pairs.tgt), chrf(hyps, pairs.tgt)
        systems[name] = {"checkpoint": str(resolved), "family": cfg.model.family, "bleu": round(b.score, 2),
                         "chrf": round(c.score, 2), "by_length": bleu_by_length(pairs.src, hyps, pairs.tgt, edges),
                         "decode_seconds": round(time.monotonic() - start, 1),
                         **run_training(Path(resolved).parent.parent)}  # RUN/checkpoints/step-N: RUN's training
        print(f"{name:<14} {b}", file=sys.stderr)
        for row in systems[name]["by_length"]:
            print(f"    source words {bucket_label(row):<6} n={row['n']:<5} BLEU {row['bleu']:.2f}", file=sys.stderr)

    test_name = "multi30k test_2016_flickr" if args.data == "multi30k" else "tatoeba test + test_long"
    png = out.with_suffix(".png")
    plot_bleu_by_length({k: v["by_length"] for k, v in systems.items()}, png,
                        title=f"BLEU by source length, {test_name} (beam {args.beam})")
    write_results(out, f"bleu_by_length_{args.data}", "python " + shlex.join(sys.argv),
                  metrics={"test_set": test_name, "sentences": len(pairs.src), "signature": b.signature,
                           "bleu": {k: v["bleu"] for k, v in systems.items()}},
                  systems=systems, edges=list(edges), beam=args.beam, plot=str(png))
    print(f"wrote {out} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except AttnkitError as e:  # a system that is not there, or systems that disagree: one line, status 2
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
