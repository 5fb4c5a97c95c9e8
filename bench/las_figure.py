"""The README's LAS figure: one spoken digit string made of FSDD test recordings (never heard in training), its
log-mel spectrogram and each output character's attention over the listener's frames (the LAS paper's alignment
figure), from `make fsdd-digits`' LAS run.

    python bench/las_figure.py --run runs/fsdd_digits_las --out docs/figures/las_fsdd_attention.png
"""

from __future__ import annotations

import argparse
import sys

import attnkit
from attnkit.data.speech import digit_strings, fsdd_recordings, split_recordings
from attnkit.viz.attention import plot_speech_attention


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/fsdd_digits_las")
    ap.add_argument("--out", default="docs/figures/las_fsdd_attention.png")
    ap.add_argument("--string", type=int, default=0, help="which of the seeded strings")
    ap.add_argument("--digits", type=int, default=5, help="the string's digits")
    ap.add_argument("--data-dir")
    args = ap.parse_args()

    model = attnkit.load(args.run)
    # strings made as bench/fsdd_digits.py makes its test strings, of test recordings only, all of --digits digits
    test = digit_strings(split_recordings(fsdd_recordings(args.data_dir), "test"), 1 + args.string, seed=1,
                         split="test", min_digits=args.digits, max_digits=args.digits)
    clip, reference = test.audio[args.string], test.transcripts[args.string]
    (transcript,) = model.transcribe([clip], details=True)
    hyp = transcript.hypotheses[0]
    plot_speech_attention(model.kind.features(model, clip).numpy(),
                          list(model.tokenizers.id_to_piece(hyp.tokens)) + ["<end>"], hyp.attention,
                          model.module.time_reduction, args.out)
    print(f"{args.out}: reference {reference!r}, transcript {transcript.text[0]!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
