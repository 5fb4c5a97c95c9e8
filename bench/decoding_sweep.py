"""Choose a speech run's decoding on its validation split, never on its test split: for each beam size and CTC share
(joint CTC/attention decoding, attnkit.decode.ctc) given, the chosen checkpoint transcribes the run's validation
utterances and jiwer scores them; the lowest CER is chosen, as the trainer chooses checkpoints. Writes
bench/results/decoding_sweep_<the run's config name>.json.

    python bench/decoding_sweep.py --run-dir runs/multi30k_speech_speech_transformer --beams 4 8 \
        --ctc-weights 0 0.05 0.1 0.15
"""

from __future__ import annotations

if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import json
import sys
from pathlib import Path

import attnkit
from attnkit.evaluate.results import write_results
from attnkit.evaluate.speech import speech_scores
from attnkit.train.speech import read_utterances


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--beams", type=int, nargs="+", required=True)
    ap.add_argument("--ctc-weights", type=float, nargs="+", required=True)
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    model = attnkit.load(Path(args.run_dir) / "checkpoints" / args.checkpoint)
    cfg = model.config
    valid = read_utterances(cfg, "valid", args.data_dir)
    rows = []
    for beam in args.beams:
        for weight in args.ctc_weights:
            hyps = model.transcribe(list(valid.audio), beam=beam, ctc_weight=weight)
            scores = {k: round(v, 2) for k, v in speech_scores(hyps, list(valid.transcripts)).items()}
            rows.append({"beam": beam, "ctc_weight": weight, **{f"valid_{k}": v for k, v in scores.items()}})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    chosen = min(rows, key=lambda r: (r["valid_cer"], r["valid_wer"]))
    write_results(
        f"bench/results/decoding_sweep_{cfg.name}.json", f"decoding_sweep_{cfg.name}",
        command="python bench/decoding_sweep.py " + " ".join(sys.argv[1:]),
        metrics={"rows": rows, "chosen": {"beam": chosen["beam"], "ctc_weight": chosen["ctc_weight"]},
                 "valid_utterances": len(valid.audio)},
        checkpoint=model.path.name, split="the run's validation split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
