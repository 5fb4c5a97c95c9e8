"""Decoding compiled with ``torch.compile`` and, ahead of time, with ``torch.export`` and AOTInductor.

:func:`compile_step` returns a :class:`CompiledDecoder`: the decoding interface of the model it was given
(``encode``, ``init_state``, ``step``, ``search_steps``), each compiled, over a copy of the model prepared for
inference (column-major weights, optionally a packed output layer). Outputs may round differently from eager
ones: ``bench/translate_throughput.py`` counts the outputs that differ and scores both; the tests check equal
hypotheses on small models.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.decode.search import BeamStep
from attnkit.fast.decoding import FastDecoder, GroupedDecoderState, beam_step_from_logits, greedy_step_from_logits
from attnkit.fast.precision import INT8_TOLERANCE, Int8Linear
from attnkit.fast.runtime import use
from attnkit.models.contract import DecodingState, device_of
from attnkit.models.transformer import Memory


def compile_step(model, cpp_wrapper: bool = True, freeze: bool = False, pack_output: bool | None = None,
                 ahead_of_time: bool = False, check: bool = True, cache: bool = False,
                 encoder: bool = True, pack_wide: bool | None = None) -> CompiledDecoder:
    """A decoder of ``model`` (a model of the contract or a :class:`FastDecoder`) whose ``encode``, ``init_state``,
    ``step`` and search steps are compiled with ``torch.compile``, for inference (CPU or GPU). The decoder holds a
    copy of the model, prepared for inference: the model itself is left as it was.

    * Shapes are dynamic (the batch shrinks, the cache grows every step): one graph serves every step after the
      first two (cache lengths 0 and 1 are compiled apart), one the encoder, whatever the source length.
    * Greedy decoding and beam search compile the model's step together with the choice of the next tokens
      (:func:`greedy_search_step`, :func:`beam_search_step`), one graph each; ``step`` alone serves sampling.
    * Every linear weight [out, in] is stored column-major (same values and shape, strides (1, out)), so that
      ``x @ W^T`` hands BLAS a contiguous [in, out] matrix: faster at a decoding step's few rows.
    * ``cpp_wrapper``: Inductor calls the kernels from C++ instead of generated Python.
    * ``freeze``: Inductor treats the weights as constants; the output projection may then be a oneDNN product
      with its weight packed once (``pack_output``; None: as in the packages ``cache`` keeps, else if that measures
      faster on this machine, on 32 rows), an fp32 weight only: AOTInductor cannot lower the packed product of a
      bf16 one.
    * ``pack_wide`` (frozen, ahead of time, fp32 weights): searches that begin with 16 sentences or more, and the
      encoder of as many, run packages whose linear layers are oneDNN products of weights packed once
      (:data:`attnkit.fast.aot.WIDE_GRAPH`); None: as in the packages ``cache`` keeps, else if that measures
      faster on this machine, on 64 rows of the model's own layers.
    * ``ahead_of_time``: the search steps are exported and compiled by AOTInductor (:mod:`attnkit.fast.aot`)
      where the decoder's state allows it (the Transformer's grouped state), without the Python that
      torch.compile runs around each call; so are ``encode`` and ``init_state``, as one package (its cache kept
      with the steps'), in place of ``encoder``'s graphs.
    * ``check``: each search step is checked against the eager one on the first real batches, and kept only if
      it gives the same outputs and is faster (:class:`CheckedStep`); without, the compiled steps always run.
    * ``cache``: the ahead-of-time packages are kept in, and later loaded from, the user's cache
      (:func:`attnkit.fast.aot.cache_directory`), so that only the first process to decode with a model
      compiles them.
    * ``encoder``: ``encode`` and ``init_state`` under torch.compile too (once a batch, where the steps run once a
      token), where ``ahead_of_time`` has no package for them (attention weights asked for); without, they run
      eagerly there. Their graphs are traced and, frozen, compiled again by every process: about ten seconds of
      each start that the cached packages do not save.

    What each of these gains, measured on which machine, is in docs/performance.md.
    """
    return CompiledDecoder(model, cpp_wrapper, freeze, pack_output, ahead_of_time, check, cache, encoder, pack_wide)


def greedy_search_step(step, tokens: Tensor, state, limits: Tensor, t: int, need_weights: bool = False):
    """:func:`~attnkit.decode.search.greedy_step` from the step's logits, with the chunked argmax
    (:func:`~attnkit.fast.decoding.greedy_step_from_logits`)."""
    return greedy_step_from_logits(step, tokens, state, limits, t, need_weights)


def beam_search_step(step, tokens: Tensor, state, scores: Tensor, history: Tensor, limits: Tensor, t: int,
                     need_weights: bool = False, at_limit: bool = True):
    """:func:`~attnkit.decode.search.beam_step` from the step's logits, with the chunked top-k
    (:func:`~attnkit.fast.decoding.beam_step_from_logits`). The length-limit mask is always applied
    (``at_limit`` is not read): a graph that branched on the flag would be compiled twice."""
    return beam_step_from_logits(step, tokens, state, scores, history, limits, t, need_weights, True)


class CompiledDecoder(nn.Module):
    """A :class:`FastDecoder` over a copy of the model, with its functions compiled (:func:`compile_step`)."""

    def __init__(self, model, cpp_wrapper: bool = True, freeze: bool = False, pack_output: bool | None = None,
                 ahead_of_time: bool = False, check: bool = True, cache: bool = False, encoder: bool = True,
                 pack_wide: bool | None = None):
        super().__init__()
        inner = model.model if isinstance(model, FastDecoder) else model
        inner = copy.deepcopy(inner).eval()
        use(inner, "fused_attention", "decoding_attention")
        # the model is not changed after this, so most checks that its modules' attributes are still the same can go
        options = {"cpp_wrapper": cpp_wrapper, "guard_filter_fn": _keep_identities_and_constants}
        can_pack = freeze and torch.backends.mkldnn.is_available() and device_of(inner).type == "cpu"
        output = getattr(inner, "output", None)
        packs = isinstance(output, nn.Linear) and output.weight.dtype == torch.float32 and can_pack
        layers = [m.weight.detach() for m in inner.modules() if isinstance(m, nn.Linear) and m is not output]
        # an int8 model's fp32 products: by slices of its layers' dequantized weights (cross-attention's queries and
        # memory), which a wide graph packs as it packs fp32 layers (its integer products stay torch._int_mm)
        layers += [m.weight for m in inner.modules() if isinstance(m, Int8Linear)]
        packs_layers = ahead_of_time and can_pack and bool(layers) and all(w.dtype == torch.float32 for w in layers)
        # the cache directory of the packages by (output projection packed, wide searches' layers packed)
        kept: dict[tuple[bool, bool], Path] = {}
        if ahead_of_time and cache:
            from attnkit.fast.aot import cache_directory

            kept = {(out, wide): cache_directory(inner, freeze=freeze, cpp_wrapper=cpp_wrapper, pack_output=out,
                                                 pack_wide=wide)
                    for out in ((True, False) if packs else (False,))
                    for wide in ((True, False) if packs_layers else (False,))}
        if (packs and pack_output is None) or (packs_layers and pack_wide is None):
            # packages already kept decide: timed anew, a close call could go the other way in the next process,
            # whose start would then compile everything again
            chosen = next((choice for choice, directory in kept.items() if any(directory.glob("*.json"))), None)
            if chosen is not None:
                pack_output = chosen[0] if pack_output is None else pack_output
                pack_wide = chosen[1] if pack_wide is None else pack_wide
        if packs_layers and pack_wide is None:
            pack_wide = _packing_pays(list({tuple(w.shape): w for w in layers}.values()), rows=64)
        pack_wide = bool(packs_layers and pack_wide)
        # the fewest sentences of a search whose graphs are packed products (None: no such graphs), which a server
        # warms up with
        self.wide_sentences = None
        if pack_wide:
            from attnkit.fast.aot import WIDE_SENTENCES

            self.wide_sentences = WIDE_SENTENCES
        prepack = False
        if isinstance(output, nn.Linear):
            prepack = packs and (_packing_pays([output.weight.detach()]) if pack_output is None else pack_output)
            if prepack:
                _register_fake_weight_packing()
            inner.output = _OutputProjection(output, prepack)
        _store_column_major(inner)
        self.decoder = FastDecoder(inner)
        self.family, self.capabilities, self.cfg = inner.family, inner.capabilities, inner.cfg
        eager_step = self.decoder.step

        # Sizes 0 and 1 are compiled apart (cache lengths 0 and 1, one sentence left), as are greedy and beam steps
        # and cache layouts that differ only in the strides of size-1 dimensions: greedy decoding and beam search
        # at batches 1 and 64 made 10 step graphs, past Dynamo's default limit of 8, above which it runs eager.
        def compile(fn):
            def make():
                compiled = torch.compile(fn, dynamic=True, options=options, recompile_limit=32)
                return _frozen(compiled) if freeze else compiled
            return _OnFirstCall(make)

        # greedy decoding and beam search compile the step with their choice of the next tokens (one graph, where the
        # choice alone was some 35 small eager operations a step); step itself serves sampling
        steps = {"greedy_step": greedy_search_step, "beam_step": beam_search_step}
        self._search_steps = {name: _EagerForWeights(compile(partial(fn, eager_step)), partial(fn, eager_step))
                              for name, fn in steps.items()}
        self._aot_encoder = None
        self._prepare = None  # src -> the state's tensors: the encoder and init_state as one package
        self._encoders: dict[str, CheckedStep] = {}  # the encoder's packages, checked by kind of source
        if ahead_of_time:
            from attnkit.fast.aot import WIDE_SENTENCES, AheadOfTimeEncoder, AheadOfTimeStep

            directory = kept.get((prepack, pack_wide))
            self._search_steps = {name: AheadOfTimeStep(self.decoder, eager_step, fn, self._search_steps[name],
                                                        directory, first_step_apart=fn is beam_search_step,
                                                        pack_wide=pack_wide)
                                  for name, fn in steps.items()}
            if self.decoder.grouped:
                self._aot_encoder = AheadOfTimeEncoder(self.decoder, directory, pack_wide)
                self._prepare = lambda src: self._aot_encoder(src).tensors()
        if check:  # each compiled search step proves itself against the eager one on the first real batches
            # scores may differ by float rounding: a few units of the model's precision (bf16's is 2^-7); at int8 a
            # rounding difference upstream moves an activation across a quantization step, so the compiled and eager
            # steps differ by int8's own error: the 5% of a score that int8 decoding is held to against fp32
            dtype = next(inner.parameters()).dtype
            tolerance = 1e-3 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
            if any(isinstance(m, Int8Linear) for m in inner.modules()):
                tolerance = INT8_TOLERANCE
            self._search_steps = {name: CheckedStep(name, self._search_steps[name], partial(fn, eager_step),
                                                    tolerance=tolerance) for name, fn in steps.items()}
            if self._prepare is not None:
                # each kind of source is checked apart, as each has a package of its own: the package of a batch
                # beat eager encoding threefold for one sentence and lost to it by a few percent for 64 (AMD EPYC
                # Zen 4), so the first requests' size would otherwise decide for every later one (a server warmed
                # up with a batch would encode every single sentence eagerly). One sentence's package is checked
                # against encoding it as a batch is encoded: the package it replaces, where there is one
                names = {"one sentence": "one sentence", "batch": "a batch",
                         **({"wide": f"a batch of {WIDE_SENTENCES} sentences or more"} if pack_wide else {})}
                self._encoders = {
                    kind: CheckedStep(f"encoder of {name}", self._prepare,
                                      (lambda src: self._aot_encoder.otherwise(src).tensors()) if kind == "one sentence"
                                      else (lambda src: self._aot_encoder.eager(src).tensors()),
                                      tolerance=tolerance, compare=close_in_norm,
                                      against="encoding as a batch" if kind == "one sentence" else "the eager step")
                    for kind, name in names.items()}
                self._prepare = lambda src: self._encoders[self._aot_encoder.kind(src)](src)
        self._encode = compile(self.decoder.encode) if encoder else self.decoder.encode
        self._init_state = compile(self.decoder.init_state) if encoder else self.decoder.init_state
        self.step = compile(eager_step)

    def encode(self, src: Tensor, need_weights: bool = False):
        """The model's ``encode``; ahead of time, the package that also makes the decoder's state (its memory, with
        that state, is a :class:`PreparedMemory`, which :meth:`init_state` hands on)."""
        if need_weights:
            return self._encode(src, need_weights=True)
        if self._prepare is None:
            return self._encode(src)
        state = GroupedDecoderState.from_tensors(self._prepare(src), 1)
        return PreparedMemory(state.memory.states, state.memory.padding_mask, [], state)

    def init_state(self, memory) -> DecodingState:
        if isinstance(memory, PreparedMemory) and memory.state is not None:
            return memory.state
        return self._init_state(memory)

    def restrict_vocabulary(self, state: DecodingState, ids: Tensor) -> DecodingState:
        return self.decoder.restrict_vocabulary(state, ids)

    def forward(self, *args, **kwargs):
        return self.decoder(*args, **kwargs)

    def require(self, capability: str) -> None:
        self.decoder.require(capability)

    def search_steps(self) -> dict:
        return self._search_steps

    def greedy_search(self, state, max_lens: Tensor) -> list | None:
        """One sentence's greedy search in one loop over its package (:meth:`AheadOfTimeStep.greedy_search`), once
        the greedy step's check has chosen the package; None otherwise (the search runs step by step)."""
        step = self._ahead_of_time("greedy_step")
        return None if step is None else step.greedy_search(state, max_lens)

    def beam_search(self, state, max_lens: Tensor, beam_size: int, len_penalty: float) -> list | None:
        """One sentence's beam search in one loop over its packages (:meth:`AheadOfTimeStep.beam_search`), once the
        beam step's check has chosen them; None otherwise (the search runs step by step)."""
        step = self._ahead_of_time("beam_step")
        return None if step is None else step.beam_search(state, max_lens, beam_size, len_penalty)

    def _ahead_of_time(self, name: str):
        """The search step ``name`` compiled ahead of time, where it runs (its check chose it); else None."""
        from attnkit.fast.aot import AheadOfTimeStep

        step = self._search_steps[name]
        if isinstance(step, CheckedStep):
            if step.chosen is not step.compiled:
                return None
            step = step.compiled
        return step if isinstance(step, AheadOfTimeStep) else None

    def checks(self) -> dict[str, CheckedStep]:
        """The compiled steps that are checked against their eager versions (``check``), by name: the search steps,
        and the encoder's packages, one for each kind of source (one sentence, a batch, a wide batch)."""
        steps = [s for s in self._search_steps.values() if isinstance(s, CheckedStep)]
        return {s.name: s for s in [*steps, *self._encoders.values()]}

    def unlowered(self) -> list[str]:
        """The checks (named as in :meth:`checks`) whose ahead-of-time lowering failed: they run the eager step
        whatever their check chose."""
        from attnkit.fast.aot import AheadOfTimeStep

        failed = [name for name, step in self.checks().items()
                  if isinstance(step.compiled, AheadOfTimeStep) and None in step.compiled.packages.values()]
        encoder = self._aot_encoder
        if encoder is not None:
            failed += [check.name for kind, check in self._encoders.items()
                       if kind in encoder.packages and encoder.packages[kind] is None]
        return failed

    def seal(self) -> list[str]:
        """From now on compile nothing: the kinds of search step already compiled ahead of time (or loaded) run
        their graphs, any other kind the eager step (:attr:`AheadOfTimeStep.sealed`). A server seals its decoders
        after warming them up, so that no request waits for a compiler. -> the names of the sealed steps."""
        from attnkit.fast.aot import AheadOfTimeStep

        sealed = []
        for name, step in self._search_steps.items():
            inner = step.compiled if isinstance(step, CheckedStep) else step
            if isinstance(inner, AheadOfTimeStep):
                inner.sealed = True
                sealed.append(name)
        if self._aot_encoder is not None:
            self._aot_encoder.sealed = True
            sealed.append("encoder")
        return sealed


@dataclasses.dataclass
class PreparedMemory(Memory):
    """A memory that comes with the decoder's state made from it (by the encoder's package); ``select`` gives a
    plain :class:`~attnkit.models.transformer.Memory`, whose state ``init_state`` makes again."""

    state: DecodingState | None = None



class _OnFirstCall:
    """The function ``make()`` returns, made when first called: ``torch.compile`` imports the compiler (some
    seconds of every start), and with the search steps ahead of time their torch.compile fallbacks seldom run."""

    def __init__(self, make):
        self.make, self.fn = make, None

    def __call__(self, *args, **kwargs):
        if self.fn is None:
            self.fn = self.make()
        return self.fn(*args, **kwargs)


class _EagerForWeights:
    """A compiled search step whose calls that return attention weights run ``eager`` instead: weights are asked for
    to be looked at (the explorer, alignments), one sentence at a time, and a graph of their own would make the first
    such request wait tens of seconds for its compiling."""

    def __init__(self, compiled, eager):
        self.compiled, self.eager = compiled, eager

    def __call__(self, tokens, state, *args):
        # a search step's arguments: its tensors, then t, then need_weights (and beam search's at_limit) if given
        n = next((i for i, a in enumerate(args) if not isinstance(a, Tensor)), len(args))
        need_weights = len(args) > n + 1 and args[n + 1]
        return (self.eager if need_weights else self.compiled)(tokens, state, *args)


class CheckedStep:
    """A compiled search step that must earn its place. Its first ``warmup`` calls run it alone (they compile);
    the next ``trials`` calls run it (twice: the second call is timed) and ``eager`` (the same step, uncompiled, or
    whatever else would run in its place: ``against`` names it) on the same inputs and answer with the eager
    outputs. If the compiled step failed, gave other outputs (choices that differ, or scores beyond ``tolerance``,
    in what the search reads: ``compare``, by default :func:`same_outputs`; the next states are not compared), or
    took longer per call (median) than the eager one, every later call runs the eager step, and one line on stderr
    says why; otherwise the compiled step runs from then on.

    Compiling is a bet that can lose: on some CPUs the lowering falls back to graphs far slower than eager
    decoding, and nothing else would notice."""

    def __init__(self, name: str, compiled, eager, warmup: int = 4, trials: int = 6, tolerance: float = 1e-3,
                 compare=None, against: str = "the eager step"):
        self.name, self.compiled, self.eager, self.against = name, compiled, eager, against
        self.warmup, self.trials, self.tolerance = warmup, trials, tolerance
        self.compare = same_outputs if compare is None else compare  # (ours, theirs, tolerance) -> agree
        self.calls, self.times, self.chosen, self.reason = 0, ([], []), None, None

    def __call__(self, *args):
        if self.chosen is not None:
            return self.chosen(*args)
        self.calls += 1
        try:
            if self.calls <= self.warmup:
                return self.compiled(*args)
            # timed on a second call: a first call with new sizes pays once for them (oneDNN makes a kernel for each
            # new shape of a packed product, some 0.3 ms against 0.03 ms for the product; AMD EPYC Zen 5), and the
            # first batches of a file each bring new sizes. Timed on first calls, the encoder of 64 sentences
            # compiled with packed products lost to eager encoding by 2-5% in the trials and was dropped, and greedy
            # decoding of the test set then ran about 15% slower on every later pass
            self.compiled(*args)
            start = time.perf_counter()
            ours = self.compiled(*args)
            middle = time.perf_counter()
        except Exception as e:  # noqa: BLE001 -- a compiled step that fails is replaced, never the search's end
            self._decide(f"failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            return self.eager(*args)
        theirs = self.eager(*args)
        end = time.perf_counter()
        self.times[0].append(middle - start)
        self.times[1].append(end - middle)
        if not self.compare(ours, theirs, self.tolerance):
            self._decide(f"gave other outputs than {self.against}")
        elif len(self.times[0]) >= self.trials:
            compiled, eager = (sorted(t)[len(t) // 2] for t in self.times)
            if compiled >= eager:
                self._decide(f"took {compiled * 1e3:.2f} ms a call where {self.against} took {eager * 1e3:.2f} ms")
            else:
                self.chosen = self.compiled
        return theirs

    def _decide(self, why: str) -> None:
        self.chosen, self.reason = self.eager, why
        print(f"attnkit: warning: the compiled {self.name} {why} on the first batches; {self.against} runs "
              "instead", file=sys.stderr, flush=True)


def same_outputs(a, b, tolerance: float) -> bool:
    """Whether two steps' outputs agree in what the search reads of them (:func:`_as_read`): the same structure,
    integer and boolean tensors equal, floating ones within ``tolerance`` (relative and absolute; infinities where
    the other has the same)."""
    return _agree(_as_read(a), _as_read(b), lambda x, y: torch.allclose(x, y, rtol=tolerance, atol=tolerance,
                                                                        equal_nan=True))


def close_in_norm(a, b, tolerance: float) -> bool:
    """Whether two encoders' outputs (the keys and values every step attends over) agree: the same structure,
    integer and boolean tensors equal, and each floating tensor x within ``tolerance`` of y in relative norm,
    ||x - y|| <= tolerance ||y|| over the finite elements (infinities and NaNs where the other has the same).

    An element-wise bound is the wrong test here: attention reads these tensors as weighted sums over positions,
    and at bf16 an encoder compiled into fused kernels (fp32 between the operations that eager bf16 rounds after
    each) differs from eager encoding by a bf16 rounding almost everywhere and by a few in one element of a
    hundred thousand. On the Multi30k test batches both were 0.7-0.9% from fp32's encoding in norm, the compiled
    one the closer, while one element of a batch lay outside 4 bf16 epsilons of eager's."""

    def close(x: Tensor, y: Tensor) -> bool:
        finite = torch.isfinite(y)
        if not torch.equal(finite, torch.isfinite(x)) or not torch.equal(x[~finite].nan_to_num(),
                                                                          y[~finite].nan_to_num()):
            return False
        return bool(torch.linalg.vector_norm(x[finite] - y[finite]) <= tolerance * torch.linalg.vector_norm(y[finite]))

    return _agree(a, b, close)


def _agree(a, b, close) -> bool:
    """The same structure of tensors, integer and boolean ones equal, floating ones ``close(x, y)`` (as fp32)."""
    xs, ys = list(_tensors(a)), list(_tensors(b))
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not (close(x.float(), y.float()) if x.is_floating_point() else torch.equal(x, y)):
            return False
    return True


def _as_read(x):
    """A step's outputs as the search reads them. Of a beam step's 2k ranked candidates the search reads the row
    and score of those that end a hypothesis only (the k that go on are read through ``rows``, ``tokens`` and
    ``scores``): the rest are set to -1 and 0, since which of two near-equal candidates ranks first among them
    changes nothing, and steps whose scores differ within their tolerance may rank them either way."""
    if isinstance(x, BeamStep):
        return x._replace(candidate_rows=x.candidate_rows.masked_fill(~x.ending, -1),
                          candidate_scores=x.candidate_scores.masked_fill(~x.ending, 0.0))
    return x


def _tensors(x):
    """Every tensor inside ``x`` (tuples, lists, dicts, dataclasses), in a fixed order; not a decoding state's,
    which a compiled step may lay out otherwise (its reordering applied or pending) for the same next step."""
    if isinstance(x, DecodingState):
        return
    if isinstance(x, Tensor):
        yield x
    elif isinstance(x, (tuple, list)):
        for item in x:
            yield from _tensors(item)
    elif isinstance(x, dict):
        for key in sorted(x, key=str):
            yield from _tensors(x[key])
    elif dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            yield from _tensors(getattr(x, f.name))


class _OutputProjection(nn.Module):
    """``nn.Linear`` with its weight kept as [d_in, d_out]: ``x @ W^T`` without a transposed operand; or, with
    ``prepack`` (for a frozen compiled model), a oneDNN product with the weight packed once, when compiled."""

    def __init__(self, linear: nn.Linear, prepack: bool = False):
        super().__init__()
        self.prepack = prepack
        weight = linear.weight.detach()
        self.register_buffer("weight", weight.t().contiguous())  # [d_in, d_out]
        # [d_out, d_in], the layout oneDNN packs from (a frozen graph keeps only the weights it reads)
        self.register_buffer("packed_from", weight.clone() if prepack else None)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: Tensor) -> Tensor:
        # packed, the product of one row (a graph whose sizes are fixed, for one sentence's greedy steps) was slower
        # than the plain one, and faster from five rows on (AMD EPYC Zen 4)
        one_row = all(isinstance(n, int) for n in x.shape[:-1]) and x.numel() == x.size(-1)
        if self.prepack and torch.compiler.is_compiling() and not one_row:
            # frozen, the packing has only constant inputs, so Inductor runs it once, when it compiles
            packed = torch.ops.mkldnn._reorder_linear_weight(self.packed_from, None)
            return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
        out = x @ self.weight
        return out if self.bias is None else out + self.bias


@functools.cache
def _register_fake_weight_packing() -> None:
    """Let torch.compile trace ``mkldnn::_reorder_linear_weight``: PyTorch gives it no fake kernel, as Inductor only
    inserts it after tracing. The packed weight is opaque; the product's shape rule reads only its size."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key("mkldnn::_reorder_linear_weight", "Meta"):
        torch.library.register_fake("mkldnn::_reorder_linear_weight")(
            lambda weight, batch_size=None: weight.new_empty(weight.shape))


def _store_column_major(model: nn.Module) -> None:
    """Every ``nn.Linear`` weight [out, in] of ``model`` stored column-major: ``F.linear`` then multiplies by a
    contiguous [in, out] matrix, which BLAS runs faster at a decoding step's few rows (see :func:`compile_step`).
    Slices of the weight (the attention's Q and K/V thirds) are row ranges, which stay plain matrices for BLAS."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.stride(0) != 1:
            module.weight = nn.Parameter(module.weight.detach().t().contiguous().t(), requires_grad=False)


def _packing_pays(weights: list[Tensor], rows: int = 32, repeats: int = 20) -> bool:
    """Whether oneDNN's packed products ``x @ weight^T``, one for each of ``weights`` ([out, in]), beat the plain ones
    with each weight transposed once, on this machine: the better of five timings of ``repeats`` rounds of the
    products of ``rows`` rows each."""
    xs = [w.new_empty(rows, w.size(1)).normal_() for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    plain = [w.t().contiguous() for w in weights]

    def best(product) -> float:
        product()  # warm-up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(repeats):
                product()
            times.append(time.perf_counter() - start)
        return min(times)

    def packed_products():
        for x, w in zip(xs, packed):
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    def plain_products():
        for x, w in zip(xs, plain):
            x @ w

    return best(packed_products) < best(plain_products)


def _keep_identities_and_constants(guard_entries) -> list[bool]:
    """Dynamo's guards for a compiled model, which is not changed after :func:`compile_step`: of those on its
    modules' attributes, only the identity checks (of the weights, when frozen) and the constants' (flags such as
    ``_OutputProjection.prepack``). Every compiled model shares ``step``'s code, and so the graphs Dynamo keeps for
    it: without the identity checks a second frozen model in the same process ran the first one's graph, whose
    weights are constants; without the constants' a frozen model ran an unfrozen model's graph, which reads the
    output projection's weight in the other layout (both tested). Of ~1,200 guards, Dynamo's cache lookup for a
    5-beam step took 67-77 us with the frozen model's 74 identity checks alone against 117-234 us with all
    (torch.profiler, three runs each); decoding end to end showed no difference beyond this machine's noise."""
    return [e.guard_type in ("ID_MATCH", "CONSTANT_MATCH") or not e.orig_guard.source.is_unspecialized_nn_module()
            for e in guard_entries]


def _frozen(compiled):
    """Run ``compiled`` with Inductor's freezing on. ``torch.compile(options={"freezing": True})`` is not enough:
    Dynamo reads the global setting when it traces (to make the weights graph constants, not inputs), and it
    traces inside a call, whenever a new shape needs a graph; so the setting is on for every call."""
    import torch._inductor.config as inductor_config

    # one patch object: entering it costs ~6 us, making one 18. Inductor would prepack every linear layer for
    # oneDNN (dynamic shapes rule out MKL's packing): only the output projection packs itself (_OutputProjection)
    freezing = inductor_config.patch({"freezing": True, "cpp.weight_prepack": False})

    def call(*args, **kwargs):
        with freezing, without_weight_packing():
            return compiled(*args, **kwargs)

    return call


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
