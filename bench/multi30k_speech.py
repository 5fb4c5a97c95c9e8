"""Score a finished spoken-Multi30k run on test2016 and write bench/results/<name>.json.

test2016's 1,000 captions are scored twice: spoken in the training voices (each caption's voice, rate and pitch
drawn as in training, attnkit.data.spoken_multi30k) and all in the held-out voice, a voice never used in training,
with the same rates and pitches, so the two scores differ by the voice alone. The chosen checkpoint (``best`` by
validation CER) transcribes them with its config's beam and ``decode.ctc_weight`` (joint CTC/attention decoding,
attnkit.decode.ctc); jiwer scores CER and WER against the captions spelled in
LAS's characters; string accuracy is the share transcribed exactly. Missing test audio is synthesised first (once,
into the run's ``data.speech_cache``).

    python bench/multi30k_speech.py --run-dir runs/multi30k_speech_las --train-command "..." [--sentences 1000]
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
from attnkit.data.spoken_multi30k import HELD_OUT, spoken_captions
from attnkit.evaluate.results import write_results

# the targets on test2016 in the training voices, within 60 training minutes on the 2-core machine
TARGET = {"cer": 2.0, "wer": 6.0, "train_minutes": 60}


def score(model, utterances, beam: int | None, ctc_weight: float | None) -> tuple[dict, list[str]]:
    from attnkit.evaluate.speech import speech_scores

    hyps = model.transcribe(utterances.audio, beam=beam, ctc_weight=ctc_weight)
    return {k: round(v, 2) for k, v in speech_scores(hyps, utterances.transcripts).items()}, hyps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--train-command", required=True, help="the command that trained the run, recorded verbatim")
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--sentences", type=int, default=0, help="the first N test2016 captions (0: all 1,000)")
    ap.add_argument("--beam", type=int, default=None)
    ap.add_argument("--ctc-weight", type=float, default=None,
                    help="CTC's share of the search's scores (default: the run's decode.ctc_weight)")
    ap.add_argument("--data-dir")
    ap.add_argument("--out", help="default: bench/results/<the run's config name>.json")
    args = ap.parse_args()
    run = Path(args.run_dir)
    model = attnkit.load(run / "checkpoints" / args.checkpoint)
    cfg = model.config
    test = spoken_captions(cfg.data, "test", args.data_dir, limit=args.sentences)
    held = spoken_captions(cfg.data, HELD_OUT, args.data_dir, limit=args.sentences)
    test_scores, hyps = score(model, test, args.beam, args.ctc_weight)
    held_scores, held_hyps = score(model, held, args.beam, args.ctc_weight)
    metrics = {**{f"test_{k}": v for k, v in test_scores.items()},
               **{f"held_out_voice_{k}": v for k, v in held_scores.items()},
               "test_utterances": len(hyps), "test_words": sum(len(t.split()) for t in test.transcripts),
               "target": TARGET}
    print(json.dumps(metrics), file=sys.stderr)
    progress = json.loads((model.path / "meta.json").read_text())["progress"]
    last = json.loads((run / "checkpoints" / "last" / "meta.json").read_text())["progress"]
    d = cfg.data
    write_results(
        args.out or f"bench/results/{cfg.name}.json", cfg.name,
        command=f"{args.train_command} && python bench/multi30k_speech.py --run-dir {args.run_dir}" + "".join(
            f" --{name.replace('_', '-')} {value}" for name, value in vars(args).items()
            if name not in ("run_dir", "train_command", "out") and value != ap.get_default(name)),
        metrics=metrics, family=cfg.model.family, checkpoint=model.path.name, step=last["step"],
        epochs=last["epoch"], train_minutes=round(last["train_seconds"] / 60, 2), best_step=progress["step"],
        parameters=sum(p.numel() for p in model.module.parameters()), curve=curve(run),
        beam=args.beam or cfg.decode.beam_size,
        ctc_weight=cfg.decode.ctc_weight if args.ctc_weight is None else args.ctc_weight,
        split="Multi30k test2016 (test_2016_flickr)",
        voices=list(d.voices), held_out_voice=d.held_out_voice, speaking_rates=list(d.speaking_rates),
        pitches=list(d.pitches), renditions=d.renditions, synthesis_seed=d.synthesis_seed, sample_rate=d.sample_rate,
        examples=[{"reference": r, "hypothesis": h, "held_out_voice": g}
                  for r, h, g in list(zip(test.transcripts, hyps, held_hyps))[:10]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
