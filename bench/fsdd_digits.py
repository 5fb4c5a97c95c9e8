"""Score a finished spoken-digit-string run on test strings of unseen recordings and write
bench/results/<name>.json.

The test strings are made of FSDD's test recordings only (index 0-4 of every digit and speaker; with
``data.held_out_speaker`` all of that speaker's recordings), never heard in training (attnkit.data.speech). The
chosen checkpoint (``best`` by validation CER) transcribes them with its config's beam and ``decode.ctc_weight``
(joint CTC/attention decoding, attnkit.decode.ctc); jiwer scores CER and WER,
and the digit error rate is the WER (each digit is a word); string accuracy is the share transcribed exactly.

    python bench/fsdd_digits.py --run-dir runs/fsdd_digits_las --train-command "..." [--strings 500]
"""

from __future__ import annotations

if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import json
import sys
from pathlib import Path

from language_model import curve  # bench/: the validation curve, as the other recipes record theirs

import attnkit
from attnkit.data.speech import digit_strings, fsdd_recordings, split_recordings
from attnkit.evaluate.results import write_results

# the targets on test strings of unseen recordings, within 20 training minutes on the 2-core machine
TARGET = {"digit_error_rate": 1.0, "string_accuracy": 95.0, "train_minutes": 20,
          "source": "classic connected-digit systems on TIDIGITS, about 0.5% word error"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--train-command", required=True, help="the command that trained the run, recorded verbatim")
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--strings", type=int, default=500, help="test strings (seeded: always the same ones)")
    ap.add_argument("--beam", type=int, default=None)
    ap.add_argument("--ctc-weight", type=float, default=None,
                    help="CTC's share of the search's scores (default: the run's decode.ctc_weight)")
    ap.add_argument("--data-dir")
    ap.add_argument("--out", help="default: bench/results/<the run's config name>.json")
    args = ap.parse_args()
    run = Path(args.run_dir)
    model = attnkit.load(run / "checkpoints" / args.checkpoint)
    cfg = model.config
    held_out = cfg.data.held_out_speaker
    test = digit_strings(split_recordings(fsdd_recordings(args.data_dir), "test", held_out), args.strings, seed=0,
                         split="test", max_digits=cfg.data.max_digits)
    from attnkit.evaluate.speech import speech_scores

    hyps = model.transcribe(test.audio, beam=args.beam, ctc_weight=args.ctc_weight)
    scores = speech_scores(hyps, test.transcripts)
    metrics = {"test_cer": round(scores["cer"], 2), "test_digit_error_rate": round(scores["wer"], 2),
               "test_string_accuracy": round(scores["string_accuracy"], 2), "test_strings": len(hyps),
               "test_digits": sum(len(t.split()) for t in test.transcripts), "target": TARGET}
    print(json.dumps(metrics), file=sys.stderr)
    progress = json.loads((model.path / "meta.json").read_text())["progress"]
    last = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["progress"]
    name = cfg.name + (f"_heldout_{held_out}" if held_out and held_out not in cfg.name else "")
    write_results(
        args.out or f"bench/results/{name}.json", name,
        command=f"{args.train_command} && python bench/fsdd_digits.py --run-dir {args.run_dir}" + "".join(
            f" --{name.replace('_', '-')} {value}" for name, value in vars(args).items()
            if name not in ("run_dir", "train_command", "out") and value != ap.get_default(name)),
        metrics=metrics, family=cfg.model.family, checkpoint=model.path.name, step=last["step"],
        epochs=last["epoch"], train_minutes=round(last["train_seconds"] / 60, 2), best_step=progress["step"],
        parameters=sum(p.numel() for p in model.module.parameters()), curve=curve(run),
        held_out_speaker=held_out or None, beam=args.beam or cfg.decode.beam_size,
        ctc_weight=cfg.decode.ctc_weight if args.ctc_weight is None else args.ctc_weight,
        split="FSDD test recordings (index 0-4)" if not held_out else f"all recordings of {held_out}",
        examples=[{"reference": r, "hypothesis": h} for r, h in list(zip(test.transcripts, hyps))[:10]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
