"""The vocabulary shortlist: a shortlisted step is the core's distribution renormalized over the shortlist, a search
over it equals the core's search with every other token masked out (eager, int8 and ahead of time, one graph for
every shortlist length), the vocabulary map reads and writes CTranslate2's format, IBM Model 1 matches NLTK's, and
``attnkit shortlist`` / ``translate --shortlist`` work from the command line."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from attnkit.decode import beam_search, greedy, max_lengths
from attnkit.errors import AttnkitError
from attnkit.fast import FastDecoder
from attnkit.fast.precision import at_precision, check_precision
from attnkit.fast.shortlist import output_rows, shortlisted_logits, shortlisted_output
from attnkit.models import PAD
from attnkit.models.contract import DecodingState
from attnkit.tokens import EOS
from conftest import random_src, toy_trained_model

VOCAB = 23
SHORTLIST = torch.tensor([0, 1, 2, 3, 5, 7, 8, 11, 12, 13, 17, 19, 20, 22])  # specials first, then some tokens


def _precision_or_skip(precision: str = "int8"):
    try:
        check_precision(precision)
    except AttnkitError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def model():
    return toy_trained_model(vocab=VOCAB, steps=60)


class MaskedCore:
    """The core model's decoding with every token outside ``ids`` given probability 0: the reference a shortlisted
    search must equal (log-probabilities over the whole vocabulary, renormalized over ``ids``)."""

    def __init__(self, model, ids):
        self.model = model
        self.outside = torch.ones(model.output.out_features, dtype=torch.bool)
        self.outside[ids] = False

    def __getattr__(self, name):
        return getattr(self.model, name)

    def step(self, tokens, state, need_weights=False):
        log_probs, state, attn = self.model.step(tokens, state, need_weights)
        return log_probs.masked_fill(self.outside, float("-inf")).log_softmax(-1), state, attn

    def search_steps(self):
        return {}

    def greedy_search(self, *args):
        return None

    def beam_search(self, *args):
        return None


def _decode(model, src, beam: int, ids=None):
    lens = max_lengths(src.ne(PAD).sum(1), 1.0, 4)
    state = model.init_state(model.encode(src))
    if ids is not None:
        state = model.restrict_vocabulary(state, ids)
    if beam == 1:
        return [[h] for h in greedy(model, state, lens)]
    return beam_search(model, state, lens, beam_size=beam)


def _assert_same(found, expected, abs: float = 1e-4):
    assert [h[0].tokens for h in found] == [h[0].tokens for h in expected]
    assert [h[0].score for h in found] == pytest.approx([h[0].score for h in expected], abs=abs)


@torch.no_grad()
def test_a_shortlisted_step_is_the_core_distribution_renormalized_over_the_shortlist(model):
    decoder = FastDecoder(model)
    src = random_src([5, 3, 7], VOCAB, seed=1)
    tokens = torch.tensor([2, 2, 2])
    core, _, _ = model.step(tokens, model.init_state(model.encode(src)))
    state = decoder.restrict_vocabulary(decoder.init_state(decoder.encode(src)), SHORTLIST)
    assert torch.equal(state.vocabulary, SHORTLIST)
    shortlisted, after, _ = decoder.step(tokens, state)
    assert shortlisted.shape == (3, len(SHORTLIST))
    torch.testing.assert_close(shortlisted, core[:, SHORTLIST].log_softmax(-1), atol=1e-5, rtol=0)
    assert torch.equal(after.vocabulary, SHORTLIST)  # the next state keeps it, as does every selection of rows
    assert torch.equal(after.select(torch.tensor([2, 0])).repeat_beams(2).vocabulary, SHORTLIST)


@torch.no_grad()
@pytest.mark.parametrize("beam", [1, 3])
def test_a_shortlisted_search_equals_the_core_search_with_every_other_token_masked(model, beam):
    src = random_src([5, 3, 7, 4], VOCAB, seed=1)
    found = _decode(FastDecoder(model), src, beam, SHORTLIST)
    _assert_same(found, _decode(MaskedCore(model, SHORTLIST), src, beam))
    assert all(set(h.tokens) <= set(SHORTLIST.tolist()) for hyps in found for h in hyps)
    # the whole vocabulary as a shortlist decodes as without one
    _assert_same(_decode(FastDecoder(model), src, beam, torch.arange(VOCAB)), _decode(FastDecoder(model), src, beam))


def _logits(output, h, ids=SHORTLIST):
    return shortlisted_logits(h, *shortlisted_output(output_rows(output), ids))


@torch.no_grad()
def test_the_output_rows_of_each_layer_kind_give_its_own_logits_over_the_shortlist(model):
    from attnkit.fast.compile import _OutputProjection  # the compiled decoder's layout: [d_model, V]

    h = torch.randn(6, model.output.in_features)
    torch.testing.assert_close(_logits(model.output, h), model.output(h)[:, SHORTLIST], atol=1e-5, rtol=0)
    torch.testing.assert_close(_logits(_OutputProjection(model.output), h), model.output(h)[:, SHORTLIST], atol=1e-5,
                               rtol=0)
    with pytest.raises(ValueError, match="special tokens first"):
        _logits(model.output, h, torch.tensor([3, 5, 7, 9]))


@torch.no_grad()
def test_int8_shortlisted_logits_are_int8_logits_of_the_shortlist_exactly(model):
    """Activations are quantized per row, whatever columns are kept: the int8 product over the shortlist's weight
    rows is the int8 layer's output at those columns, to the bit."""
    _precision_or_skip("int8")
    output = at_precision(model, "int8").output
    h = torch.randn(5, output.in_features)
    assert torch.equal(_logits(output, h), output(h)[:, SHORTLIST])


@torch.no_grad()
@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("beam", [1, 3])
def test_a_lower_precision_shortlisted_search_equals_its_search_with_every_other_token_masked(model, precision, beam):
    _precision_or_skip(precision)
    lower = at_precision(model, precision)
    src = random_src([5, 3, 7, 4], VOCAB, seed=2)
    _assert_same(_decode(FastDecoder(lower), src, beam, SHORTLIST), _decode(MaskedCore(lower, SHORTLIST), src, beam),
                 abs=1e-4 if precision == "int8" else 2e-2)


@torch.no_grad()
def test_sampling_refuses_a_shortlist(model):
    from attnkit.decode import sample

    decoder = FastDecoder(model)
    src = random_src([4], VOCAB)
    state = decoder.restrict_vocabulary(decoder.init_state(decoder.encode(src)), SHORTLIST)
    with pytest.raises(ValueError, match="not sampling"):
        sample(decoder, state, torch.tensor([5]), temperature=1.0)


def test_a_model_without_a_shortlisted_decoder_says_so_in_one_line(model):
    with pytest.raises(AttnkitError, match="no vocabulary shortlist"):
        model.restrict_vocabulary(DecodingState(), SHORTLIST)


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_ahead_of_time_shortlisted_steps_equal_eager_ones_with_one_graph_for_every_shortlist(model, precision):
    """Packages of shortlisted greedy steps (the shortlist and its output rows are inputs of the graph, their length
    a symbol) decode as the eager shortlisted steps do, batches step by step and one sentence in one loop over its
    package, at several shortlists, each kind built once, and never the torch.compile fallback.

    One compiled check per path: a shortlist's graphs are a batch's (the library's products) and, at fp32, one
    sentence's (every size fixed but the lengths, the shortlist's among them); beam search's graphs have their own
    check (test_aot.py), and a shortlisted beam search its eager one (above)."""
    from attnkit.fast import compile_step

    if precision == "int8":
        _precision_or_skip("int8")
    base = at_precision(model, precision)
    decoder = compile_step(base, freeze=True, check=False)
    # the encoder eager (sealed: it compiles no package): the shortlist is a state of the steps alone, and the
    # encoder's packages, a third of what this test would compile, have their own checks (test_aot.py at fp32,
    # test_precision.py at int8)
    decoder._aot_encoder.sealed = True
    eager = FastDecoder(base)
    other = torch.tensor([0, 1, 2, 3, 4, 6, 9, 10, 14, 15, 16, 18, 21])
    # one sentence (graphs of its own) at fp32; int8 runs batches, the same graph around its integer product (each
    # graph takes tens of seconds to compile, and make test holds the suite under ten minutes)
    batches = [([5, 3, 7, 4], 1), ([6, 2, 5], 2), *([([6], 4)] if precision == "fp32" else [])]
    for lengths, seed in batches:
        src = random_src(lengths, VOCAB, seed=seed)
        for ids in (SHORTLIST, other, torch.arange(VOCAB)):
            for _ in range(2):  # the first call of a kind builds its package (eagerly); the second runs it
                _assert_same(_decode(decoder, src, 1, ids), _decode(eager, src, 1, ids))
    steps = decoder.search_steps()
    built = {name: dict(step.packages) for name, step in steps.items()}
    assert len(built["greedy_step"]) == (2 if precision == "fp32" else 1) and not built["beam_step"]
    for lengths in ([4, 6, 2, 5, 3], *([[7]] if precision == "fp32" else [])):
        src = random_src(lengths, VOCAB, seed=3)
        _assert_same(_decode(decoder, src, 1, other[:9]), _decode(eager, src, 1, other[:9]))
    assert {name: dict(step.packages) for name, step in steps.items()} == built  # no new graph
    assert all(package is not None for packages in built.values() for package in packages.values())
    assert decoder._aot_encoder.packages == {}


# --- the vocabulary map

class FakeTokenizer:
    """Pieces 0..n-1 named as SentencePiece names them: <pad>, <unk>, <s>, </s>, then p4, p5, ..."""

    def __init__(self, n: int):
        self.pieces = ["<pad>", "<unk>", "<s>", "</s>", *(f"p{i}" for i in range(4, n))]
        self.vocab_size = n
        self.sp = self

    def piece_to_id(self, piece: str) -> int:
        return self.pieces.index(piece) if piece in self.pieces else 1

    def id_to_piece(self, ids):
        return self.pieces[ids] if isinstance(ids, int) else [self.pieces[int(i)] for i in ids]


def test_a_vocabulary_map_reads_ctranslate2s_format_and_gives_each_batch_its_candidates(tmp_path):
    from attnkit.data.shortlist import MULTIPLE, VocabularyMap

    source, target = FakeTokenizer(40), FakeTokenizer(60)
    path = tmp_path / "vmap.txt"
    path.write_text("\tp4 p5\np10\tp20 p21\np10 p11\tp30\np12\tp22\np99\tp23\n\n", encoding="utf-8")
    vmap = VocabularyMap.read(path, source, target)
    assert vmap.always.tolist() == [4, 5]
    assert set(vmap.rules) == {(10,), (10, 11), (12,)}  # p99 is no source piece: its rule never applies
    ids = vmap.candidates([[10, 11, 3], [7, 3]]).tolist()
    assert ids[:4] == [0, 1, 2, 3] and ids == sorted(ids) and len(ids) % MULTIPLE == 0
    assert {4, 5, 20, 21, 30} <= set(ids) and 22 not in ids
    assert set(ids) - {0, 1, 2, 3, 4, 5, 20, 21, 30} == set(range(6, 13))  # padded to 16 with the lowest ids not in it
    assert vmap.candidates([[12]]).tolist() == [0, 1, 2, 3, 4, 5, 6, 22]
    again = tmp_path / "again.txt"
    vmap.write(again, source, target)
    reread = VocabularyMap.read(again, source, target)
    assert reread.always.tolist() == [4, 5]
    assert {k: v.tolist() for k, v in reread.rules.items()} == {k: v.tolist() for k, v in vmap.rules.items()}


def test_a_shortlist_is_padded_within_the_vocabulary_only():
    from attnkit.data.shortlist import VocabularyMap

    assert VocabularyMap({(5,): np.array([6, 8])}, np.array([4]), 10).candidates([[5]]).tolist() == \
        [0, 1, 2, 3, 4, 5, 6, 8]
    assert VocabularyMap({(5,): np.array([6])}, np.array([4]), 7).candidates([[5]]).tolist() == list(range(7))


@pytest.mark.parametrize("text, problem", [("p10 p20\n", ":1: expected '<source n-gram> TAB <target pieces>'"),
                                           ("p10\tp20\np11\tnope\n", ":2: 'nope' is not a piece of the target")])
def test_a_bad_vocabulary_map_names_its_line(tmp_path, text, problem):
    from attnkit.data.shortlist import VocabularyMap

    path = tmp_path / "vmap.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(AttnkitError, match=f"^{path}{problem}"):
        VocabularyMap.read(path, FakeTokenizer(40), FakeTokenizer(40))


def test_ibm_model_1_matches_nltk():
    """The lexical table p(t | s) after five iterations of EM, against NLTK's IBMModel1 on the same pairs (each
    target sentence's tokens distinct: NLTK normalizes a target word's counts by word, not by position)."""
    nltk = pytest.importorskip("nltk.translate")
    from attnkit.data.shortlist import ibm1

    rng = random.Random(0)
    sources = [[rng.randrange(4, 12) for _ in range(rng.randint(1, 6))] for _ in range(60)]
    targets = [rng.sample(range(4, 16), rng.randint(1, 6)) for _ in range(60)]
    reference = nltk.IBMModel1([nltk.AlignedSent([str(t) for t in tgt], [str(s) for s in src])
                                for src, tgt in zip(sources, targets)], 5)
    pair_source, pair_target, p = ibm1(sources, targets, 12, 16, iterations=5)
    expected = [reference.translation_table[str(t)][None if s == 12 else str(s)]
                for s, t in zip(pair_source, pair_target)]
    np.testing.assert_allclose(p, expected, rtol=0, atol=1e-12)
    assert len(p) == len({(s, t) for src, tgt in zip(sources, targets) for s in [*src, 12] for t in tgt})


def test_a_built_map_ranks_each_source_tokens_translation_first():
    """Source token s translates to target token s + 20 in every pair, among frequent words that go with
    everything: each source token's candidates hold its translation, and the frequent words are always there."""
    from attnkit.data.shortlist import build_vocabulary_map

    rng = random.Random(1)
    sources, targets = [], []
    for _ in range(300):
        words = rng.sample(range(4, 14), 3)
        sources.append(words)
        targets.append([4 + 20, *(w + 20 for w in words), 5 + 20][: 5])
    vmap = build_vocabulary_map(sources, targets, 14, 40, per_source=1, frequent=2)
    assert set(vmap.always.tolist()) >= {24, 25}
    for s in range(6, 14):
        assert vmap.rules[(s,)].tolist() == [s + 20]


# --- the command line

def _attnkit(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "attnkit", *map(str, args)], capture_output=True, text=True,
                          **kwargs)


def test_attnkit_shortlist_writes_a_map_that_translate_uses(trained_checkpoint, tmp_path, dates_pairs):
    """The map the run's training pairs make, and one of the whole vocabulary, which changes nothing."""
    vmap = tmp_path / "vmap.txt"
    done = _attnkit("shortlist", trained_checkpoint, "--output", vmap, "--threads", 1)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(vmap) and vmap.read_text(encoding="utf-8").startswith("\t")
    again = _attnkit("shortlist", trained_checkpoint, "--output", vmap, "--threads", 1)
    assert again.returncode == 2 and again.stderr.strip().endswith("exists (--overwrite replaces it)")
    source = tmp_path / "src.txt"
    source.write_text("".join(s + "\n" for s in dates_pairs.src[:8]), encoding="utf-8")
    # a map whose always-candidates are the whole target vocabulary translates as no map does
    import attnkit

    pieces = attnkit.load(trained_checkpoint, compile=False).tokenizers.tgt.id_to_piece(range(64))
    whole = tmp_path / "whole.txt"
    whole.write_text("\t" + " ".join(pieces) + "\n", encoding="utf-8")
    outputs = []
    for shortlist in ((), ("--shortlist", whole), ("--shortlist", vmap)):
        done = _attnkit("translate", "--checkpoint", trained_checkpoint, "--input", source, "--beam", 2,
                        "--no-compile", "--threads", 1, *shortlist)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.splitlines())
    assert outputs[1] == outputs[0] and len(outputs[0]) == len(outputs[2]) == 8


def test_translate_with_a_missing_or_bad_map_is_a_one_line_error(trained_checkpoint, tmp_path):
    source = tmp_path / "src.txt"
    source.write_text("March 3, 2001\n", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_text("\t<s>\nno tab here\n", encoding="utf-8")
    for shortlist, problem in ((tmp_path / "none.txt", "none.txt: no such file or directory"),
                               (bad, f"{bad}:2: expected '<source n-gram> TAB <target pieces>'")):
        done = _attnkit("translate", "--checkpoint", trained_checkpoint, "--input", source, "--no-compile",
                        "--shortlist", shortlist, "--threads", 1)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
        assert problem in done.stderr
    done = _attnkit("translate", "--checkpoint", trained_checkpoint, "--input", source, "--no-compile",
                    "--shortlist", "--threads", 1)  # the run's own, which it has not
    assert done.returncode == 2 and "no vmap.txt beside" in done.stderr


def test_the_api_loads_a_runs_own_map_and_refuses_sampling_with_it(trained_checkpoint, tmp_path):
    import shutil

    import attnkit

    run = tmp_path / "run"
    shutil.copytree(trained_checkpoint.parent.parent, run, symlinks=True)
    assert _attnkit("shortlist", run, "--threads", 1).returncode == 0
    assert (run / "vmap.txt").is_file()
    model = attnkit.load(run, compile=False, shortlist=True)
    assert model.vocabulary_map is not None
    assert isinstance(model.translate("March 3, 2001", beam=2), str)
    with pytest.raises(AttnkitError, match="not by sampling"):
        model.translate("March 3, 2001", temperature=0.8)
    assert EOS in model.vocabulary_map.candidates([[5]]).tolist()
