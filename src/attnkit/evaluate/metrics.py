"""The field's standard scores: sacreBLEU and chrF with their signatures, BLEU per length bucket."""

from __future__ import annotations

from dataclasses import dataclass

import sacrebleu


@dataclass
class Score:
    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def bleu(hypotheses: list[str], references: list[str] | list[list[str]]) -> Score:
    """Corpus sacreBLEU (13a tokenisation, mixed case) against one or more reference streams."""
    refs = [references] if references and isinstance(references[0], str) else references
    metric = sacrebleu.metrics.BLEU()
    result = metric.corpus_score(hypotheses, refs)
    return Score("BLEU", result.score, str(metric.get_signature()))


def chrf(hypotheses: list[str], references: list[str] | list[list[str]]) -> Score:
    refs = [references] if references and isinstance(references[0], str) else references
    metric = sacrebleu.metrics.CHRF()
    result = metric.corpus_score(hypotheses, refs)
    return Score("chrF2", result.score, str(metric.get_signature()))


def bleu_by_length(sources: list[str], hypotheses: list[str], references: list[str],
                   edges: tuple[int, ...] = (10, 20, 30, 40, 50)) -> list[dict]:
    """Corpus BLEU of the sentences whose source length (in whitespace words) falls in each bucket.

    Buckets are ``[0, e1), [e1, e2), ..., [e_last, inf)``; empty buckets are left out.
    """
    bounds = [0, *edges, 10**9]
    rows = []
    for lo, hi in zip(bounds, bounds[1:]):
        idx = [i for i, s in enumerate(sources) if lo <= len(s.split()) < hi]
        if idx:
            b = bleu([hypotheses[i] for i in idx], [references[i] for i in idx])
            rows.append({"min_len": lo, "max_len": None if hi == 10**9 else hi - 1, "n": len(idx),
                         "bleu": b.score})
    return rows


def caption_bleu(hypotheses: list[str], references: list[list[str]]) -> dict[str, float]:
    """Corpus BLEU-1..4 (0-100) of captions against all references of each image.

    Text is compared as given (already lowercased words, as ``attnkit.data.words`` makes it):
    sacreBLEU with ``tokenize="none"``, uniform n-gram weights up to n, no smoothing, and the
    closest reference length for the brevity penalty, as coco-caption computes it.
    references: one list per image (all of equal length; Flickr8k has 5).
    """
    n_refs = {len(r) for r in references}
    if len(n_refs) != 1:
        raise ValueError(f"every image needs the same number of references, got {sorted(n_refs)}")
    streams = [list(s) for s in zip(*references)]
    scores = {}
    for n in range(1, 5):
        metric = sacrebleu.metrics.BLEU(tokenize="none", max_ngram_order=n, smooth_method="none")
        scores[f"bleu{n}"] = metric.corpus_score(hypotheses, streams).score
    return scores
