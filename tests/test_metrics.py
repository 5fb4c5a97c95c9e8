"""Scores beside sacreBLEU: the papers' BLEU (lowercased, Moses-tokenised) against n-grams counted by hand, and
the COCO caption evaluation against pycocoevalcap's own COCOEvalCap."""

from __future__ import annotations

import importlib.util
import math
import shutil
from pathlib import Path

import pytest

from attnkit.errors import AttnkitError
from attnkit.evaluate import bleu, caption_bleu, coco_caption_scores, moses_tokenize, paper_bleu
from attnkit.evaluate import metrics as metrics_module

# --- the papers' BLEU

HYPS = ["ein Hund läuft im Park.", "Die Kinder spielen.", "Geht's dem Hund & der Katze gut?"]
REFS = ["Ein Hund rennt im Park.", "Die Kinder spielen draußen.", "Geht's dem Hund & der Katze gut?"]


def test_moses_tokenize_lowercases_splits_and_escapes_as_tokenizer_perl():
    assert moses_tokenize("ein Hund läuft im Park.", "de") == "ein hund läuft im park ."
    # German splits the apostrophe off on both sides; English keeps it on the suffix
    assert moses_tokenize("Geht's dem Hund & der Katze gut?", "de") == "geht &apos; s dem hund &amp; der katze gut ?"
    assert (moses_tokenize('A dog\'s toy & a "ball" [red] <x> | y.', "en")
            == "a dog &apos;s toy &amp; a &quot; ball &quot; &#91; red &#93; &lt; x &gt; &#124; y .")


def test_paper_bleu_equals_the_hand_counted_ngrams():
    # after lowercasing and Moses (de), hypothesis | reference, and the clipped matches of n = 1..4:
    # 1: ein hund läuft im park .  | ein hund rennt im park .
    #    5/6 (all but läuft), 3/5 (ein hund, im park, park .), 1/4 (im park .), 0/3
    # 2: die kinder spielen .  | die kinder spielen draußen .
    #    4/4, 2/3 (die kinder, kinder spielen), 1/2 (die kinder spielen), 0/1
    # 3: geht &apos; s dem hund &amp; der katze gut ?  (10 tokens, the same as its reference)
    #    10/10, 9/9, 8/8, 7/7
    # corpus: 19/20, 14/17, 10/14, 7/11; hypotheses 20 tokens, references 6 + 5 + 10 = 21
    p = [19 / 20, 14 / 17, 10 / 14, 7 / 11]
    bp = math.exp(1 - 21 / 20)
    expected = 100 * bp * math.exp(sum(math.log(x) for x in p) / 4)
    result = paper_bleu(HYPS, REFS, "de")
    assert result.score == pytest.approx(expected, abs=1e-9)
    assert result.precisions == pytest.approx([100 * x for x in p], abs=1e-9)
    assert result.bp == pytest.approx(bp, abs=1e-12)
    assert (result.hyp_len, result.ref_len) == (20, 21)
    assert str(result).startswith(f"BLEU4 = {expected:.2f}, 95.0/82.4/71.4/63.6 (BP=0.951, ratio=0.952, "
                                  "hyp_len=20, ref_len=21)  (lc+moses:de+escape|sacremoses:")
    assert "tok:none" in result.signature and "smooth:none" in result.signature
    # a list of reference streams is the same as one stream
    assert paper_bleu(HYPS, [REFS], "de").score == result.score


def test_lowercased_sacrebleu_and_chrf_ignore_case_and_say_so():
    """A model that writes lowercased text (data.lowercase) is scored with sacreBLEU's own lowercase option."""
    from attnkit.evaluate import chrf

    hyps = [h.lower() for h in REFS]
    assert bleu(hyps, REFS, lowercase=True).score == pytest.approx(100.0)
    assert chrf(hyps, REFS, lowercase=True).score == pytest.approx(100.0)
    assert bleu(hyps, REFS).score < 100.0 and chrf(hyps, REFS).score < 100.0
    assert "case:lc" in bleu(hyps, REFS, lowercase=True).signature
    assert "case:mixed" in bleu(hyps, REFS).signature


def test_paper_bleu_is_not_smoothed():
    """The first two pairs have no 4-gram match: multi-bleu.perl prints 0, whatever the other precisions."""
    result = paper_bleu(HYPS[:2], REFS[:2], "de")
    assert result.score == 0.0
    assert result.precisions == pytest.approx([100 * 9 / 10, 100 * 5 / 8, 100 * 2 / 6, 0.0], abs=1e-9)


def test_case_and_moses_tokens_are_what_the_papers_bleu_forgives():
    hyp, ref = ["EIN HUND & EINE KATZE ."], ["Ein Hund&eine Katze."]
    assert moses_tokenize(hyp[0], "de") == moses_tokenize(ref[0], "de") == "ein hund &amp; eine katze ."
    assert paper_bleu(hyp, ref, "de").score == pytest.approx(100.0)
    assert bleu(hyp, ref).score < 50  # cased sacreBLEU (13a) sees other words


# --- the COCO caption evaluation

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no Java: `make java` installs Debian's "
                                "default-jre-headless (pycocoevalcap's PTB tokenizer and METEOR run on it)")
# the tests that run METEOR are marked slow: its Java process first loads a paraphrase table (about 10 s a score)

CAPTIONS = ["A dog runs across the green grass.", "Two men are playing soccer."]
REFERENCES = [["A dog runs across the grass.", "A brown dog is running on a lawn.", "The dog runs on green grass."],
              ["Two men play soccer in a field.", "Men are playing football on a field.", "Two people kick a ball."]]
COCO_NAMES = {"bleu1": "Bleu_1", "bleu2": "Bleu_2", "bleu3": "Bleu_3", "bleu4": "Bleu_4", "meteor": "METEOR",
              "rouge_l": "ROUGE_L", "cider": "CIDEr"}


class _NoSpice:
    """SPICE downloads Stanford CoreNLP models on first use: COCOEvalCap's other scores are compared without it."""

    def compute_score(self, gts, res):
        return 0.0, [0.0] * len(gts)

    def method(self):
        return "SPICE"


@pytest.mark.slow
@needs_java
def test_coco_caption_scores_equal_cocoevalcap(monkeypatch):
    pytest.importorskip("pycocoevalcap")
    import pycocoevalcap.eval
    from pycocotools.coco import COCO

    ours = coco_caption_scores(CAPTIONS, REFERENCES)
    # COCOEvalCap as its example runs it: a COCO object of the references, loadRes of the results
    coco = COCO()
    coco.dataset = {"images": [{"id": i} for i in range(len(REFERENCES))],
                    "annotations": [{"image_id": i, "id": 10 * i + j, "caption": c}
                                    for i, refs in enumerate(REFERENCES) for j, c in enumerate(refs)]}
    coco.createIndex()
    results = coco.loadRes([{"image_id": i, "caption": c} for i, c in enumerate(CAPTIONS)])
    monkeypatch.setattr(pycocoevalcap.eval, "Spice", _NoSpice)
    evaluation = pycocoevalcap.eval.COCOEvalCap(coco, results)
    evaluation.evaluate()
    assert set(ours) == set(COCO_NAMES)
    for ours_name, theirs_name in COCO_NAMES.items():
        assert ours[ours_name] == pytest.approx(100 * evaluation.eval[theirs_name], abs=1e-9), ours_name
    assert 0 < ours["bleu4"] < ours["bleu1"] < 100 and 0 < ours["meteor"] < 100 and ours["cider"] > 0
    # on lowercased words without punctuation (what the PTB tokenizer makes of them) coco-caption's BLEU is the
    # corpus BLEU attnkit reports beside it (caption_bleu, equal to NLTK's), up to the 1e-15 coco-caption adds to
    # every match count (where an order has no match at all its BLEU is about 0.01, not 0: these captions have one)
    words = [" ".join(c.lower().rstrip(".").split()) for c in CAPTIONS]
    word_refs = [[" ".join(r.lower().rstrip(".").split()) for r in refs] for refs in REFERENCES]
    nltk_like = caption_bleu(words, word_refs)
    for n in range(1, 5):
        assert ours[f"bleu{n}"] == pytest.approx(nltk_like[f"bleu{n}"], abs=1e-4), n


@pytest.mark.slow
@needs_java
def test_a_reference_scores_higher_than_its_words_shuffled():
    pytest.importorskip("pycocoevalcap")
    exact = [refs[0] for refs in REFERENCES]
    # the same words, other n-grams (no final period: the PTB tokenizer would read "A." as an initial)
    shuffled = [" ".join(reversed(c.rstrip(".").split())) for c in exact]
    a, b = coco_caption_scores(exact, REFERENCES), coco_caption_scores(shuffled, REFERENCES)
    assert a["bleu4"] == pytest.approx(100.0, abs=1e-4)
    assert a["bleu1"] == pytest.approx(b["bleu1"], abs=1e-4)  # unigrams do not see the order
    for name in ("bleu2", "bleu3", "bleu4", "meteor", "rouge_l", "cider"):
        assert a[name] > b[name], name


def test_coco_caption_scores_without_java_name_the_make_target(monkeypatch):
    monkeypatch.setattr(metrics_module.shutil, "which", lambda name: None)
    with pytest.raises(AttnkitError, match="make java"):
        coco_caption_scores(CAPTIONS, REFERENCES)


def test_flickr8k_bench_scores_words_and_hands_the_raw_captions_to_coco(monkeypatch):
    path = Path(__file__).resolve().parents[1] / "bench" / "flickr8k_captioning.py"
    spec = importlib.util.spec_from_file_location("flickr8k_captioning", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = []
    monkeypatch.setattr(bench, "coco_caption_scores", lambda c, r: seen.append((c, r)) or {"cider": 12.3456})
    captions = ["a dog runs on the grass", "two men are playing soccer"]
    scores = bench.caption_scores(captions, REFERENCES)
    assert seen == [(captions, REFERENCES)]  # the references as written: the PTB tokenizer does its own
    word_refs = [[" ".join(r.lower().rstrip(".").split()) for r in refs] for refs in REFERENCES]
    assert scores == {**caption_bleu(captions, word_refs), "coco": {"cider": 12.3456}}
    assert bench.rounded(scores)["coco"] == {"cider": 12.35}
