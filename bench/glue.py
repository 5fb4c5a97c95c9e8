"""Score a finished fine-tuning run on its dev split and write bench/results/<name>.json.

The checkpoint the run chose (``best`` by the task's metric on dev, or --checkpoint) is scored again on the whole
dev split with the task's metrics (scikit-learn: accuracy, F1, Matthews; SciPy: Pearson, Spearman), beside the
published dev figure it is held to, with the dev curve against training minutes from the run's metrics.jsonl.
GLUE keeps its test labels private, so dev is what papers report; a run that selects its checkpoint on dev, as
this one does, is compared with papers that did the same (BERT's and MiniLM's tables).

    python bench/glue.py --run-dir runs/glue_sst2 --train-command "..."
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
from pathlib import Path

from language_model import curve  # bench/: the dev curve, as the language models record theirs

from attnkit.checkpoint import load_checkpoint
from attnkit.decode import classify_logits
from attnkit.evaluate import classification_scores, regression_scores
from attnkit.evaluate.results import write_results
from attnkit.train.tasks import read_labelled_splits

# the MiniLM recipe's config name -> (the metric held to a target, the target, training minutes allowed, where the
# target comes from); other runs (GPT-1's recipe) are tabled against these, not held to them
TARGETS = {
    "glue_sst2": ("accuracy", 91.5, 45, "MiniLM-L6-H384 (Wang et al. 2020), SST-2 dev accuracy"),
    "glue_mrpc": ("f1", 88.9, 30, "MiniLM-L6 / DistilBERT published MRPC dev F1"),
    "glue_stsb": ("spearman", 87.0, 30, "MiniLM-L6 / DistilBERT published STS-B dev Spearman"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--train-command", required=True, help="the command that trained the run, recorded verbatim")
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--data-dir")
    ap.add_argument("--out", help="default: bench/results/<the run's config name>.json")
    args = ap.parse_args()

    run = Path(args.run_dir)
    model, cfg, tokenizer, path = load_checkpoint(run / "checkpoints" / args.checkpoint)
    _, dev = read_labelled_splits(cfg, args.data_dir)
    logits = classify_logits(model, tokenizer, dev.texts, dev.pairs)
    if model.problem == "regression":
        scores = regression_scores(logits[:, 0].tolist(), [float(x) for x in dev.labels])
    else:
        index = {name: i for i, name in enumerate(model.labels)}
        scores = classification_scores(logits.argmax(-1).tolist(), [index[x] for x in dev.labels], model.n_labels)
    progress = json.loads((path / "meta.json").read_text())["progress"]  # the chosen checkpoint's
    last = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["progress"]  # the whole run's
    metrics = {f"dev_{k}": round(v, 2) for k, v in scores.items()} | {"dev_examples": len(dev.texts)}
    target = TARGETS.get(cfg.name)
    if target:
        metric, value, minutes, source = target
        metrics["target"] = {f"dev_{metric}": value, "train_minutes": minutes, "source": source}
    print(json.dumps(metrics), file=sys.stderr)
    out = args.out or f"bench/results/{cfg.name}.json"
    write_results(
        out, cfg.name,
        command=f"{args.train_command} && python bench/glue.py --run-dir {args.run_dir}"
                + (f" --checkpoint {args.checkpoint}" if args.checkpoint != "best" else ""),
        metrics=metrics, checkpoint=path.name, step=last["step"], epochs=last["epoch"],
        train_minutes=round(last["train_seconds"] / 60, 2), best_step=progress["step"],
        best_minutes=round(progress["train_seconds"] / 60, 2),
        examples_per_s=round(last["train_tokens"] / max(last["train_seconds"], 1e-9), 1),
        parameters=sum(p.numel() for p in model.parameters()), curve=curve(run),
        config=f"configs/{cfg.name}.toml", pretrained=cfg.model.pretrained or "all-MiniLM-L6-v2 (shipped)",
        split=f"GLUE {cfg.data.format} dev",
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
