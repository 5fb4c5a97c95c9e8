"""Score a finished language-model run on its validation split and write bench/results/<name>.json.

Validation loss (nats per token) and perplexity over every token of the split, and bits per character
(loss / ln 2) for a character model, of the checkpoint the run chose (``best`` by validation loss, or --checkpoint),
with the validation curve against training minutes from the run's metrics.jsonl. The headline
numbers cut the split into disjoint blocks, as validation during training does (a block's first
tokens see little context); ``sliding_window`` scores each token once with at least ``window - stride``
tokens before it (--strides, default half a block), closer to how published perplexities give every
token its context. A smaller stride gives more context and costs block/stride times the disjoint pass.

A word-level model is also scored with Grave et al.'s (2017) continuous cache over the sliding window's states
(``continuous_cache``): its three settings (cache size, theta, lambda) are chosen on a grid, two-fold, so that
no token is scored with settings chosen on it: each half of the split is scored with the settings that did
best on the other half.

    python bench/language_model.py --run-dir runs/tinyshakespeare_char --train-command "..."

Targets (``TARGETS``): Tiny Shakespeare validation loss <= 1.47 within 30 training minutes; WikiText-2
validation perplexity <= 100 within 60.
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path

from attnkit.checkpoint import load_checkpoint
from attnkit.config import load_config
from attnkit.evaluate import language_model_scores, sliding_window_scores
from attnkit.evaluate.perplexity import cache_mixture_log_probs, continuous_cache_probs, sliding_window_states
from attnkit.evaluate.results import write_results
from attnkit.train import read_metrics
from attnkit.train.tasks import LanguageModelTask

# (metric, at most, training minutes, whose published figure)
TARGETS = {"tinyshakespeare": ("valid_loss", 1.47, 30, "nanoGPT's baby GPT: 1.4697 after 5000 steps of 16k characters "
                                                       "on an A100, a 256-character window"),
           "wikitext2": ("valid_ppl", 100.0, 60, "small word-level language models of the literature")}


def curve(run: Path) -> list[dict]:
    """Validation records of metrics.jsonl, each with the training minutes of the last training record before it."""
    out, minutes = [], 0.0
    for r in read_metrics(run):
        if "minutes" in r:
            minutes = r["minutes"]
        if "valid_loss" in r:
            out.append({"step": r["step"], "epoch": r.get("epoch"), "train_minutes": round(minutes, 2),
                        **{k: round(v, 4) for k, v in r.items() if k.startswith("valid_")}})
    return out


CACHE_SIZES = (500, 1000, 2000, 5000, 10000)
CACHE_THETAS = (0.003, 0.005, 0.01, 0.02, 0.03)
CACHE_LAMBDAS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)


def continuous_cache(model, stream, window: int, stride: int, batch_windows: int) -> dict:
    """The continuous cache's validation scores, two-fold: each half scored with the other half's best settings."""
    states, log_probs = sliding_window_states(model, stream, window, stride, batch_windows)
    half = stream.numel() // 2
    folds = [slice(0, half), slice(half, None)]
    grid = {}  # (cache size, theta, lambda) -> mixed log-probabilities [N]
    for size in CACHE_SIZES:
        for theta in CACHE_THETAS:
            cache = continuous_cache_probs(states, stream, theta, size)
            for lam in CACHE_LAMBDAS:
                grid[size, theta, lam] = cache_mixture_log_probs(log_probs, cache, lam)
    nll, chosen = 0.0, []
    for tuned, scored, names in ((folds[0], folds[1], ("first", "second")), (folds[1], folds[0], ("second", "first"))):
        best = min(grid, key=lambda k: float(-grid[k][tuned].sum()))
        fold_nll = float(-grid[best][scored].sum())
        nll += fold_nll
        n = grid[best][scored].numel()
        chosen.append({"scored": f"{names[1]} half", "tuned_on": f"{names[0]} half", "cache_size": best[0],
                       "theta": best[1], "lambda": best[2], "valid_ppl": round(math.exp(fold_nll / n), 2),
                       "model_ppl": round(math.exp(float(-log_probs[scored].mean())), 2)})
    loss = nll / stream.numel()
    return {"valid_loss": round(loss, 4), "valid_ppl": round(math.exp(loss), 2), "window": window, "stride": stride,
            "folds": chosen, "grid": {"cache_size": list(CACHE_SIZES), "theta": list(CACHE_THETAS),
                                      "lambda": list(CACHE_LAMBDAS)},
            "method": "Grave et al. 2017, continuous cache over the sliding window's last-layer states; settings "
                      "chosen two-fold on the split's halves",
            "published": "Grave et al. 2017, WikiText-2 test: LSTM 99.3, with the continuous cache 68.9"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--train-command", required=True, help="the command that trained the run, recorded verbatim")
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--data-dir")
    ap.add_argument("--strides", help="comma-separated sliding-window strides (default: half a block)")
    ap.add_argument("--out", help="default: bench/results/<the run's config name>.json")
    args = ap.parse_args()

    run = Path(args.run_dir)
    cfg = load_config(run / "config.toml")
    model, cfg, _, path = load_checkpoint(run / "checkpoints" / args.checkpoint)
    task = LanguageModelTask(cfg, run, args.data_dir)  # the run's own tokenizer, from run_dir
    # bits per character where a token is a character (Tiny Shakespeare's own tokenizer; not a SentencePiece one)
    characters = cfg.data.format == "tinyshakespeare" and cfg.data.lm_tokenizer == "corpus"
    batch_blocks = max(1, cfg.train.max_tokens // cfg.data.block_size)
    s = language_model_scores(model, task.blocks["valid"], batch_blocks, characters=characters)
    window = cfg.data.block_size
    try:
        strides = [int(x) for x in args.strides.split(",")] if args.strides else [window // 2]
    except ValueError:
        strides = []
    if not strides or not all(0 < stride <= window for stride in strides):
        ap.error(f"--strides {args.strides}: each stride must be in 1..{window} (the block size)")
    sliding = [sliding_window_scores(model, task.streams["valid"], window, stride, batch_blocks, characters)
               for stride in strides]
    cache = None if characters else continuous_cache(model, task.streams["valid"], window, window // 2, batch_blocks)
    meta = json.loads((path / "meta.json").read_text())
    progress = meta["progress"]
    metric, target, minutes, published = TARGETS[cfg.data.format]
    metrics = {"valid_loss": round(s["loss"], 4), "valid_ppl": round(s["ppl"], 2), "valid_tokens": s["tokens"],
               **({"valid_bpc": round(s["bpc"], 4)} if characters else {}),
               # each token with at least window - stride tokens of context (window = block_size)
               "sliding_window": [{"valid_loss": round(r["loss"], 4), "valid_ppl": round(r["ppl"], 2),
                                   "window": window, "stride": stride,
                                   **({"valid_bpc": round(r["bpc"], 4)} if characters else {})}
                                  for stride, r in zip(strides, sliding)],
               **({"continuous_cache": cache} if cache else {}),
               "target": {metric: target, "train_minutes": minutes, "published": published}}
    print(json.dumps(metrics), file=sys.stderr)
    out = args.out or f"bench/results/{cfg.name}.json"
    write_results(
        out, cfg.name,
        command=f"{args.train_command} && python bench/language_model.py --run-dir {args.run_dir}"
                + (f" --checkpoint {args.checkpoint}" if args.checkpoint != "best" else "")
                + (f" --strides {args.strides}" if args.strides else ""),
        metrics=metrics, checkpoint=path.name, step=progress["step"], epochs_completed=progress["epoch"],
        config=tomllib.loads((run / "config.toml").read_text(encoding="utf-8")),
        train_minutes=round(progress["train_seconds"] / 60, 2),
        tokens_per_s=round(progress["train_tokens"] / max(progress["train_seconds"], 1e-9), 1),
        parameters=sum(p.numel() for p in model.parameters()), curve=curve(run),
        split=("last 10% of the text" + (" (characters)" if characters else "") if cfg.data.format == "tinyshakespeare"
               else "WikiText-2 valid (words, <eos> per line)"),
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
