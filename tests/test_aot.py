"""Search steps compiled ahead of time (torch.export + AOTInductor): the same outputs as eager decoding, one graph
for every batch size and cache length, and the fallback wherever a graph does not apply."""

from __future__ import annotations

import copy
import json
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from attnkit.decode import beam_search, greedy, max_lengths
from attnkit.decode.search import beam_step, greedy_step
from attnkit.fast import FastDecoder, compile_step
from attnkit.fast.aot import AheadOfTimeStep
from attnkit.models import PAD
from conftest import make_model, random_src, toy_trained_model

VOCAB = 23


@pytest.fixture(scope="module")
def model():
    return toy_trained_model(vocab=VOCAB, steps=60)


def _decode(model, src, beam: int, a: float = 1.0, b: int = 4, need_weights: bool = False):
    lens = max_lengths(src.ne(PAD).sum(1), a, b)
    state = model.init_state(model.encode(src))
    if beam == 1:
        return [[h] for h in greedy(model, state, lens, need_weights)]
    return beam_search(model, state, lens, beam_size=beam, need_weights=need_weights)


def _same(fast, eager):
    assert [h[0].tokens for h in fast] == [h[0].tokens for h in eager]
    assert [h[0].score for h in fast] == pytest.approx([h[0].score for h in eager], abs=1e-4)


class Counting:
    """A search step's eager version that counts its calls: the fallback of an :class:`AheadOfTimeStep`."""

    def __init__(self, model, search_step):
        self.calls, self.run = 0, partial(search_step, model.step)

    def __call__(self, *args):
        self.calls += 1
        return self.run(*args)


def _ahead_of_time(model):
    """A fast decoder of ``model`` (a copy; its grouped state is what a graph takes) with ahead-of-time search steps
    whose fallbacks count their calls."""
    decoder = FastDecoder(copy.deepcopy(model))
    fallbacks = {f.__name__: Counting(decoder, f) for f in (greedy_step, beam_step)}
    steps = {f.__name__: AheadOfTimeStep(f.__name__, decoder, decoder.step, f, first_step_apart=f is beam_step)
             for f in (greedy_step, beam_step)}
    for name, step in steps.items():
        step.fallback = fallbacks[name]
    decoder.search_steps = lambda: steps  # what greedy and beam search run in place of the plain steps
    return decoder, fallbacks


@torch.no_grad()
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN packing is a CPU build's")
def test_a_package_packs_its_weights_exactly_where_its_options_say_so_whatever_was_compiled_before(tmp_path):
    """Inductor sets up its weight-packing patterns once a process and then applies them to every frozen graph:
    packages compiled one after another, with packing, without, and with again, run oneDNN's packed products in the
    first and last only, and all three compute the linear layers' outputs."""
    from torch.export import Dim

    import attnkit.fast.aot as aot_module
    from attnkit.fast.aot import _Package

    layers = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)).eval()
    x = torch.randn(40, 32)
    ran = []
    for i, options in enumerate((aot_module.WIDE_GRAPH, aot_module.GRAPH, aot_module.WIDE_GRAPH)):
        options = {**options, "cpp.enable_kernel_profile": True}  # the package's calls named to the profiler
        package = _Package.export(layers, layers.forward, [x], [{0: Dim.AUTO}], tmp_path / f"{i}.pt2", options)
        with torch.profiler.profile() as prof:
            (out,) = package.leaves([x])
        torch.testing.assert_close(out, layers(x), atol=1e-4, rtol=1e-4)
        ran.append(any("linear_pointwise" in e.key for e in prof.key_averages()))
    assert ran == [True, False, True]


@pytest.mark.slow
@torch.no_grad()
def test_a_wide_search_runs_graphs_of_its_own_whose_layers_are_packed_products(model, monkeypatch):
    """Where oneDNN's packed products pay (``pack_wide``, forced here), a search that begins with WIDE_SENTENCES
    sentences or more, and their encoder, run packages compiled with ``WIDE_GRAPH`` (each linear layer a product
    of its weight packed once), with eager decoding's outputs, and never the fallback. A narrower batch keeps the
    library's products: sealed, as a server is, it finds no graph of its kind and runs the eager step, compiling
    nothing."""
    import attnkit.fast.aot as aot_module

    prepacked = []
    compile_package = torch._inductor.aoti_compile_and_package

    def recording(program, **kwargs):
        prepacked.append(kwargs["inductor_configs"]["cpp.weight_prepack"])
        return compile_package(program, **kwargs)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", recording)
    fast = compile_step(model, freeze=True, check=False, pack_wide=True)
    aot = fast.search_steps()["greedy_step"]
    aot.fallback = Counting(fast, greedy_step)
    wide = random_src([2 + i % 6 for i in range(aot_module.WIDE_SENTENCES)], vocab=VOCAB, seed=11)
    for _ in range(2):  # eagerly while the graphs are made, then through them
        _same(_decode(fast, wide, 1), _decode(model, wide, 1))
    assert [key[-1] for key in aot.packages] == ["wide"] and all(aot.packages.values())
    assert list(fast._aot_encoder.packages) == ["wide"] and fast._aot_encoder.packages["wide"] is not None
    assert prepacked == [True, True]  # the encoder's package and the greedy step's
    fast.seal()
    _same(_decode(fast, wide[:4], 1), _decode(model, wide[:4], 1))
    assert len(aot.packages) == 1 and list(fast._aot_encoder.packages) == ["wide"] and len(prepacked) == 2
    assert aot.fallback.calls == 0


@pytest.mark.slow
@torch.no_grad()
def test_ahead_of_time_steps_decode_like_eager_at_any_batch_size_and_load_from_the_cache(model, tmp_path,
                                                                                         monkeypatch, capfd):
    """``attnkit translate --compile``'s model. Greedy decoding makes one graph (at cache length 2; its first step
    runs it over the empty cache), beam search two for a batch (its first step's, which makes the beams, and the
    later steps') and one for a sentence alone (its first step a later step over the beams made before it): those of
    a batch serve batches of any size whose sentences end at different steps (rows leave, the caches carry a pending
    reordering, the last sentence decodes alone), those of a search of one sentence (greedy decoding's first here,
    beam search's second) serve every later search of one; never falling back, with eager decoding's outputs and
    scores. (Traced with one sentence as it came, a batch's graph once
    computed wrong rows for several.) The encoder
    and ``init_state``, one package for one sentence and one for a batch, each built on the first source of its kind
    of two tokens or more, make eager encoding's state at every batch size and source length; a source beyond the
    positional table is encoded eagerly. The graphs of one sentence (a search's, with every size fixed, and the
    encoder's, its batch size fixed) are compiled with Inductor's own C++ GEMMs in the running (``FIXED_GRAPH``), the
    others with the library's products.

    Every package is kept in the cache: a second decoder of the same weights loads them all (compiling nothing)
    and decodes as eager decoding does, packing the output projection as the kept packages do, whichever way its
    own timing of the packing would go; a package whose bytes changed is rebuilt with one warning line, and kept
    again. Other weights have a cache directory of their own."""
    import attnkit.fast.aot as aot_module
    from attnkit.fast.aot import cache_directory

    compiled_with = []
    compile_package = torch._inductor.aoti_compile_and_package

    def recording(program, **kwargs):
        compiled_with.append({k: v for k, v in kwargs["inductor_configs"].items() if k in aot_module.FIXED_GRAPH})
        return compile_package(program, **kwargs)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", recording)
    monkeypatch.setenv("ATTNKIT_CACHE", str(tmp_path))
    # the output projection packed for oneDNN, as where packing measures faster: a package lowers the packing of its
    # constant weight once, and one sentence's greedy graph multiplies its one row unpacked. The first decoder's
    # timing says packing pays; any later one's would say it does not (a close call, which each process's timing
    # may decide either way), and the packages kept decide for them
    # (the layers' packing for searches of 16 sentences or more, timed on 64 rows, does not pay here: below)
    timings = iter([True] + [False] * 8)
    monkeypatch.setattr("attnkit.fast.compile._packing_pays",
                        lambda weights, rows=32: next(timings) if rows == 32 else False)

    def decoder():
        return compile_step(model, freeze=True, check=False, cache=True)

    fast = decoder()
    src = random_src([6, 3, 5, 1], vocab=VOCAB, seed=7)
    eager = FastDecoder(copy.deepcopy(model))  # a long source grows its positional table (below)

    def same_state(batch):
        got, expected = fast.init_state(fast.encode(batch)), eager.init_state(eager.encode(batch))
        assert got.beams == expected.beams == 1 and got.offset == expected.offset == 0
        for a, b in zip(got.tensors(), expected.tensors(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    encoder = fast._aot_encoder
    same_state(src[3:, :1])  # one token: too short to build from (a size 1 would be specialised)
    assert encoder.packages == {}
    one = src[:1]
    searches = ((1, greedy_step, one), (3, beam_step, src))
    graphs = {"greedy_step": (1, 1), "beam_step": (2, 1)}  # a search's graphs of a kind: of a batch, of one sentence
    for beam, search_step, first in searches:
        aot = fast.search_steps()[search_step.__name__]
        assert isinstance(aot, AheadOfTimeStep)
        aot.fallback = Counting(fast, search_step)
        _same(_decode(fast, first, beam), _decode(model, first, beam))  # eagerly while the graphs are made
        # a search of one sentence makes graphs of its own; a batch's last sentence left alone keeps the batch's
        assert len(aot.packages) == graphs[search_step.__name__][first is one] and all(aot.packages.values())
        assert {key[3] for key in aot.packages} == {first is one}
        for batch in (src, one, src[1:3, :5]):
            _same(_decode(fast, batch, beam), _decode(model, batch, beam))
        assert len(aot.packages) == sum(graphs[search_step.__name__]) and all(aot.packages.values())
        assert aot.fallback.calls == 0
    # greedy decoding's first step runs its package too: a search of one sentence is a package call every step,
    # in one loop over the package (AheadOfTimeStep.greedy_search), with the hypotheses of the search step by step
    # (which an on_step callback asks for): the same tokens, scores and log-probabilities, to the bit
    runs, steps = [], []
    for package in [*fast.search_steps()["greedy_step"].packages.values(),
                    *fast.search_steps()["beam_step"].packages.values()]:
        counted = SimpleNamespace(run=partial(lambda run, flat: runs.append(flat) or run(flat), package.loader.run))
        monkeypatch.setattr(package, "loader", counted)
        monkeypatch.setattr(package, "run", partial(lambda run, flat: steps.append(flat) or run(flat), package.run))
    for sentence in (one, src[1:2], src[2:3, :5], src[3:, :2]):
        lens = max_lengths(sentence.ne(PAD).sum(1), 1.0, 4)
        runs.clear()
        steps.clear()
        (looped,) = greedy(fast, fast.init_state(fast.encode(sentence)), lens)
        assert len(runs) == len(looped.tokens) + 1 and not steps
        assert any(x.dim() == 4 and x.size(2) == 0 for x in runs[0])
        (stepped,) = greedy(fast, fast.init_state(fast.encode(sentence)), lens, on_step=lambda _: None)
        assert len(steps) == len(looped.tokens) + 1
        assert (looped.tokens, looped.score, looped.log_probs) == (stepped.tokens, stepped.score, stepped.log_probs)
        _same([[looped]], _decode(model, sentence, 1))
    # beam search of one sentence likewise (AheadOfTimeStep.beam_search): every step, the first over the beams made
    # before it, in the later steps' package, in one loop, with the finished hypotheses of the search step by step in
    # the same order, to the bit
    for sentence in (one, src[1:2], src[2:3, :5], src[3:, :2]):
        lens = max_lengths(sentence.ne(PAD).sum(1), 1.0, 4)
        runs.clear()
        steps.clear()
        (looped,) = beam_search(fast, fast.init_state(fast.encode(sentence)), lens, beam_size=3, n_best=3)
        looped_runs = len(runs)
        assert looped_runs >= 2 and not steps and len(looped) == 3
        # the first step: the k beams' tokens, over empty caches
        assert runs[0][0].shape == (3,) and any(x.dim() == 4 and x.size(2) == 0 for x in runs[0])
        (stepped,) = beam_search(fast, fast.init_state(fast.encode(sentence)), lens, beam_size=3, n_best=3,
                                 on_step=lambda _: None)
        assert len(steps) == looped_runs
        assert [(h.tokens, h.score) for h in looped] == [(h.tokens, h.score) for h in stepped]
        _same([looped], _decode(model, sentence, 3))
    for batch in (src, src[:1], src[1:3, :5], src[3:, :1], torch.cat([src, src])):
        same_state(batch)
    too_long = torch.randint(4, VOCAB, (2, model.cfg.max_positions + 3))
    assert encoder.packages["batch"] is not None and not encoder.packages["batch"].fits([too_long])
    same_state(too_long)  # eagerly: the positional table grows
    # sealed, as a warmed-up server seals it: a beam size without graphs (2) runs the eager step, compiling nothing
    # and never the fallback (whose torch.compile would compile too), with eager decoding's outputs
    assert fast.seal() == ["greedy_step", "beam_step", "encoder"]
    _same(_decode(fast, src, 2), _decode(model, src, 2))
    assert len(aot.packages) == 3 and aot.fallback.calls == 0
    # the encoder's packages, of one sentence and of a batch, then each step's: two of a search of one sentence,
    # three of batches; those of one sentence with every batch size fixed
    assert len(compiled_with) == 7 and compiled_with.count(aot_module.FIXED_GRAPH) == 3
    assert compiled_with.count(aot_module.GRAPH) == 4
    assert sorted(encoder.packages) == ["batch", "one sentence"] and all(encoder.packages.values())

    greedy_steps = fast.search_steps()["greedy_step"]
    kept = sorted(greedy_steps.cache.glob("*.pt2"))
    assert greedy_steps.cache.parent == tmp_path / "compiled" and all(p.with_suffix(".json").is_file() for p in kept)
    assert len(kept) == 7 and {"encoder.pt2", "encoder-one-sentence.pt2"} <= {p.name for p in kept}
    assert greedy_steps.loaded == 0 and encoder.loaded == 0

    again = decoder()
    for beam, search_step, first in searches:
        aot = again.search_steps()[search_step.__name__]
        for batch in (first, src, one):
            _same(_decode(again, batch, beam), _decode(model, batch, beam))
        assert aot.loaded == len(aot.packages) == sum(graphs[search_step.__name__]) and all(aot.packages.values())
    assert again._aot_encoder.loaded == 2 and len(compiled_with) == 7

    # greedy decoding's package of a batch damaged: a third decoder compiles it again, saying so once, and keeps it
    later = next(key for key in greedy_steps.packages if not key[3])
    damaged = greedy_steps.cache / f"{greedy_steps._name(later)}.pt2"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    capfd.readouterr()
    for expected_loaded in (0, 1):
        rebuilt = decoder()
        _same(_decode(rebuilt, src, 1), _decode(model, src, 1))
        assert rebuilt.search_steps()["greedy_step"].loaded == expected_loaded
        warnings = [line for line in capfd.readouterr().err.splitlines() if "attnkit: warning" in line]
        assert len(warnings) == 1 - expected_loaded  # one warning the first time, none once it is kept again
        assert all("compiling it again" in w for w in warnings)
    assert len(compiled_with) == 8

    other = copy.deepcopy(model)
    next(other.parameters()).add_(1.0)
    assert cache_directory(other) != cache_directory(model) == cache_directory(copy.deepcopy(model))


def test_the_cache_is_keyed_by_the_kernels_mkl_runs(model, monkeypatch):
    """A graph keeps choices timed against MKL's kernels (attnkit.mkl): MKL's own choice and its AVX-512 kernels
    keep their packages apart."""
    import attnkit.mkl
    from attnkit.fast.aot import cache_directory

    running = attnkit.mkl.kernels()
    here = cache_directory(model)
    assert cache_directory(model) == here
    monkeypatch.setattr(attnkit.mkl, "kernels", lambda: "AVX2" if running != "AVX2" else "AVX-512")
    assert cache_directory(model) != here


@pytest.mark.slow
@torch.no_grad()
def test_steps_a_graph_does_not_cover_run_the_fallback():
    """A cache longer than the positional table the graph was traced with (sinusoidal, 8 positions: eagerly the
    table grows) is outside the graph's bounds, as are steps that return attention weights: the fallback runs
    them, and the outputs stay eager decoding's."""
    model = make_model(VOCAB, seed=3, max_positions=8)
    src = random_src([3, 2], vocab=VOCAB, seed=1)
    fast, fallbacks = _ahead_of_time(model)
    eager = _decode(model, src, 1, a=0.0, b=12)
    assert max(len(h[0].tokens) for h in eager) > 8  # a random model rarely ends: it runs to the limit
    _same(_decode(fast, src, 1, a=0.0, b=12), eager)
    calls = fallbacks["greedy_step"].calls
    _same(_decode(fast, src, 1, a=0.0, b=12), eager)
    steps = max(len(h[0].tokens) for h in eager) + 1
    assert fallbacks["greedy_step"].calls - calls == steps - 8  # the steps at cache lengths 8 and more
    calls = fallbacks["greedy_step"].calls
    weights = _decode(fast, src, 1, need_weights=True)
    assert fallbacks["greedy_step"].calls > calls
    expected = _decode(model, src, 1, need_weights=True)
    for a, b in zip(weights, expected):
        torch.testing.assert_close(a[0].attention, b[0].attention)


@torch.no_grad()
def test_a_step_whose_lowering_fails_runs_eagerly_and_says_so_once_a_kind(model, monkeypatch, capfd):
    """Where AOTInductor cannot lower a step (it failed for the bf16 Multi30k model), that kind of step runs the
    eager step, with one warning line naming the step; outputs stay eager decoding's."""
    from attnkit.fast.aot import _Package

    def fails(*args, **kwargs):
        raise RuntimeError("LoweringException: AssertionError")

    monkeypatch.setattr(_Package, "build", staticmethod(fails))
    fast, fallbacks = _ahead_of_time(model)
    src = random_src([6, 3, 5, 1], vocab=VOCAB, seed=7)
    for beam in (1, 3):
        for _ in range(2):
            _same(_decode(fast, src, beam), _decode(model, src, beam))
    assert fallbacks["greedy_step"].calls == fallbacks["beam_step"].calls == 0
    warnings = [line for line in capfd.readouterr().err.splitlines() if "attnkit: warning" in line]
    # a kind each: greedy decoding's graph, beam search's first step's and later steps'
    assert len(warnings) == 3 and all("could not be compiled ahead of time (RuntimeError: LoweringException" in w
                                      and w.endswith("decoding with the eager step") for w in warnings)


@torch.no_grad()
def test_a_compiled_decoder_names_the_checks_whose_lowering_failed(model, monkeypatch, capfd):
    """``CompiledDecoder.unlowered()``: the checks that run the eager step because their package could not be
    compiled (here every export fails), whatever the check itself decided; none before a lowering was tried. Each
    kind of source has its encoder's package: a batch names the greedy step and the encoder of a batch, and one
    sentence then adds the encoder of one sentence, with one warning line for each package that failed."""
    from attnkit.decode import generate
    from attnkit.fast.aot import _Package

    def fails(*args, **kwargs):
        raise RuntimeError("LoweringException: AssertionError")

    monkeypatch.setattr(_Package, "export", staticmethod(fails))
    fast = compile_step(model, freeze=True)
    assert fast.unlowered() == []
    src = random_src([6, 3, 5, 2], vocab=VOCAB, seed=7)
    lens = max_lengths(src.ne(PAD).sum(1), 1.0, 4)
    for _ in range(2):
        assert [h[0].tokens for h in generate(fast, src, lens)] == [h[0].tokens for h in generate(model, src, lens)]
    assert sorted(fast.unlowered()) == ["encoder of a batch", "greedy_step"]
    # the greedy graph's warning and the encoder's
    assert sum("could not be compiled ahead of time" in line for line in capfd.readouterr().err.splitlines()) == 2
    for _ in range(2):
        assert generate(fast, src[:1], lens[:1])[0][0].tokens == generate(model, src[:1], lens[:1])[0][0].tokens
    assert sorted(fast.unlowered()) == ["encoder of a batch", "encoder of one sentence", "greedy_step"]
    assert sum("the encoder could not be compiled ahead of time" in line
               for line in capfd.readouterr().err.splitlines()) == 1


def test_a_package_record_builds_only_the_types_attnkit_registered(model):
    """A record keeps the structure of a step's outputs with torch's serializer of pytree structures, and reading
    it builds the same state again; a record naming any other type (``os.system``) is refused, so that package is
    compiled again."""
    from torch.utils import _pytree as pytree

    from attnkit.fast import aot  # noqa: F401 -- registers the decoder states and the beam step

    decoder = FastDecoder(copy.deepcopy(model))
    state = decoder.init_state(decoder.encode(random_src([3, 2], vocab=VOCAB, seed=1))).repeat_beams(2)
    step = (torch.tensor([4, 5]), state, None)
    leaves, spec = pytree.tree_flatten(step)
    record = json.dumps(pytree.treespec_dumps(spec))
    again = pytree.tree_unflatten(leaves, pytree.treespec_loads(json.loads(record)))
    assert type(again[1]) is type(state) and again[1].beams == 2 and again[1].offset == state.offset
    for a, b in zip(again[1].tensors(), state.tensors(), strict=True):
        assert a is b
    forged = json.loads(record).replace(f"attnkit.{type(state).__name__}", "os.system")
    with pytest.raises((NotImplementedError, KeyError, ValueError)):
        pytree.treespec_loads(forged)
