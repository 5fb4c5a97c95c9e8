"""Score the three easy-VQA runs (Show, Ask, Attend and Answer and its two baselines) on the package's test split
and write bench/results/easy_vqa.json: accuracy overall and per question type for each, beside the target.

    python bench/vqa.py --run glimpses=runs/easy_vqa --run pooled=runs/easy_vqa_pooled \
        --run none=runs/easy_vqa_question_only --train-command "..."

Each run's best checkpoint (by validation accuracy on the held-out tenth of the training images) is scored with
``Model.evaluate_answers`` on all 9,673 test questions, as ``attnkit evaluate --data easy_vqa:test`` scores it.
"""

from __future__ import annotations

import argparse
import json
import sys

import attnkit
from attnkit.data.vqa import read_easy_vqa
from attnkit.evaluate.results import run_training, write_results

TARGET = {"test_accuracy": 99.0, "train_minutes": 15, "source": "issue: the attention model on easy-VQA's test split"}
NAMES = {"glimpses": "Show, Ask, Attend and Answer (2 glimpses)", "pooled": "no attention (the grid's mean)",
         "none": "question only (no image)"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, metavar="NAME=RUN",
                    help="a system's name (glimpses, pooled, none) and its run directory; repeatable")
    ap.add_argument("--train-command", required=True, help="the commands that trained the runs, recorded verbatim")
    ap.add_argument("--test-questions", type=int, default=0, help="score the first N test questions (0: all)")
    ap.add_argument("--out", default="bench/results/easy_vqa.json")
    args = ap.parse_args()

    test = read_easy_vqa("test").head(args.test_questions)
    systems = {}
    for item in args.run:
        name, _, run = item.partition("=")
        model = attnkit.load(run)
        scores, _ = model.evaluate_answers(test)
        systems[name] = {"title": NAMES.get(name, name), "attention": model.config.model.attention,
                         **{f"test_{k}": round(v, 2) for k, v in scores.items()}, **run_training(run),
                         "checkpoint": model.path.name, "parameters": sum(p.numel() for p in model.module.parameters())}
        print(name, json.dumps(systems[name]), file=sys.stderr)
    main_system = systems.get("glimpses", next(iter(systems.values())))
    metrics = {"test_accuracy": main_system["test_accuracy"], "test_questions": len(test), "target": TARGET,
               "met": main_system["test_accuracy"] >= TARGET["test_accuracy"]}
    command = f"{args.train_command} && python bench/vqa.py " + " ".join(f"--run {r}" for r in args.run)
    write_results(args.out, "easy_vqa", command=command, metrics=metrics, systems=systems,
                  split="easy-VQA test (the easy-vqa package)", config="configs/easy_vqa.toml")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
