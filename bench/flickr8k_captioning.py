"""Score a finished Flickr8k captioning run on the dev split and write bench/results/<name>.json.

Corpus BLEU-1..4 of beam-searched captions against all 5 references of each dev image (attnkit's words, equal
to NLTK's corpus_bleu), and beside it the COCO caption evaluation that Show, Attend and Tell's tables report
(pycocoevalcap: its PTB tokenizer, BLEU-1..4, METEOR, ROUGE-L, CIDEr; Java from ``make java``).
Wall-clock minutes count everything the train command did, feature extraction included
(``started``/``finished`` stamps around it, written by ``make flickr8k``).

    python bench/flickr8k_captioning.py --run-dir runs/flickr8k_sat --train-command "..."
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
from importlib.metadata import version
from pathlib import Path

from attnkit.checkpoint import load_checkpoint
from attnkit.data import read_flickr8k, words
from attnkit.decode import caption
from attnkit.evaluate import caption_bleu, coco_caption_scores
from attnkit.evaluate.results import write_results
from attnkit.train.tasks import load_grids

# The published figure each family is held to, in the COCO caption evaluation (x 100)
TARGETS = {"show_attend_tell": {"bleu4": 21.3, "meteor": 20.3,
                                "published": "Xu et al. 2015, Flickr8k test, hard attention: BLEU-4 21.3, METEOR "
                                             "20.30 (soft attention: 19.5, 18.93)"}}


def caption_scores(captions: list[str], references: list[list[str]]) -> dict:
    """Captions (one per image) against each image's references as written -> BLEU-1..4 of attnkit's words
    (``bleu1``..``bleu4``) and the COCO caption evaluation (``coco``: bleu1..4, meteor, rouge_l, cider), all 0-100."""
    word_refs = [[" ".join(words(c)) for c in caps] for caps in references]
    return {**caption_bleu(captions, word_refs), "coco": coco_caption_scores(captions, references)}


def rounded(scores: dict) -> dict:
    return {k: rounded(v) if isinstance(v, dict) else round(v, 2) for k, v in scores.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-dir", default="runs/flickr8k_sat")
    ap.add_argument("--train-command", required=True)
    ap.add_argument("--beam", type=int, default=3)
    ap.add_argument("--checkpoint", help="the checkpoint to report (default: averaged if the run wrote one, "
                                         "else best); the others are scored beside it")
    ap.add_argument("--data-dir")
    ap.add_argument("--out")
    args = ap.parse_args()

    run = Path(args.run_dir)

    def score(which: str):
        model, cfg, vocab, path = load_checkpoint(run / "checkpoints" / which)
        dev = read_flickr8k(args.data_dir or cfg.data.data_dir or None, "dev")
        grids = load_grids(cfg, dev.images)  # from the feature cache the training run filled
        start = time.monotonic()
        out = caption(model, vocab, grids, beam_size=args.beam, len_penalty=cfg.decode.len_penalty,
                      max_len=cfg.decode.max_caption_len)
        seconds = time.monotonic() - start
        scores = caption_scores([c.text[0] for c in out], [list(caps) for caps in dev.captions])
        coco = scores["coco"]
        print(which, " ".join(f"BLEU-{n} {scores[f'bleu{n}']:.2f}" for n in range(1, 5)), "| COCO:",
              " ".join(f"BLEU-{n} {coco[f'bleu{n}']:.2f}" for n in range(1, 5)),
              f"METEOR {coco['meteor']:.2f} ROUGE-L {coco['rouge_l']:.2f} CIDEr {coco['cider']:.2f}", file=sys.stderr)
        (run / f"dev.captions.{which}.txt").write_text(
            "".join(f"{p.name}\t{c.text[0]}\n" for p, c in zip(dev.images, out)), encoding="utf-8")
        return cfg, path, scores, seconds

    # Flickr8k's test captions are not in the data and validation runs on dev, so "best" is chosen on the split
    # it is scored on; the reported checkpoint is fixed before the run instead (the config's average_last, or
    # --checkpoint), and the others are scored beside it
    which = args.checkpoint or ("averaged" if (run / "checkpoints" / "averaged").exists() else "best")
    cfg, path, scores, seconds = score(which)
    others = {}
    for other in ("best", "last"):
        if other != which:
            _, other_path, other_scores, _ = score(other)
            others[f"{other}_checkpoint"] = {"checkpoint": other_path.name, **rounded(other_scores)}
    meta = json.loads((path / "meta.json").read_text())

    def minutes(a: str, b: str) -> float | None:
        if (run / a).exists() and (run / b).exists():
            return round((int((run / b).read_text()) - int((run / a).read_text())) / 60, 2)
        return None

    name = cfg.name
    target = TARGETS.get(cfg.model.family)
    if target is not None:
        met = all(scores["coco"][k] >= target[k] for k in ("bleu4", "meteor"))
        target = {**target, "train_minutes": 60, "met": met}
    else:
        target = {"published": f"none: no paper reports Flickr8k for attnkit's {cfg.model.family}"}
    write_results(
        args.out or f"bench/results/{name}.json", name,
        command=f"python bench/extract_flickr8k_features.py --config configs/{cfg.name}.toml --cache-dir runs/features "
                f"--threads 2 && "
                f"{args.train_command} && python bench/flickr8k_captioning.py --run-dir {args.run_dir} "
                f"--beam {args.beam}" + (f" --checkpoint {args.checkpoint}" if args.checkpoint else ""),
        metrics={**rounded(scores),
                 "split": "Flickr8k dev (1000 images, 5 references each)",
                 "bleu_definition": "corpus BLEU, lowercased alphanumeric words, closest reference length, "
                                    "sacrebleu tokenize=none (equals NLTK corpus_bleu; tested)",
                 "coco_definition": f"pycocoevalcap {version('pycocoevalcap')}, as COCOEvalCap.evaluate: PTBTokenizer, "
                                    "Bleu(4), Meteor (1.5), Rouge (ROUGE-L), Cider (CIDEr-D); x 100",
                 **({"target": target} if target else {})},
        wall_minutes_including_feature_extraction=minutes("started", "finished"),
        feature_extraction_minutes=minutes("started", "extracted"),
        train_minutes=round(meta["progress"]["train_seconds"] / 60, 2), steps=meta["progress"]["step"],
        epochs_completed=meta["progress"].get("epoch"),
        config=tomllib.loads((run / "config.toml").read_text(encoding="utf-8")),
        checkpoint=path.name, beam=args.beam, **others,
        decode_seconds_dev=round(seconds, 1), model=cfg.model.family,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
