"""Decoding compiled ahead of time: the search steps and the encoder exported with ``torch.export`` and compiled
by AOTInductor into packages (:mod:`attnkit.fast.aot`), each checked against the eager step it replaces.

:func:`compile_step` returns a :class:`CompiledDecoder`: the decoding interface of the model it was given
(``encode``, ``init_state``, ``step``, ``search_steps``) over a copy of the model prepared for inference
(column-major weights, optionally a packed output layer). Outputs may round differently from eager ones:
``bench/translate_throughput.py`` counts the outputs that differ and scores both; the tests check equal hypotheses
on small models.
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
from attnkit.errors import AttnkitError
from attnkit.fast import aot
from attnkit.fast.decoding import FastDecoder, GroupedDecoderState, beam_step_from_logits, greedy_step_from_logits
from attnkit.fast.precision import INT8_TOLERANCE, Int8Linear
from attnkit.fast.runtime import use
from attnkit.models.contract import DecodingState, device_of
from attnkit.models.transformer import Memory

# the search steps that compile, by the name the searches ask for: the model's step with the choice of the next
# tokens (one graph, where the choice alone was some 35 small eager operations a step)
SEARCH_STEPS = {"greedy_step": greedy_step_from_logits, "beam_step": beam_step_from_logits}


def compile_step(model, freeze: bool = False, pack_output: bool | None = None, check: bool = True,
                 cache: bool = False, pack_wide: bool | None = None) -> CompiledDecoder:
    """A decoder of ``model`` (a model of the contract or a :class:`FastDecoder` whose state is the grouped one, a
    flat list of tensors: the Transformer families') whose search steps and encoder run packages compiled ahead of
    time (:mod:`attnkit.fast.aot`), for inference on the CPU. The decoder holds a copy of the model, prepared for
    inference: the model itself is left as it was. What a package does not cover (attention weights asked for,
    sampling's ``step``, sizes outside a package's bounds, another device) runs the eager step.

    * Shapes are symbols: one package serves every batch size and length of its kind (a search that began with one
      sentence, or with many, the first beam step), compiled on the first call of that kind, which runs eagerly.
    * Every linear weight [out, in] is stored column-major (same values and shape, strides (1, out)), so that
      ``x @ W^T`` hands BLAS a contiguous [in, out] matrix: faster at a decoding step's few rows.
    * ``freeze``: the output projection may be a oneDNN product with its weight packed once (``pack_output``;
      None: as in the packages ``cache`` keeps, else if that measures faster on this machine, on 32 rows), an fp32
      weight only: AOTInductor cannot lower the packed product of a bf16 one.
    * ``pack_wide`` (frozen, fp32 weights): searches that begin with 16 sentences or more, and the encoder of as
      many, run packages whose linear layers are oneDNN products of weights packed once
      (:data:`attnkit.fast.aot.WIDE_GRAPH`); None: as in the packages ``cache`` keeps, else if that measures
      faster on this machine, on 64 rows of the model's own layers.
    * ``check``: each search step is checked against the eager one on the first real batches, and kept only if
      it gives the same outputs and is faster (:class:`CheckedStep`); without, the packages always run.
    * ``cache``: the packages are kept in, and later loaded from, the user's cache
      (:func:`attnkit.fast.aot.cache_directory`), so that only the first process to decode with a model
      compiles them.

    What each of these gains, measured on which machine, is in docs/performance.md."""
    return CompiledDecoder(model, freeze, pack_output, check, cache, pack_wide)


class CompiledDecoder(nn.Module):
    """A :class:`FastDecoder` over a copy of the model, its search steps and encoder compiled ahead of time
    (:func:`compile_step`)."""

    def __init__(self, model, freeze: bool = False, pack_output: bool | None = None, check: bool = True,
                 cache: bool = False, pack_wide: bool | None = None):
        super().__init__()
        inner = model.model if isinstance(model, FastDecoder) else model
        if device_of(inner).type != "cpu":
            raise AttnkitError(f"a model on {device_of(inner)} decodes eagerly there: its steps compile ahead of time "
                               "for the CPU only")
        if not FastDecoder(inner).grouped:
            raise AttnkitError(f"a {inner.family} model's decoding state is not a flat list of tensors, so its steps "
                               "do not compile ahead of time: it decodes eagerly")
        inner = copy.deepcopy(inner).eval()
        use(inner, "fused_attention", "decoding_attention")
        can_pack = freeze and torch.backends.mkldnn.is_available()
        output = getattr(inner, "output", None)
        packs = isinstance(output, nn.Linear) and output.weight.dtype == torch.float32 and can_pack
        layers = [m.weight.detach() for m in inner.modules() if isinstance(m, nn.Linear) and m is not output]
        # an int8 model's fp32 products: by slices of its layers' dequantized weights (cross-attention's queries and
        # memory), which a wide graph packs as it packs fp32 layers (its integer products stay torch._int_mm)
        layers += [m.weight for m in inner.modules() if isinstance(m, Int8Linear)]
        packs_layers = can_pack and bool(layers) and all(w.dtype == torch.float32 for w in layers)
        # the cache directory of the packages by (output projection packed, wide searches' layers packed)
        kept: dict[tuple[bool, bool], Path] = {}
        if cache:
            kept = {(out, wide): aot.cache_directory(inner, freeze=freeze, pack_output=out, pack_wide=wide)
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
        self.wide_sentences = aot.WIDE_SENTENCES if pack_wide else None
        prepack = False
        if isinstance(output, nn.Linear):
            prepack = packs and (_packing_pays([output.weight.detach()]) if pack_output is None else pack_output)
            if prepack:
                _register_fake_weight_packing()
            inner.output = _OutputProjection(output, prepack)
        _store_column_major(inner)
        self.decoder = FastDecoder(inner)
        self.family, self.capabilities, self.cfg = inner.family, inner.capabilities, inner.cfg
        self.step = self.decoder.step  # sampling's step, which no package covers
        directory = kept.get((prepack, pack_wide))
        # greedy decoding's first step is a later step over an empty cache (one package); beam search's first step
        # over a batch makes the beams, a package of its own
        self._search_steps = {name: aot.AheadOfTimeStep(name, self.decoder, self.step, fn, directory,
                                                        first_step_apart=name == "beam_step", pack_wide=pack_wide)
                              for name, fn in SEARCH_STEPS.items()}
        self._aot_encoder = aot.AheadOfTimeEncoder(self.decoder, directory, pack_wide)
        self._prepare = lambda src: self._aot_encoder(src).tensors()  # src -> the state's tensors, one package
        self._encoders: dict[str, CheckedStep] = {}  # the encoder's packages, checked by kind of source
        if check:  # each compiled search step proves itself against the eager one on the first real batches
            # scores may differ by float rounding: a few units of the model's precision (bf16's is 2^-7); at int8 a
            # rounding difference upstream moves an activation across a quantization step, so the compiled and eager
            # steps differ by int8's own error: the 5% of a score that int8 decoding is held to against fp32
            dtype = next(inner.parameters()).dtype
            tolerance = 1e-3 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
            if any(isinstance(m, Int8Linear) for m in inner.modules()):
                tolerance = INT8_TOLERANCE
            self._search_steps = {name: CheckedStep(name, step, partial(SEARCH_STEPS[name], self.step),
                                                    tolerance=tolerance) for name, step in self._search_steps.items()}
            # each kind of source is checked apart, as each has a package of its own: the package of a batch beat
            # eager encoding threefold for one sentence and lost to it by a few percent for 64 (AMD EPYC Zen 4), so
            # the first requests' size would otherwise decide for every later one (a server warmed up with a batch
            # would encode every single sentence eagerly). One sentence's package is checked against encoding it as
            # a batch is encoded: the package it replaces, where there is one
            names = {"one sentence": "one sentence", "batch": "a batch",
                     **({"wide": f"a batch of {aot.WIDE_SENTENCES} sentences or more"} if pack_wide else {})}
            self._encoders = {
                kind: CheckedStep(f"encoder of {name}", self._prepare,
                                  (lambda src: self._aot_encoder.otherwise(src).tensors()) if kind == "one sentence"
                                  else (lambda src: self._aot_encoder.eager(src).tensors()),
                                  tolerance=tolerance, compare=close_in_norm,
                                  against="encoding as a batch" if kind == "one sentence" else "the eager step")
                for kind, name in names.items()}
            self._prepare = lambda src: self._encoders[self._aot_encoder.kind(src)](src)

    def encode(self, src: Tensor, need_weights: bool = False):
        """The encoder's package, which also makes the decoder's state (its memory, with that state, is a
        :class:`PreparedMemory`, which :meth:`init_state` hands on); the eager encoder where weights are asked for."""
        if need_weights:
            return self.decoder.encode(src, need_weights=True)
        state = GroupedDecoderState.from_tensors(self._prepare(src), 1)
        return PreparedMemory(state.memory.states, state.memory.padding_mask, [], state)

    def init_state(self, memory) -> DecodingState:
        if isinstance(memory, PreparedMemory) and memory.state is not None:
            return memory.state
        return self.decoder.init_state(memory)

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
        step = self._search_steps[name]
        if isinstance(step, CheckedStep):
            if step.chosen is not step.compiled:
                return None
            step = step.compiled
        return step if isinstance(step, aot.AheadOfTimeStep) else None

    def checks(self) -> dict[str, CheckedStep]:
        """The compiled steps that are checked against their eager versions (``check``), by name: the search steps,
        and the encoder's packages, one for each kind of source (one sentence, a batch, a wide batch)."""
        steps = [s for s in self._search_steps.values() if isinstance(s, CheckedStep)]
        return {s.name: s for s in [*steps, *self._encoders.values()]}

    def unlowered(self) -> list[str]:
        """The checks (named as in :meth:`checks`) whose ahead-of-time lowering failed: they run the eager step
        whatever their check chose."""
        failed = [name for name, step in self.checks().items()
                  if isinstance(step.compiled, aot.AheadOfTimeStep) and None in step.compiled.packages.values()]
        encoder = self._aot_encoder
        failed += [check.name for kind, check in self._encoders.items()
                   if kind in encoder.packages and encoder.packages[kind] is None]
        return failed

    def seal(self) -> list[str]:
        """From now on compile nothing: the kinds of search step already compiled ahead of time (or loaded) run
        their graphs, any other kind the eager step (:attr:`AheadOfTimeStep.sealed`). A server seals its decoders
        after warming them up, so that no request waits for a compiler. -> the names of the sealed steps."""
        sealed = []
        for name, step in self._search_steps.items():
            inner = step.compiled if isinstance(step, CheckedStep) else step
            if isinstance(inner, aot.AheadOfTimeStep):
                inner.sealed = True
                sealed.append(name)
        self._aot_encoder.sealed = True
        sealed.append("encoder")
        return sealed


@dataclasses.dataclass
class PreparedMemory(Memory):
    """A memory that comes with the decoder's state made from it (by the encoder's package); ``select`` gives a
    plain :class:`~attnkit.models.transformer.Memory`, whose state ``init_state`` makes again."""

    state: DecodingState | None = None


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
    """Let ``torch.export`` trace ``mkldnn::_reorder_linear_weight``: PyTorch gives it no fake kernel, as Inductor only
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
