"""Score a finished Multi30k run on test_2016_flickr and write bench/results/<run's config name>.json
(multi30k_en_de.json for the Transformer; multi30k_en_de_rnnsearch.json, ..._rnnencdec.json for the RNNs).

The checkpoint is chosen on the validation set only (best vs. averaged, beam search),
then scored once on the test set: cased sacreBLEU and chrF with their signatures, and beside them the BLEU the
papers print (lowercased, Moses-tokenised, as multi-bleu.perl; attnkit.evaluate.paper_bleu). A run whose text is
lowercased (``data.lowercase``, multi30k_en_de_lc.json) writes no case to score: its sacreBLEU and chrF ignore case,
as their signatures say (``case:lc``).

    python bench/multi30k_en_de.py --run-dir runs/multi30k_en_de --train-command "..."
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

from attnkit.checkpoint import load_checkpoint
from attnkit.config import load_config
from attnkit.data import load_split
from attnkit.decode import translate
from attnkit.evaluate import bleu, bleu_by_length, chrf, paper_bleu
from attnkit.evaluate.results import run_training, write_results
from attnkit.train import read_metrics

# the published paper-style BLEU on test2016 each recipe is held to, within an hour of training on 2 cores
TARGETS = {"multi30k_en_de": {"paper_bleu": 41.0, "published": "Wu et al. 2021, text-only Transformer-Tiny: 41.02"},
           "multi30k_en_de_lc": {"paper_bleu": 41.0, "published": "Wu et al. 2021, text-only Transformer-Tiny: 41.02"},
           "multi30k_en_de_rnnsearch": {"paper_bleu": 38.0, "published": "LIUM-CVC's attentive GRU: about 38"}}


def score(path, pairs, beam, len_penalty):
    model, cfg, toks, _ = load_checkpoint(path)
    start = time.monotonic()
    out = translate(model, toks, pairs.src, beam_size=beam, len_penalty=len_penalty,
                    max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b)
    hyps = [t.text[0] for t in out]
    lowercase = cfg.data.lowercase  # a model that writes lowercased text: sacreBLEU and chrF case-insensitive
    return hyps, bleu(hyps, pairs.tgt, lowercase), chrf(hyps, pairs.tgt, lowercase), time.monotonic() - start


def launches(run: Path) -> list[dict]:
    """When and how training was started: one entry per launch in run.jsonl, so a resumed run says so."""
    path = run / "run.jsonl"
    if not path.is_file():
        return []
    return [{"time": r["time"], "argv": r["argv"][1:], "world_size": r["world_size"], "git_commit": r["git_commit"],
             "precision": r.get("precision")}  # what train.precision trained at, "auto" resolved
            for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-dir", default="runs/multi30k_en_de")
    ap.add_argument("--train-command", required=True, help="the command that trained the run, recorded verbatim")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--len-penalty", type=float, nargs="+", default=[1.0])
    ap.add_argument("--data-dir")
    ap.add_argument("--out", help="default: bench/results/<the run's config name>.json")
    args = ap.parse_args()

    run = Path(args.run_dir)
    cfg = load_config(run / "config.toml")
    args.out = args.out or f"bench/results/{cfg.name}.json"
    valid = load_split(cfg.data, "valid", args.data_dir)
    test = load_split(cfg.data, "test", args.data_dir)
    candidates = [run / "checkpoints" / n for n in ("best", "averaged") if (run / "checkpoints" / n).exists()]
    selection = []
    for path in candidates:
        for lp in args.len_penalty:
            _, b, _, _ = score(path, valid, args.beam, lp)
            selection.append({"checkpoint": path.name, "len_penalty": lp, "valid_bleu": b.score})
            print(f"valid  {path.name:<9} len_penalty={lp}: {b}", file=sys.stderr)
    chosen = max(selection, key=lambda r: r["valid_bleu"])
    path = run / "checkpoints" / chosen["checkpoint"]
    hyps, b, c, seconds = score(path, test, args.beam, chosen["len_penalty"])
    p = paper_bleu(hyps, test.tgt, cfg.data.tgt_lang)
    print(f"test   {chosen['checkpoint']}: {b}\n       {p}\n       {c}", file=sys.stderr)
    (run / "test_2016_flickr.hyp.de").write_text("\n".join(hyps) + "\n", encoding="utf-8")

    metrics_log = read_metrics(run)
    train_logs = [r for r in metrics_log if "tokens_per_s" in r and "lr" in r]
    chosen_step = json.loads((path.resolve() / "meta.json").read_text())["progress"]["step"]
    started, finished = run / "started", run / "finished"
    wall = None
    if started.exists() and finished.exists():
        wall = (int(finished.read_text()) - int(started.read_text())) / 60
    write_results(
        args.out, cfg.name,
        command=f"{args.train_command} && python bench/multi30k_en_de.py --run-dir {args.run_dir} --beam {args.beam}",
        metrics={"bleu": round(b.score, 2), "signature": b.signature, "chrf": round(c.score, 2),
                 "chrf_signature": c.signature, "paper_bleu": round(p.score, 2),
                 "paper_bleu_precisions": [round(x, 1) for x in p.precisions], "paper_bleu_bp": round(p.bp, 3),
                 "paper_bleu_signature": p.signature, "test_set": "multi30k test_2016_flickr en-de",
                 "bleu_by_length": bleu_by_length(test.src, hyps, test.tgt, lowercase=cfg.data.lowercase),
                 "lowercased": cfg.data.lowercase,
                 **({"target": {**TARGETS[cfg.name], "train_minutes": 60}} if cfg.name in TARGETS else {})},
        **run_training(run), wall_minutes_including_validation=None if wall is None else round(wall, 2),
        config=tomllib.loads((run / "config.toml").read_text(encoding="utf-8")),
        checkpoint=chosen["checkpoint"], checkpoint_step=chosen_step, beam=args.beam,
        len_penalty=chosen["len_penalty"],
        selection_on_valid=selection, decode_seconds_test=round(seconds, 1),
        last_train_log=train_logs[-1] if train_logs else None,
        validation=[{k: r[k] for k in ("step", "epoch", "valid_loss", "valid_bleu") if k in r}
                    for r in metrics_log if "valid_loss" in r],  # every evaluation during training
        launches=launches(run),
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
