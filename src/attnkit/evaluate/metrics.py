"""The field's standard scores: sacreBLEU and chrF with their signatures, BLEU per length bucket; the BLEU that
translation papers print (multi-bleu.perl's); the COCO caption evaluation.

Each score comes from the field's own library (sacreBLEU, sacremoses, pycocoevalcap); the functions here only
fix the protocol around it, which their docstrings state.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from importlib.metadata import version

import sacrebleu

from attnkit.errors import AttnkitError


@dataclass
class Score:
    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def bleu(hypotheses: list[str], references: list[str] | list[list[str]], lowercase: bool = False) -> Score:
    """Corpus sacreBLEU (13a tokenisation, mixed case; ``lowercase``: both sides lowercased, for a model that writes
    lowercased text, its signature saying ``case:lc``) against one or more reference streams."""
    refs = [references] if references and isinstance(references[0], str) else references
    metric = sacrebleu.metrics.BLEU(lowercase=lowercase)
    result = metric.corpus_score(hypotheses, refs)
    return Score("BLEU", result.score, str(metric.get_signature()))


def chrf(hypotheses: list[str], references: list[str] | list[list[str]], lowercase: bool = False) -> Score:
    """Corpus chrF2 (``lowercase`` as :func:`bleu`'s)."""
    refs = [references] if references and isinstance(references[0], str) else references
    metric = sacrebleu.metrics.CHRF(lowercase=lowercase)
    result = metric.corpus_score(hypotheses, refs)
    return Score("chrF2", result.score, str(metric.get_signature()))


@dataclass
class PaperBleu:
    """Corpus BLEU with the parts multi-bleu.perl and fairseq-generate print beside it."""

    score: float
    precisions: list[float]  # the 1..4-gram precisions, in percent
    bp: float  # the brevity penalty
    hyp_len: int
    ref_len: int
    signature: str

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (f"BLEU4 = {self.score:.2f}, {p} (BP={self.bp:.3f}, ratio={self.hyp_len / max(self.ref_len, 1):.3f}, "
                f"hyp_len={self.hyp_len}, ref_len={self.ref_len})  ({self.signature})")


@functools.cache
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer  # imported here: loading a model for inference needs none of it

    return MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str) -> str:
    """``text`` lowercased, then tokenised and escaped as Moses' tokenizer.perl -l ``lang`` does (sacremoses).

    ``MosesTokenizer(lang).tokenize(text.lower(), escape=True, return_str=True)``: punctuation split off, ``&``
    written ``&amp;``, ``'`` ``&apos;`` (English keeps it on the suffix, ``dog &apos;s``; German splits it off,
    ``geht &apos; s``), and ``| < > " [ ]`` escaped likewise.
    """
    return _moses_tokenizer(lang).tokenize(text.lower(), escape=True, return_str=True)


def paper_bleu(hypotheses: list[str], references: list[str] | list[list[str]], lang: str = "de") -> PaperBleu:
    """The BLEU that translation papers print: corpus BLEU-4 of lowercased, Moses-tokenised text.

    What multi-bleu.perl and fairseq-generate compute on the tokenised files of the usual pipelines (Multi30k's
    published Transformer and RNN baselines among them), and not cased sacreBLEU, which detokenised
    hypotheses are scored with by :func:`bleu`. The protocol:

    1. every hypothesis and reference through :func:`moses_tokenize` (lowercased, then sacremoses
       ``MosesTokenizer(lang).tokenize(text, escape=True, return_str=True)``) for the target language ``lang``;
    2. corpus BLEU over those whitespace tokens with no further tokenisation:

           BLEU = BP * exp(sum_{n=1..4} log(p_n) / 4),   BP = min(1, exp(1 - r / c))

       p_n the clipped n-gram matches over the hypotheses' n-grams, summed over the corpus; c the hypotheses'
       length, r the closest reference length of each sentence (the shorter on a tie), summed. No smoothing:
       an order without a match makes BLEU 0, as in multi-bleu.perl. The arithmetic is sacreBLEU's
       (``tokenize="none"``, ``smooth_method="none"``, ``force=True``: the input is tokenised on purpose).
    """
    refs = [references] if references and isinstance(references[0], str) else references
    hyps = [moses_tokenize(h, lang) for h in hypotheses]
    refs = [[moses_tokenize(r, lang) for r in stream] for stream in refs]
    metric = sacrebleu.metrics.BLEU(lowercase=True, tokenize="none", smooth_method="none", force=True)
    result = metric.corpus_score(hyps, refs)
    signature = f"lc+moses:{lang}+escape|sacremoses:{version('sacremoses')}|{metric.get_signature()}"
    return PaperBleu(result.score, list(result.precisions), result.bp, result.sys_len, result.ref_len, signature)


def bleu_by_length(sources: list[str], hypotheses: list[str], references: list[str],
                   edges: tuple[int, ...] = (10, 20, 30, 40, 50), lowercase: bool = False) -> list[dict]:
    """Corpus BLEU (:func:`bleu`, ``lowercase`` as there) of the sentences whose source length (in whitespace words)
    falls in each bucket.

    Buckets are ``[0, e1), [e1, e2), ..., [e_last, inf)``; empty buckets are left out.
    """
    bounds = [0, *edges, 10**9]
    rows = []
    for lo, hi in zip(bounds, bounds[1:]):
        idx = [i for i, s in enumerate(sources) if lo <= len(s.split()) < hi]
        if idx:
            b = bleu([hypotheses[i] for i in idx], [references[i] for i in idx], lowercase)
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


def coco_caption_scores(hypotheses: list[str], references: list[list[str]]) -> dict[str, float]:
    """The COCO caption evaluation (pycocoevalcap, the coco-caption code behind Show, Attend and Tell's tables):
    BLEU-1..4, METEOR, ROUGE-L and CIDEr, 0-100, of one caption per image against all of that image's references.

    As ``COCOEvalCap.evaluate`` does it: every caption tokenised by its ``PTBTokenizer`` (Stanford CoreNLP's
    PTB tokenizer, lowercased, punctuation dropped), then each scorer's ``compute_score(references,
    hypotheses)``: ``Bleu(4)`` (corpus BLEU, closest reference length), ``Meteor()`` (METEOR 1.5, English,
    normalised), ``Rouge()`` (ROUGE-L: the mean over images of the F-measure, beta = 1.2, of the best
    longest-common-subsequence precision and recall against the references), ``Cider()``
    (CIDEr-D: the mean over images of the tf-idf n-gram cosine similarity, n = 1..4, with document frequencies
    from these references and a Gaussian length penalty, x 10). SPICE is left out.
    The tokenizer and METEOR run on Java (``make java``).
    """
    if shutil.which("java") is None:
        raise AttnkitError("the COCO caption evaluation needs Java (pycocoevalcap's PTB tokenizer and METEOR run "
                           "on it): `make java` installs Debian's default-jre-headless")
    try:
        from pycocoevalcap.bleu.bleu import Bleu
        from pycocoevalcap.cider.cider import Cider
        from pycocoevalcap.meteor.meteor import Meteor
        from pycocoevalcap.rouge.rouge import Rouge
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    except ImportError:
        raise AttnkitError("the COCO caption evaluation needs pycocoevalcap: pip install 'attnkit[caption]'") from None
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} captions for {len(references)} images")
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": c} for c in refs] for i, refs in enumerate(references)})
    res = tokenizer.tokenize({i: [{"caption": h}] for i, h in enumerate(hypotheses)})
    bleu_n, _ = Bleu(4).compute_score(gts, res, verbose=0)
    meteor = Meteor()
    scores = {**{f"bleu{n}": 100 * b for n, b in enumerate(bleu_n, 1)},
              "meteor": 100 * meteor.compute_score(gts, res)[0],
              "rouge_l": 100 * Rouge().compute_score(gts, res)[0],
              "cider": 100 * Cider().compute_score(gts, res)[0]}
    del meteor  # its __del__ ends the Java process
    return scores


def classification_scores(predictions: list[int], golds: list[int], n_labels: int) -> dict[str, float]:
    """GLUE's scores of predicted class ids against the gold ones, from scikit-learn: accuracy, F1 (of class 1
    for two classes, as GLUE scores MRPC's paraphrases; else the macro average), and Matthews' correlation
    coefficient (CoLA's, fair to imbalanced sets). Percentages, as the papers print them (MCC times 100 too)."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    if not golds:
        raise AttnkitError("no examples to score")
    labels = list(range(n_labels))
    f1 = (f1_score(golds, predictions, pos_label=1, average="binary", labels=labels, zero_division=0.0)
          if n_labels == 2 else f1_score(golds, predictions, average="macro", labels=labels, zero_division=0.0))
    return {"accuracy": 100 * float(accuracy_score(golds, predictions)), "f1": 100 * float(f1),
            "matthews": 100 * float(matthews_corrcoef(golds, predictions))}


def answer_scores(predictions: list, golds: list, types: list[str]) -> dict[str, float]:
    """VQA's accuracy of predicted answers against the gold ones, overall (``accuracy``) and per question type
    (``accuracy_<type>``, the type's spaces and slashes as underscores: ``accuracy_yes_no``), in percent, from
    scikit-learn."""
    from sklearn.metrics import accuracy_score

    if not golds:
        raise AttnkitError("no examples to score")
    scores = {"accuracy": 100 * float(accuracy_score(golds, predictions))}
    for kind in sorted(set(types)):
        rows = [i for i, t in enumerate(types) if t == kind]
        name = "".join(c if c.isalnum() else "_" for c in kind)
        scores[f"accuracy_{name}"] = 100 * float(accuracy_score([golds[i] for i in rows],
                                                                [predictions[i] for i in rows]))
    return scores


def regression_scores(predictions: list[float], golds: list[float]) -> dict[str, float]:
    """STS-B's scores of predicted against gold similarities, from SciPy: Pearson's and Spearman's correlation,
    times 100 as GLUE prints them (0 where the predictions are constant: no correlation is defined)."""
    import numpy as np
    from scipy.stats import pearsonr, spearmanr

    if len(golds) < 2:
        raise AttnkitError(f"{len(golds)} examples: a correlation needs at least 2")
    p, g = np.asarray(predictions, dtype=np.float64), np.asarray(golds, dtype=np.float64)
    if np.ptp(p) == 0 or np.ptp(g) == 0:
        return {"pearson": 0.0, "spearman": 0.0}
    return {"pearson": 100 * float(pearsonr(p, g).statistic), "spearman": 100 * float(spearmanr(p, g).statistic)}
