"""Search steps compiled ahead of time: ``torch.export`` and AOTInductor, one call into a shared library a step.

``torch.compile``'s graphs run Inductor's kernels behind Python: Dynamo's guards and the bytecode that takes the
state apart and builds it again, AOTAutograd's wrappers, sizes turned into tensors. For one sentence the Multi30k
model's greedy step under torch.compile took 612-697 us, about half of it in its kernels; exported with the state
as a flat list of tensors and compiled by AOTInductor, the same step took 307-322 us (and 2.15 against 2.6 ms for
64 sentences; AVX-512 Xeon, one thread). So attnkit compiles this way only.

A state can be exported if it is a flat list of tensors (``state.tensors()``, and the classmethod
``from_tensors(tensors, beams)`` that builds it again, its offset read from a size): the fast decoder's
:class:`~attnkit.fast.decoding.GroupedDecoderState`. Steps that return attention weights run the eager step.

Each package holds the model's weights as constants of its own: greedy decoding makes one (its first step runs
the later steps' graph), beam search two (its first step makes the beams), and each one more for searches of one
sentence, whose first steps run the later steps' graph too, so the two together hold up to five copies of the
weights beside the model's (and up to three more where searches of many sentences have graphs of their own:
:data:`WIDE_GRAPH`). A package that runs once a sentence reads its own copy of the weights from memory again
every sentence: one sentence at a time, a first step with a package of its own took 388 us against 125 us for a
later step (medians; the Multi30k model, AMD EPYC Zen 4).

A greedy search or beam search of one sentence runs its packages in one loop (:meth:`AheadOfTimeStep.greedy_search`,
:meth:`AheadOfTimeStep.beam_search`) that hands each step's outputs to the next, without a search step's Python
around each call.

Compiling a package takes tens of seconds; with a ``cache`` directory (:func:`cache_directory`: one per model's
weights, torch version, attnkit source and CPU) each package is written there once, with a record of how to use
it, and later processes load it in a second. A package is native code, so it is only ever loaded from the user's
own cache (``$ATTNKIT_CACHE``, else ``$XDG_CACHE_HOME/attnkit``, else ``~/.cache/attnkit``), never from a directory
handed over with a checkpoint; a package whose bytes or record do not match is rebuilt, with one warning line.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import sys
import tempfile
import warnings
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import sympy
import torch
import torch.fx.experimental._config as fx_config
from torch import Tensor, nn
from torch._guards import detect_fake_mode
from torch.export import Dim
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo

from attnkit.decode.search import BeamStep, Hypothesis, length_normalized, sampled_hypotheses
from attnkit.fast.decoding import GroupedDecoderState, ShortlistedState
from attnkit.tokens import BOS, EOS


class AheadOfTimeStep:
    """The search step ``name``: ``search_step`` (:func:`~attnkit.fast.decoding.greedy_step_from_logits` or
    :func:`~attnkit.fast.compile.beam_search_step`) of ``model.step`` as ``step`` (its eager version), called as a
    search calls it: ``(tokens, state, *tensors, t, *flags)``, where the first flag is ``need_weights``.

    The first call of each kind (state type and beams, beam size, a search of one sentence or not, with
    ``first_step_apart`` first step or not, and with ``pack_wide`` a wide search or not) runs eagerly and exports
    and compiles a package from its inputs' shapes; later calls of that kind run the package. Without
    ``first_step_apart`` (greedy decoding, whose first step is a later step over an empty cache) the first step runs
    the later steps' package, whose cache length may be 0: one package, and one copy of the weights, fewer. Beam
    search's first step over a batch makes the beams, a graph of its own; over one sentence it is a later step over
    the beams made before it (:meth:`_first_of_one`). Sizes stay symbols (a graph made for 4 sentences at cache
    length 2 serves 64 sentences, or the last one left, and length 30), but for a search that began with one
    sentence, whose graphs fix every size but the lengths (their products Inductor's own C++ GEMMs:
    :data:`FIXED_GRAPH`); sizes the graph bounds (the positional table's length) are checked before each call, and
    the fallback runs outside them. A kind whose lowering fails runs the eager step, with one warning line.
    """

    def __init__(self, name: str, model: nn.Module, step, search_step, cache: Path | None = None,
                 first_step_apart: bool = True, pack_wide: bool = False):
        self.name, self.model, self.step, self.search_step = name, model, step, search_step
        self.fallback = partial(search_step, step)  # the eager step, for the calls that no package covers
        self.first_step_apart = first_step_apart
        # a search that begins with WIDE_SENTENCES sentences or more runs graphs of its own, whose linear layers are
        # oneDNN products of weights packed once (WIDE_GRAPH), where that measured faster on this CPU
        self.pack_wide = pack_wide
        self._wide = False
        self.packages: dict[tuple, _Package] = {}
        self.cache = None if cache is None else Path(cache)
        self.loaded = 0  # packages read from the cache rather than compiled
        self._looked_up: set[tuple] = set()  # the kinds already looked for in the cache
        # the search under way began with one sentence: its steps run the one-sentence graphs (a batch whose other
        # sentences have ended keeps the graphs it began with, which would otherwise compile in mid-search)
        self._one_sentence = False
        # sealed (a server, once warmed up): a kind of call without a graph, or outside its graph's bounds, runs the
        # eager step rather than a compiler, which would keep that request waiting for tens of seconds
        self.sealed = False
        self._directory = tempfile.TemporaryDirectory(prefix="attnkit-aoti-")  # removed with this object

    def __call__(self, tokens: Tensor, state, *args):
        n = next((i for i, a in enumerate(args) if not isinstance(a, Tensor)), len(args))
        tensors, (t, *flags) = list(args[:n]), args[n:]
        if (flags and flags[0]) or not tokens.is_cpu or not exportable(state) or t != state.offset:
            return self.fallback(tokens, state, *args)
        # sizes that are constants of a graph (the beam size) tell graphs apart, as does beam search's first step
        # over a batch (t == 0), which makes the beams, and a search of one sentence, whose graphs have every batch
        # size fixed
        sentences = state.memory.states.size(0)
        if t == 0:
            self._one_sentence = sentences == 1
            self._wide = is_wide(self.pack_wide, sentences)
        single = self._one_sentence and sentences == 1
        first = t == 0 and self.first_step_apart
        constants = tuple(tuple(x.size(d) for d in _constant_dims(x)) for x in tensors)
        if first and single:  # one sentence's first step: a later step over its beams (see _first_of_one)
            return self._first_of_one(tokens, state, tensors, constants, args)
        key = (type(state), state.beams, first, single, *constants, *(("wide",) if self._wide else ()))
        flat = [tokens, *state.tensors(), *tensors]
        eager = partial(self.search_step, self.step)
        if key not in self.packages:
            if self.sealed:
                return eager(tokens, state, *args)
            if key not in self._looked_up:  # kept in the cache (looked up once a kind: a damaged one warns once)
                self._looked_up.add(key)
                if (kept := self._cached(key)) is not None:
                    self.packages[key] = kept
            # traced from neither the caches at t == 1 (see _Package.build) nor, where the first step runs the later
            # steps' graph, the empty ones at t == 0 (that graph would serve cache length 0 alone)
            if key not in self.packages and (first or t > 0) and not any(n == 1 for x in flat for n in x.shape[1:]):
                self.packages[key] = self._build(key, flat, state, single)
            return eager(tokens, state, *args)  # eagerly, while there is no graph
        package = self.packages[key]
        if package is None:  # its lowering failed
            return eager(tokens, state, *args)
        if not package.fits(flat):
            return (eager if self.sealed else self.fallback)(tokens, state, *args)
        return package.run(_contiguous(flat))

    def _first_of_one(self, tokens: Tensor, state, tensors: list[Tensor], constants: tuple, args: tuple):
        """Beam search's first step for one sentence, by the later steps' graph of one sentence: a first step is a
        later step over k beams of which only the first is alive (the scores of the others are -inf), so its k
        rows, the sentence's beams made before the step rather than by it, rank to the same candidates (the same
        tokens, scores that may round otherwise). A first step's graph of its own would be one more copy of the
        weights to compile (a minute of a cold start, with the autotuning of its products) and to read once a
        sentence. Decoding the Multi30k test sentences one at a time (AMD EPYC Zen 4), this first step gave 4%
        more tokens a second at fp32 and 2% at int8 than a graph of its own, and 1% and 4% fewer where each run of
        fifty sentences took turns with CTranslate2's, as bench/decode_precision.py runs them. Eager until that
        graph is made (or outside its bounds)."""
        k = constants[0][0]  # the scores' [1, k]: the beam size
        package = self.packages.get((type(state), k, False, True, *constants))
        beams = state.repeat_beams(k)
        flat = [tokens.repeat_interleave(k), *beams.tensors(), *tensors]
        if package is None or not package.fits(flat):
            return partial(self.search_step, self.step)(tokens, state, *args)
        return package.run(_contiguous(flat))

    def greedy_search(self, state, max_lens: Tensor) -> list | None:
        """Greedy decoding of one sentence with every step in this kind's package (loaded or compiled by an earlier
        search), in a loop that hands each step's outputs to the next: the hypotheses
        :func:`~attnkit.decode.search.sample` finds step by step, without the Python that surrounds each of its steps
        (this class's call, the state built again from the package's outputs, the search's bookkeeping: a fifth of
        a sentence's time; fp32 Multi30k model, AMD EPYC Zen 4). None where it does not apply: a state that is not
        exported, more than one sentence, no package yet, sizes outside its bounds (the search then runs step by
        step, from the same state: a package leaves its inputs as they were)."""
        if self.first_step_apart or not _one_sentence_at_start(state, max_lens):
            return None
        limits = max_lens.to(state.device)
        package, limit, tensors = self.packages.get((type(state), 1, False, True, ())), int(limits[0]), state.tensors()
        n_state = len(tensors)
        # what the package returns: (next tokens, their log-probabilities, the next state, no attention)
        leaf = torch.zeros(())
        if package is None or limit < 1 or package.structure != pytree.tree_structure((leaf, leaf, state, None)):
            return None
        # the inputs as a search step is called with (tokens, the state, limits), as the graph reads them
        flat = _contiguous([torch.full((1,), BOS, dtype=torch.long), *tensors, limits])
        chosen, scores = [], []
        for _ in range(limit):
            if not package.fits(flat):
                return None
            # (next tokens, their log-probabilities, the next state's tensors); the attention is None
            leaves = package.leaves(flat)
            chosen.append(leaves[0])
            scores.append(leaves[1])
            if int(leaves[0]) == EOS:
                break
            flat = [leaves[0], *leaves[2:2 + n_state], limits]
        step_scores = torch.zeros(1, limit)
        step_scores[0, :len(scores)] = torch.cat(scores)
        return sampled_hypotheses([torch.cat(chosen).tolist()], step_scores)

    def beam_search(self, state, max_lens: Tensor, beam_size: int, len_penalty: float) -> list | None:
        """Beam search of one sentence with every step in the later steps' package of one sentence (loaded or
        compiled by an earlier search; the first step over the beams made before it, as :meth:`_first_of_one`), in
        a loop that hands each step's outputs to the next: the finished hypotheses, in the order
        :func:`~attnkit.decode.search.beam_search` finds them step by step, without the Python around each of its
        steps (a package call's wrappers, the :class:`~attnkit.decode.search.BeamStep` and state built again as
        objects, the search's bookkeeping of a batch). None where it does not apply, as for
        :meth:`greedy_search`."""
        if not self.first_step_apart or not _one_sentence_at_start(state, max_lens):
            return None
        k, beams = beam_size, state.repeat_beams(beam_size)
        tensors = beams.tensors()
        # beam_step's tensors after the state: scores [1, k] (the beam size a constant), history, limits
        package = self.packages.get((type(state), k, False, True, (k,), (), ()))
        limits = max_lens.to(state.device)
        limit, n_state = int(limits[0]), len(tensors)
        structure = pytree.tree_structure(BeamStep(beams, *[torch.zeros(())] * 8, None))  # the attention: None
        if package is None or limit < 1 or package.structure != structure:
            return None
        scores = torch.full((1, k), float("-inf"))
        scores[0, 0] = 0.0  # the k beams start as one
        history = torch.full((k, 0), BOS, dtype=torch.long)
        flat = _contiguous([torch.full((k,), BOS, dtype=torch.long), *tensors, scores, history, limits])
        finished = []
        for t in range(limit):
            if not package.fits(flat):
                return None
            # (the next state's tensors, tokens, scores, history, rows, ending, candidate scores and rows, stuck)
            leaves = package.leaves(flat)
            tokens, scores, history, _, ending, candidate_scores, candidate_rows, stuck = leaves[n_state:n_state + 8]
            ended = ending.view(-1).tolist()
            if True in ended:
                rows = [row for row, end in zip(candidate_rows.view(-1).tolist(), ended) if end]
                ended_scores = [score for score, end in zip(candidate_scores.view(-1).tolist(), ended) if end]
                for row, score in zip(flat[-2][rows].tolist(), ended_scores):
                    if len(finished) < k:
                        finished.append(Hypothesis(row, length_normalized(score, t + 1, len_penalty)))
            if len(finished) >= k or bool(stuck):
                break
            flat = [tokens, *leaves[:n_state], scores, history, limits]
        return [finished]

    def _name(self, key: tuple) -> str:
        """The file name of the package for ``key``: the search step and a digest of the graph's kind."""
        kind = repr((_type_name(key[0]), *key[1:]))
        return f"{self.name}-{hashlib.sha256(kind.encode()).hexdigest()[:16]}"

    def _cached(self, key: tuple) -> _Package | None:
        """The package for ``key`` from the cache, if there is one and it is intact (else None: build it)."""
        package = _load_kept(self.cache, self._name(key), self.name)
        self.loaded += package is not None
        return package

    def _build(self, key: tuple, flat: list[Tensor], state, single: bool) -> _Package | None:
        options = WIDE_GRAPH if key[-1] == "wide" else GRAPH
        return _compile_kept(self.cache, Path(self._directory.name), self._name(key), self.name,
                             partial(_Package.build, self, flat, state, single, options=options))


class AheadOfTimeEncoder:
    """``init_state(encode(src))`` of ``decoder`` (a :class:`~attnkit.fast.decoding.FastDecoder` with the grouped
    state) as one package: src [B, S] -> the state, the source projected for every decoder layer. The encoder runs
    once a batch where the steps run once a token, yet one sentence at a time its eager modules took a fifth of
    compiled greedy decoding's time (127 of 638 us a token; the Multi30k model, cProfile, AVX-512 Xeon).

    Each kind of source (:meth:`kind`) has a package of its own, exported and compiled (or loaded from ``cache``)
    on the first call of that kind with a source of two tokens or more, which runs eagerly; source length stays a
    symbol. A batch's package keeps its batch size a symbol and the library's products. One sentence's fixes its
    batch size (:data:`FIXED_GRAPH`: Inductor's GEMMs over weights packed when compiled): a batch's package took
    357 us to encode a Multi30k test sentence, a third of it MKL copying each weight into its packed form again, and
    this one 279 us (AMD EPYC Zen 5); the one-sentence package is checked against :meth:`otherwise`. With
    ``pack_wide``, batches of :data:`WIDE_SENTENCES` sentences or more have a package of their own
    (:data:`WIDE_GRAPH`). Calls outside a package's bounds (the positional table), on another device, or of a kind
    whose lowering failed run eagerly."""

    NAME = "encoder"
    # each kind's package: its file's name and the sizes of the source [B, S] that stay symbols (a graph whose batch
    # size is fixed is compiled with FIXED_GRAPH: _Package.export)
    KINDS = {"one sentence": ("encoder-one-sentence", {0: Dim.STATIC, 1: Dim.AUTO}),
             "batch": ("encoder", {0: Dim.AUTO, 1: Dim.AUTO}),
             "wide": ("encoder-wide", {0: Dim.AUTO, 1: Dim.AUTO})}

    def __init__(self, decoder, cache: Path | None = None, pack_wide: bool = False):
        self.decoder = decoder
        self.cache = None if cache is None else Path(cache)
        self.pack_wide = pack_wide
        self.packages: dict[str, _Package | None] = {}  # by kind; None: its lowering failed
        self.loaded = 0
        self.sealed = False  # as AheadOfTimeStep.sealed: without a package, compile nothing
        self._looked_up: set[str] = set()  # the kinds already looked for in the cache
        self._directory = tempfile.TemporaryDirectory(prefix="attnkit-aoti-")

    def kind(self, src: Tensor) -> str:
        """Which package encodes ``src`` [B, S]: "one sentence", "wide" (:func:`is_wide`) or "batch"."""
        if src.size(0) == 1:
            return "one sentence"
        return "wide" if is_wide(self.pack_wide, src.size(0)) else "batch"

    def eager(self, src: Tensor):
        return self.decoder.init_state(self.decoder.encode(src))

    def __call__(self, src: Tensor):
        kind = self.kind(src)
        if kind not in self.packages:
            if not self.sealed and src.is_cpu and src.dim() == 2 and src.size(1) > 1:
                self.packages[kind] = self._kept(kind) or self._compiled(kind, src)
            return self.eager(src)
        return self._run(kind, src)

    def otherwise(self, src: Tensor):
        """How one sentence is encoded without a package of its own: by a batch's package where one is made or kept
        in the cache (loaded, never compiled for it), else eagerly."""
        if "batch" not in self.packages and (kept := self._kept("batch")) is not None:
            self.packages["batch"] = kept
        return self._run("batch", src)

    def _run(self, kind: str, src: Tensor):
        package = self.packages.get(kind)
        if package is None or not package.fits([src]):
            return self.eager(src)
        return package.run(_contiguous([src]))

    def _kept(self, kind: str) -> _Package | None:
        """The package of ``kind`` kept in the cache, if there is one and it is intact (looked up once a kind: a
        damaged one warns once)."""
        if kind in self._looked_up:
            return None
        self._looked_up.add(kind)
        package = _load_kept(self.cache, self.KINDS[kind][0], self.NAME)
        self.loaded += package is not None
        return package

    def _compiled(self, kind: str, src: Tensor) -> _Package | None:
        name, sizes = self.KINDS[kind]
        build = partial(_Package.export, self.decoder, self.eager, [src], [sizes],
                        options=WIDE_GRAPH if kind == "wide" else GRAPH)
        return _compile_kept(self.cache, Path(self._directory.name), name, self.NAME, build,
                             fallback="encoding eagerly")


def _load_kept(cache: Path | None, name: str, what: str) -> _Package | None:
    """The package ``name`` kept in ``cache``, if there is one and it is intact (else None: build it)."""
    if cache is None or not (cache / f"{name}.json").is_file():
        return None
    path = cache / f"{name}.pt2"
    try:
        return _Package.load(path)
    except Exception as e:  # noqa: BLE001 -- any damage: a warning, then the package is built again
        print(f"attnkit: warning: the compiled {what} in {path.parent} is unusable "
              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); compiling it again",
              file=sys.stderr, flush=True)
        return None


def _compile_kept(cache: Path | None, scratch: Path, name: str, what: str, build,
                  fallback: str = "decoding with the eager step") -> _Package | None:
    """``build(path)``'s package, compiled into ``scratch`` and kept in ``cache`` as ``name``; None (with one warning
    line, ending in what runs instead) where it cannot be exported or lowered."""
    path = scratch / f"{name}.pt2"
    if cache is not None:  # the one wait a user would otherwise not understand
        print(f"attnkit: compiling the {what} ahead of time (tens of seconds, once: later runs load it from "
              f"{cache})", file=sys.stderr, flush=True)
    try:
        with warnings.catch_warnings():  # torch's own deprecation notices from inside export and autotuning
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*", category=UserWarning)
            package = build(path)
    except Exception as e:  # noqa: BLE001 -- any failure to export or compile leaves the eager step
        print(f"attnkit: warning: the {what} could not be compiled ahead of time "
              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {fallback}",
              file=sys.stderr, flush=True)
        return None
    if cache is not None:
        try:
            package.save(path, cache / f"{name}.pt2")
        except OSError as e:  # a cache that cannot be written costs the next start a compile, nothing more
            print(f"attnkit: warning: cannot keep the compiled {what} in {cache} ({e.strerror})", file=sys.stderr,
                  flush=True)
    return package


def cache_root() -> Path:
    """Where compiled packages are kept: ``$ATTNKIT_CACHE``, else ``$XDG_CACHE_HOME/attnkit``, else
    ``~/.cache/attnkit``."""
    from attnkit.native import cache_root as root

    return root(os.environ)


def cache_directory(model: nn.Module, **options) -> Path:
    """The cache directory of ``model``'s packages under :func:`cache_root`, named by a digest of everything a
    graph depends on: the model's weights and buffers (their bytes, names and layouts), ``options`` (how the
    model was prepared), the torch and Python versions, attnkit's source, this CPU's instruction sets and the kernels
    MKL runs (a graph keeps choices timed against them: :mod:`attnkit.mkl`)."""
    from attnkit.fast.precision import cpu_flags
    from attnkit.mkl import kernels

    digest = hashlib.sha256()
    for name, x in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"{name}|{x.dtype}|{tuple(x.shape)}|{x.stride()}".encode())
        digest.update(x.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    environment = {"torch": torch.__version__, "python": sys.version, "options": sorted(options.items()),
                   "cpu": sorted(cpu_flags()), "mkl": kernels(), "source": _source_digest()}
    digest.update(json.dumps(environment, default=str).encode())
    return cache_root() / "compiled" / digest.hexdigest()[:32]


def _source_digest() -> str:
    """A digest of attnkit's Python source: a graph traces the models' code as well as the search's."""
    root = Path(__file__).resolve().parents[1]
    return _files_digest(sorted(root.rglob("*.py")))


def _files_digest(paths) -> str:
    """SHA-256 over the files' names and bytes."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode() + b"\0" + Path(path).read_bytes())
    return digest.hexdigest()


def _type_name(kind: type) -> str:
    return f"{kind.__module__}:{kind.__qualname__}"


def exportable(state) -> bool:
    return isinstance(state, GroupedDecoderState)


def _one_sentence_at_start(state, max_lens: Tensor) -> bool:
    """Whether ``state`` is an exported state of one sentence on the CPU, before its first step, without beams:
    where a whole search of one sentence in one loop can begin."""
    return (exportable(state) and state.offset == 0 and state.beams == 1 and state.memory.states.size(0) == 1
            and max_lens.numel() == 1 and state.memory.states.is_cpu)


def _contiguous(tensors: list[Tensor]) -> list[Tensor]:
    """A package reads its inputs with the strides of contiguous tensors."""
    return [x if x.is_contiguous() else x.contiguous() for x in tensors]


def _constant_dims(x: Tensor) -> range:
    """The dims of a search step's tensor argument (after the state) that are constants of its graph: those after
    the first of a float one (beam_step's scores [m, k]: the beam size)."""
    return range(1, x.dim()) if x.is_floating_point() else range(0)


# Inductor's settings for a package. The weights are constants (freezing), so that what only depends on them (the
# output projection's oneDNN packing, where it pays: compile.py) is done once, when the package is compiled; the
# other linear layers stay library products, whose packed oneDNN form was slower at a decoding step's few rows.
GRAPH = {"freezing": True, "cpp.weight_prepack": False}
# A graph whose sizes are all fixed (a search of one sentence) multiplies one row (greedy) or a beam's few by each
# weight: a matrix-vector product that reads the whole weight for little arithmetic. There each product is
# Inductor's own C++ GEMM over the weight packed at compile time, where timed faster than the library's (max_autotune,
# "CPP,ATEN"), inlined in the graph's code: no library call, and the weight read in the order the kernel reads it.
# The library's single-row products (MKL's generic path on an AMD CPU, oneDNN's per-call overhead in bf16) took
# most of a step's time (docs/performance.md, "One sentence at a time"). Graphs of a batch keep the library's
# products: there Inductor's GEMMs, and oneDNN's packed products, made greedy decoding of 64 sentences about a tenth
# slower a token (the Multi30k model, AMD EPYC Zen 4, where MKL's products ran near the core's peak). The encoder of
# one sentence, its source length a symbol, has them where they measure faster (AheadOfTimeEncoder).
FIXED_GRAPH = {**GRAPH, "cpp.weight_prepack": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
               "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}  # timings not printed
# Where oneDNN's products of packed weights beat the library's (compile.py's _packing_pays, timed on the model's
# own linear layers at 64 rows), a search that begins with WIDE_SENTENCES sentences or more, and an encoder of as
# many, run graphs whose linear layers are those products. On an AMD EPYC Zen 5, whose cores run 512-bit vectors at
# full width, MKL's fp32 products stay on their AVX2 path (about 107 GFLOP/s on one core at every shape, as on Zen
# 4) while oneDNN's packed ones reached 185-250 at 64 rows and more; but each packed product also costs some 9 us
# a call, so that greedy decoding of batches of 4 was half again slower with them. Between, the products of a layer
# of the Multi30k model broke even at about 15 rows. A batch that shrinks below it as its sentences end keeps the
# graphs it began with.
WIDE_GRAPH = {**GRAPH, "cpp.weight_prepack": True}
WIDE_SENTENCES = 16


def is_wide(pack_wide: bool, sentences: int) -> bool:
    """Whether a search, or an encoder, of ``sentences`` runs the graphs of :data:`WIDE_GRAPH`."""
    return pack_wide and sentences >= WIDE_SENTENCES


class _Package:
    """One exported and compiled search step: its loader (which runs it on a flat list of tensors), how to build
    the step's result from the flat outputs (its pytree structure, and where each leaf comes from, ``passed``: None
    for the graph's next output, an input's index for an input that comes back unchanged, taken from the inputs
    rather than copied through the graph, or -1 for a leaf that is None, such as attention not asked for), and the
    bounds of its inputs' sizes: [(input, dim, lowest, highest)]."""

    def __init__(self, loader, structure, passed: list[int | None], bounds: list[tuple[int, int, int, int]]):
        self.loader, self.structure, self.passed, self.bounds = loader, structure, passed, bounds

    @classmethod
    def build(cls, aot: AheadOfTimeStep, flat: list[Tensor], state, single: bool, path: Path,
              options: dict | None = None) -> _Package:
        """Export and compile ``aot``'s search step for inputs like ``flat`` (tokens, ``state.tensors()``, the
        other tensors) into ``path``; ``single``: for a search of one sentence, every size but the lengths fixed
        (compiled with :data:`FIXED_GRAPH`; one greedy row multiplies by the output projection unpacked:
        compile.py's ``_OutputProjection``)."""
        state_type, beams, state_size = type(state), state.beams, len(state.tensors())

        def search_step(tokens, *inputs):
            state = state_type.from_tensors(list(inputs[:state_size]), beams)
            return aot.search_step(aot.step, tokens, state, *inputs[state_size:], state.offset)

        # every size a symbol (AUTO: whatever the trace finds them to be), but the constant ones and the first
        # step's empty caches (their length is a constant of the first step's graph)
        dynamic = [{d: Dim.STATIC if n == 0 else Dim.AUTO for d, n in enumerate(x.shape)} for x in flat]
        for i in range(1 + state_size, len(flat)):
            dynamic[i].update({d: Dim.STATIC for d in _constant_dims(flat[i])})
        if single:
            for sizes in dynamic:
                sizes[0] = Dim.STATIC
        # a state's tensors that are the same for every row (a shortlist's [1, K], the output rows [1, K, d_model]):
        # their first dim a constant, their last (the shortlist's length) a symbol, in every graph
        for i in range(1 + state_size - state.unbatched, 1 + state_size):
            dynamic[i][0] = Dim.STATIC
        return cls.export(aot.model, search_step, flat, dynamic, path, options)

    @classmethod
    def export(cls, model: nn.Module, fn, flat: list[Tensor], dynamic: list[dict], path: Path,
               options: dict | None = None) -> _Package:
        """Export ``fn`` (of ``model``, whose weights become the package's constants) for inputs like ``flat``, with
        the ``dynamic`` sizes of each, and compile it into ``path`` with Inductor's settings ``options`` (default
        :data:`GRAPH`; :data:`FIXED_GRAPH` where every batch size is fixed).
        ``fn(*flat)`` returns tensors, states that :func:`exportable` accepts, and tuples of them."""
        recorded: dict = {}

        class Flat(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *inputs):
                out = fn(*inputs)
                leaves, recorded["structure"] = pytree.tree_flatten(out)
                if not all(x is None or isinstance(x, Tensor) for x in leaves):
                    raise TypeError(f"cannot export a search step that returns {type(out).__name__}")
                index = {id(x): i for i, x in enumerate(inputs)}
                recorded["passed"] = [-1 if x is None else index.get(id(x)) for x in leaves]
                return tuple(x for x in leaves if x is not None and id(x) not in index)

        # Traced with one sentence, a graph computed wrong rows for three (an Inductor kernel specialised on the
        # size 1 it saw, though the exported program was right): the example has every input twice over along
        # its first dim, the batch's (every input whose first dim is not a constant); only sizes matter to the
        # trace, not values. A call with another dim of size 1 (the caches at t == 1) does not build. The
        # example's tensors are fresh and contiguous, as the graph reads its inputs (a size-1 dim may have any
        # stride), and sizes that happen to be equal stay separate symbols.
        # A graph whose batch sizes are all fixed is traced with them as they are.
        fixed = all(x.dim() == 0 or sizes.get(0) == Dim.STATIC for x, sizes in zip(flat, dynamic, strict=True))
        example = tuple(x.clone(memory_format=torch.contiguous_format) if not x.dim() or sizes.get(0) == Dim.STATIC
                        else torch.cat([x, x]) for x, sizes in zip(flat, dynamic, strict=True))
        with torch.no_grad(), fx_config.patch(backed_size_oblivious=True, use_duck_shape=False):
            program = torch.export.export(Flat(), example, dynamic_shapes=(tuple(dynamic),), strict=False)
            options = {**(FIXED_GRAPH if fixed else options or GRAPH),
                       "post_grad_custom_post_pass": _bias_add_after_product()}
            register_weight_packing()  # so that each package packs its weights exactly where its options say so
            with nullcontext() if options["cpp.weight_prepack"] else without_weight_packing():
                torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
        return cls(_loader(path), recorded["structure"], recorded["passed"], _bounds(program))

    def save(self, built: Path, path: Path) -> None:
        """Keep the package compiled at ``built`` as ``path``, with its record beside it (``path`` with .json): the
        structure of its outputs, its bounds and its bytes' SHA-256. Each file appears whole or not at all."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = built.read_bytes()
        record = {"structure": pytree.treespec_dumps(self.structure), "passed": self.passed, "bounds": self.bounds,
                  "sha256": hashlib.sha256(data).hexdigest(), "torch": torch.__version__}
        for target, content in ((path, data), (path.with_suffix(".json"), json.dumps(record).encode())):
            partial_file = target.with_name(f".{target.name}.{os.getpid()}.partial")
            partial_file.write_bytes(content)
            os.replace(partial_file, target)

    @classmethod
    def load(cls, path: Path) -> _Package:
        """The package :meth:`save` kept at ``path``, checked against its record before it is loaded."""
        record = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        if hashlib.sha256(path.read_bytes()).hexdigest() != record["sha256"]:
            raise ValueError(f"{path.name}: its bytes differ from those recorded")
        bounds = [tuple(int(v) for v in b) for b in record["bounds"]]
        passed = [None if i is None else int(i) for i in record["passed"]]
        structure = pytree.treespec_loads(record["structure"])
        return cls(_loader(path), structure, passed, bounds)

    def fits(self, flat: list[Tensor]) -> bool:
        return all(low <= flat[i].size(d) <= high for i, d, low, high in self.bounds)

    def leaves(self, flat: list[Tensor]) -> list[Tensor]:
        """The step's result for inputs ``flat`` as its tensors, in the order of torch's pytree (``self.structure``)."""
        outputs = iter(self.loader.run(flat))
        return [next(outputs) if i is None else None if i == -1 else flat[i] for i in self.passed]

    def run(self, flat: list[Tensor]):
        return pytree.tree_unflatten(self.leaves(flat), self.structure)


def _bias_add_after_product():
    """Inductor's custom pass ``addmm(bias, x, w)`` -> ``mm(x, w) + bias``: Inductor then adds the bias in the
    pointwise kernel that reads the product next (the residual's add and layer norm, the ReLU), where the library's
    addmm first copies the bias into its output, a copy and an expand per linear layer (~6 us a call at 40 rows;
    torch.profiler). Inductor does this on GPUs only. Made when a package is compiled: importing Inductor took
    0.7 s of a start that only loads packages (AMD EPYC Zen 5)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class BiasAddAfterProduct(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.addmm.default)):
                if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
                    continue
                bias, x, w = node.args
                with graph.inserting_before(node):
                    product = graph.call_function(torch.ops.aten.mm.default, (x, w))
                    total = graph.call_function(torch.ops.aten.add.Tensor, (product, bias))
                with detect_fake_mode([x.meta["val"]]):
                    product.meta["val"] = torch.ops.aten.mm(x.meta["val"], w.meta["val"])
                    total.meta["val"] = product.meta["val"] + bias.meta["val"]
                node.replace_all_uses_with(total)
                graph.erase_node(node)

        def uuid(self) -> bytes:
            return bytes.fromhex(_files_digest([__file__]))

    return BiasAddAfterProduct()


def _loader(path: Path):
    """The compiled package at ``path``, loaded by PyTorch's C++ loader (AOTInductor's runtime): a package takes
    milliseconds to load this way, where ``torch._inductor.aoti_load_package`` first imports Inductor (0.9 s of a
    start, AMD EPYC Zen 5) to compare the machine with the one the package was compiled on, which the cache's
    directory (:func:`cache_directory`: the CPU's flags, torch's version) already keys."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)


def _bounds(program) -> list[tuple[int, int, int, int]]:
    """The sizes of the program's inputs that its symbols' ranges bound: (input, dim, lowest, highest)."""
    ranges = program.range_constraints
    inputs = [node for node in program.graph.nodes if node.op == "placeholder"
              and node.name in program.graph_signature.user_inputs]
    bounds = []
    for i, node in enumerate(inputs):
        for d, size in enumerate(node.meta["val"].shape):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if isinstance(expr, sympy.Symbol) and expr in ranges:
                low, high = ranges[expr].lower, ranges[expr].upper
                if low > 0 or high != int_oo:
                    bounds.append((i, d, int(low), 2**62 if high == int_oo else int(high)))
    return bounds


# the modules whose freezing patterns pack weights for oneDNN (and, for quantized graphs, their int8 weights)
_PACKING_PATTERNS = ("torch._inductor.fx_passes.mkldnn_fusion", "torch._inductor.fx_passes.quantization")
_unpacked_passes: dict[int, tuple[list, list]] = {}  # by id of Inductor's list of passes: (that list, the copies)


@functools.cache
def register_weight_packing() -> None:
    """Register Inductor's oneDNN weight-packing patterns now, as its first freezing with ``cpp.weight_prepack`` on
    would (see :class:`without_weight_packing`). Inductor sets up its freezing patterns once a process, at the first
    frozen graph, and registers these only if that graph packs its weights: a process whose first graph did not
    pack never packed any later one. Registered first, a graph packs its weights if and only if its settings say
    so (with :class:`without_weight_packing` around those that do not)."""
    from torch._inductor.fx_passes import mkldnn_fusion
    from torch._inductor.pattern_matcher import init_once_fakemode

    init = getattr(mkldnn_fusion, "_mkldnn_weight_pack_init", None)
    if init is not None:
        init_once_fakemode(lambda: init())()


class without_weight_packing:  # noqa: N801 -- a context, used as a function is
    """Inductor's freezing passes without their oneDNN weight-packing patterns, within the context.

    Inductor registers those patterns the first time it freezes a graph with ``cpp.weight_prepack`` on, and from
    then on its freezing passes apply them to every frozen graph of the process, whatever that graph's settings
    (torch 2.13): a graph compiled with ``cpp.weight_prepack`` off after one compiled with it on came out packed,
    so which products a graph ran depended on what the process had compiled before it. Here the freezing passes
    run copies of Inductor's pattern passes without those patterns; before they are registered, nothing changes."""

    def __enter__(self):
        from torch._inductor.fx_passes import freezing_patterns, mkldnn_fusion

        self.original = None
        init = getattr(mkldnn_fusion, "_mkldnn_weight_pack_init", None)
        if init is None or init.cache_info().currsize == 0:  # not registered: nothing to leave out
            return self
        self.original = passes = freezing_patterns.pass_patterns
        kept = _unpacked_passes.get(id(passes))
        if kept is None or kept[0] is not passes:
            copies = []
            for matcher in passes:
                clean = copy.copy(matcher)
                clean.patterns = type(matcher.patterns)(list, {
                    key: [e for e in entries if getattr(getattr(e, "handler", None), "__module__", None)
                          not in _PACKING_PATTERNS] for key, entries in matcher.patterns.items()})
                copies.append(clean)
            _unpacked_passes[id(passes)] = kept = (passes, copies)
        freezing_patterns.pass_patterns = kept[1]
        return self

    def __exit__(self, *exc) -> None:
        if self.original is not None:
            from torch._inductor.fx_passes import freezing_patterns

            freezing_patterns.pass_patterns = self.original


def _state_as_pytree(kind: type) -> None:
    """A decoder state as a node of torch's pytrees: its tensors the children, its beams the context, named for the
    records that :meth:`_Package.save` writes with torch's own serializer of pytree structures (which builds
    nothing from a record but the types registered under these names)."""
    pytree.register_pytree_node(kind, lambda state: (state.tensors(), state.beams),
                                lambda tensors, beams: kind.from_tensors(list(tensors), beams),
                                serialized_type_name=f"attnkit.{kind.__name__}", to_dumpable_context=int,
                                from_dumpable_context=int)


for _kind in (GroupedDecoderState, ShortlistedState):
    _state_as_pytree(_kind)
pytree.register_pytree_node(BeamStep, lambda step: (list(step), None), lambda values, _: BeamStep(*values),
                            serialized_type_name="attnkit.BeamStep")
