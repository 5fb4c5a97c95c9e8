"""Transfer learning at laptop scale: pretrain on WikiText-2, fine-tune on Tiny Shakespeare, against
training on Tiny Shakespeare from scratch with the same fine-tuning compute (the same steps and batches).

Both corpora are cut into one SentencePiece vocabulary trained on both training texts, so the pretrained
embeddings mean the same subwords in the fine-tuning run. ``make transfer`` runs the whole experiment:

    python bench/transfer.py tokenizer                     # runs/transfer/spm.model
    torchrun ... train configs/transfer_pretrain_wikitext2.toml --run-dir runs/transfer/pretrain
    torchrun ... train configs/transfer_finetune_tinyshakespeare.toml --run-dir runs/transfer/finetune \\
        --set train.init_from=runs/transfer/pretrain
    torchrun ... train configs/transfer_finetune_tinyshakespeare.toml --run-dir runs/transfer/scratch
    python bench/transfer.py report --commands "..."       # bench/results/transfer.json and its plot
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import sys
from pathlib import Path

from attnkit.config import load_config
from attnkit.data import read_tinyshakespeare, read_wikitext2, train_tokenizer
from attnkit.errors import AttnkitError
from attnkit.evaluate.results import write_results
from attnkit.train import read_metrics
from attnkit.train.tasks import LanguageModelTask
from attnkit.viz import plot_curves

FINETUNE = "configs/transfer_finetune_tinyshakespeare.toml"


def tokenizer(args) -> int:
    cfg = load_config(FINETUNE)
    wiki = load_config("configs/transfer_pretrain_wikitext2.toml")
    lines = (LanguageModelTask.lines(cfg, [read_tinyshakespeare(args.data_dir, "train")])
             + LanguageModelTask.lines(wiki, read_wikitext2(args.data_dir, "train")))
    tok = train_tokenizer(lines, args.out, args.vocab_size)
    print(f"{args.out}: {tok.vocab_size} pieces from {len(lines)} lines of both training texts")
    return 0


def valid_curve(run: Path) -> list[dict]:
    rows = read_metrics(run)
    return [{"step": r["step"], "valid_loss": round(r["valid_loss"], 4)} for r in rows if "valid_loss" in r]


def report(args) -> int:
    runs = Path(args.runs)
    curves = {name: valid_curve(runs / name) for name in ("finetune", "scratch")}
    pre = valid_curve(runs / "pretrain")
    for name, rows in curves.items():
        print(f"{name:>8}: final valid loss {rows[-1]['valid_loss']:.4f} at step {rows[-1]['step']}")
    plot_curves({"fine-tuned from WikiText-2": [(r["step"], r["valid_loss"]) for r in curves["finetune"]],
                          "from scratch": [(r["step"], r["valid_loss"]) for r in curves["scratch"]]},
                args.figure, "fine-tuning step", "validation loss (nats per subword)",
                "Tiny Shakespeare: pretrained on WikiText-2 vs from scratch")
    figure = args.figure
    final = {name: rows[-1]["valid_loss"] for name, rows in curves.items()}
    best = {name: min(r["valid_loss"] for r in rows) for name, rows in curves.items()}
    write_results(args.out, "transfer", args.commands,
                  metrics={"finetune_valid_loss": final["finetune"], "scratch_valid_loss": final["scratch"],
                           "gain_nats_per_subword": round(final["scratch"] - final["finetune"], 4),
                           "finetune_best_valid_loss": best["finetune"], "scratch_best_valid_loss": best["scratch"],
                           "pretrain_valid_loss": pre[-1]["valid_loss"] if pre else None},
                  curves=curves, pretrain_curve=pre, figure=str(figure),
                  vocabulary=f"SentencePiece trained on both training texts ({runs}/spm.model)")
    print(args.out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tokenizer", help="train the shared SentencePiece model")
    p.add_argument("--data-dir")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--out", default="runs/transfer/spm.model")
    p.set_defaults(func=tokenizer)
    p = sub.add_parser("report", help="both validation curves -> JSON and a plot")
    p.add_argument("--runs", default="runs/transfer")
    p.add_argument("--commands", required=True, help="the commands that ran the experiment, recorded verbatim")
    p.add_argument("--out", default="bench/results/transfer.json")
    p.add_argument("--figure", default="bench/results/transfer.png")
    p.set_defaults(func=report)
    args = ap.parse_args()
    try:
        return args.func(args)
    except AttnkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
