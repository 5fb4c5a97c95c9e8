"""What pretraining buys on a real task: SST-2 dev accuracy of the shipped MiniLM fine-tuned (the ``make sst2`` run)
against its frozen sentence embeddings under a logistic regression, and of attnkit's own GPT fine-tuned with
GPT-1's recipe from random weights and from the transfer recipe's WikiText-2 LM (the ``make sst2-gpt`` runs),
written to bench/results/sst2_pretraining.json.

The frozen baseline is sentence-transformers' use of the model: the mean of its final states over the real tokens,
L2-normalised (``BertEncoder.embed``), computed once for the 67,349 training and 872 dev sentences, then
scikit-learn's ``LogisticRegression`` (L2, C chosen on a held-out tenth of the training set among a few values,
then refit on all of it). The fine-tuned rows are read from their runs' JSONs (bench/glue.py), so they are the
recipes' runs; a JSON that is missing leaves its row out.

    python bench/sst2_pretraining.py
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
from pathlib import Path

import numpy as np
import torch

from attnkit.data import WordPiece, read_glue, token_batches
from attnkit.data.wordpiece import collate_sentences
from attnkit.evaluate.results import write_results
from attnkit.models.bert import load_bert, minilm_dir


@torch.no_grad()
def embed(encoder, tokenizer: WordPiece, texts: list[str], batch_tokens: int = 8192) -> np.ndarray:
    """[N, d] normalised mean embeddings of ``texts``, in their order, batched by length."""
    examples = [tokenizer.example(t) for t in texts]
    out = np.zeros((len(texts), encoder.cfg.d_model), dtype=np.float32)
    for idx in token_batches([len(ids) - 1 for ids, _ in examples], [0] * len(examples), batch_tokens):
        b = collate_sentences([examples[i] for i in idx], tokenizer.pad_id)
        out[idx] = encoder.embed(b.tokens, b.padding_mask).numpy()
    return out


def fine_tuned(system: str, file: str) -> list[dict]:
    """The row of a fine-tuning run from its bench/glue.py JSON (none where it is missing)."""
    if not Path(file).exists():
        return []
    r = json.loads(Path(file).read_text())
    return [{"system": system, "dev_accuracy": r["metrics"]["dev_accuracy"], "minutes": r.get("train_minutes"),
             "detail": {"json": file, "epochs": r.get("epochs"), "steps": r.get("step"),
                        "best_step": r.get("best_step"), "git_commit": r.get("git_commit")}}]


def main() -> int:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir")
    ap.add_argument("--fine-tuned", default="bench/results/glue_sst2.json")
    ap.add_argument("--gpt-scratch", default="bench/results/glue_sst2_gpt_scratch.json")
    ap.add_argument("--gpt-pretrained", default="bench/results/glue_sst2_gpt.json")
    ap.add_argument("--out", default="bench/results/sst2_pretraining.json")
    args = ap.parse_args()

    train, dev = read_glue("sst2", "train", args.data_dir), read_glue("sst2", "dev", args.data_dir)
    directory = minilm_dir()
    encoder, tokenizer = load_bert(directory), WordPiece.from_pretrained(directory, max_len=128)
    t0 = time.perf_counter()
    x_train, x_dev = embed(encoder, tokenizer, train.texts), embed(encoder, tokenizer, dev.texts)
    embed_minutes = (time.perf_counter() - t0) / 60
    y_train, y_dev = np.array([int(y) for y in train.labels]), np.array([int(y) for y in dev.labels])
    rng = np.random.default_rng(0)
    held = rng.permutation(len(y_train))[: len(y_train) // 10]
    fit = np.setdiff1d(np.arange(len(y_train)), held)
    t0 = time.perf_counter()
    choices = {}
    for c in (0.1, 1.0, 10.0, 100.0):
        lr = LogisticRegression(C=c, max_iter=2000).fit(x_train[fit], y_train[fit])
        choices[c] = accuracy_score(y_train[held], lr.predict(x_train[held]))
    best_c = max(choices, key=choices.get)
    lr = LogisticRegression(C=best_c, max_iter=2000).fit(x_train, y_train)
    frozen = 100 * accuracy_score(y_dev, lr.predict(x_dev))
    fit_minutes = (time.perf_counter() - t0) / 60
    frozen_row = {"system": "all-MiniLM-L6-v2 frozen, mean embedding + logistic regression",
                  "dev_accuracy": round(frozen, 2), "minutes": round(embed_minutes + fit_minutes, 2),
                  "detail": {"C": best_c, "held_out_accuracy": {str(k): round(100 * v, 2) for k, v in choices.items()},
                             "embed_minutes": round(embed_minutes, 2), "fit_minutes": round(fit_minutes, 2)}}
    rows = [*fine_tuned("attnkit GPT (5M) fine-tuned from random weights (make sst2-gpt)", args.gpt_scratch),
            *fine_tuned("attnkit GPT (5M) pretrained on WikiText-2, fine-tuned (make sst2-gpt)", args.gpt_pretrained),
            frozen_row, *fine_tuned("all-MiniLM-L6-v2 fine-tuned (make sst2)", args.fine_tuned)]
    print(json.dumps(rows, indent=1), file=sys.stderr)
    write_results(args.out, "sst2_pretraining", command="python bench/sst2_pretraining.py",
                  metrics={"rows": rows}, threads=torch.get_num_threads(), split="GLUE SST-2 dev (872 sentences)")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
