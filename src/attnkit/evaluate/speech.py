"""Speech recognition scores from ``jiwer``: character and word error rates, and the share of utterances
transcribed exactly (a digit string's accuracy)."""

from __future__ import annotations


def speech_scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """CER and WER (jiwer's: edits over the references' characters / words, in percent) and ``string_accuracy``
    (percent of hypotheses equal to their reference) of hypotheses against references, one each."""
    import jiwer

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    # jiwer refuses an empty hypothesis only as a reference; an empty hypothesis is all deletions
    return {"cer": 100 * jiwer.cer(references, hypotheses), "wer": 100 * jiwer.wer(references, hypotheses),
            "string_accuracy": 100 * sum(h == r for h, r in zip(hypotheses, references)) / max(1, len(references))}
