"""Search steps compiled ahead of time: ``torch.export`` and AOTInductor, one call into a shared library a step.

:func:`~attnkit.fast.compile.compile_step`'s graphs run Inductor's kernels behind Python: Dynamo's guards and the
bytecode that takes the state apart and builds it again, AOTAutograd's wrappers, sizes turned into tensors. For
one sentence the Multi30k model's compiled greedy step took 612-697 us, about half of it in its kernels; exported
with the state as a flat list of tensors and compiled by AOTInductor, the same step took 307-322 us (and 2.15
against 2.6 ms for 64 sentences; AVX-512 Xeon, one thread).

A state can be exported if it is a flat list of tensors (``state.tensors()``, and the classmethod
``from_tensors(tensors, beams)`` that builds it again, its offset read from a size): the fast decoder's
:class:`~attnkit.fast.decoding.GroupedDecoderState`. Other states, and steps that return attention weights, run the
fallback (``compile_step``'s torch.compile graph).

Each package holds the model's weights as constants of its own: a search makes two (its first step, its later
steps), so greedy decoding and beam search together hold four copies of the weights beside the model's.
"""

from __future__ import annotations

import tempfile
import warnings
from functools import partial
from pathlib import Path

import sympy
import torch
import torch.fx.experimental._config as fx_config
from torch import Tensor, nn
from torch._guards import detect_fake_mode
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.export import Dim
from torch.utils._sympy.numbers import int_oo

from attnkit.fast.decoding import GroupedDecoderState


class AheadOfTimeStep:
    """``search_step`` (:func:`~attnkit.fast.compile.greedy_search_step` or ``beam_search_step``)
    of ``model.step`` as ``step`` (its eager version), called as a search calls it: ``(tokens, state, *tensors,
    t, *flags)``, where the first flag is ``need_weights``.

    The first call of each kind (state type and beams, beam size, first step or not) runs eagerly and exports and
    compiles a package from its inputs' shapes; later calls of that kind run the package. Sizes stay symbols (a
    graph made for one sentence at cache length 2 serves 64 sentences and length 30); sizes the graph bounds
    (the positional table's length) are checked before each call, and the fallback runs outside them.
    """

    def __init__(self, model: nn.Module, step, search_step, fallback):
        self.model, self.step, self.search_step, self.fallback = model, step, search_step, fallback
        self.packages: dict[tuple, _Package] = {}
        self._directory = tempfile.TemporaryDirectory(prefix="attnkit-aoti-")  # removed with this object

    def __call__(self, tokens: Tensor, state, *args):
        n = next((i for i, a in enumerate(args) if not isinstance(a, Tensor)), len(args))
        tensors, (t, *flags) = list(args[:n]), args[n:]
        if (flags and flags[0]) or not tokens.is_cpu or not exportable(state) or t != state.offset:
            return self.fallback(tokens, state, *args)
        # sizes that are constants of a graph (the beam size) tell graphs apart, as does beam search's first step
        # (t == 0), which makes the beams
        key = (type(state), state.beams, t == 0, *(tuple(x.size(d) for d in _constant_dims(x)) for x in tensors))
        flat = [tokens, *state.tensors(), *tensors]
        if key not in self.packages:
            if not any(n == 1 for x in flat for n in x.shape[1:]):  # not the caches at t == 1: see _Package.build
                self.packages[key] = self._build(flat, state)
            return partial(self.search_step, self.step)(tokens, state, *args)  # eagerly, while there is no graph
        package = self.packages[key]
        if package is None or not package.fits(flat):
            return self.fallback(tokens, state, *args)
        # the graph reads its inputs with the strides of a contiguous tensor (below)
        return package.run([x if x.is_contiguous() else x.contiguous() for x in flat])

    def _build(self, flat: list[Tensor], state) -> _Package | None:
        path = Path(self._directory.name) / f"step{len(self.packages)}.pt2"
        try:
            return _Package.build(self, flat, state, path)
        except Exception as e:  # noqa: BLE001 -- any failure to export or compile leaves torch.compile's graph
            warnings.warn(f"{self.search_step.__name__} could not be compiled ahead of time, torch.compile runs it: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", stacklevel=3)
            return None


def exportable(state) -> bool:
    return isinstance(state, GroupedDecoderState)


def _constant_dims(x: Tensor) -> range:
    """The dims of a search step's tensor argument (after the state) that are constants of its graph: those after
    the first of a float one (beam_step's scores [m, k]: the beam size)."""
    return range(1, x.dim()) if x.is_floating_point() else range(0)


class _Package:
    """One exported and compiled search step: its runner, how to build the step's result from the flat outputs
    (inputs that come back unchanged are taken from the inputs, not copied through the graph), and the bounds
    of its inputs' sizes: [(input, dim, lowest, highest)]."""

    def __init__(self, runner, structure, passed: list[int | None], bounds: list[tuple[int, int, int, int]]):
        self.runner, self.structure, self.passed, self.bounds = runner, structure, passed, bounds

    @classmethod
    def build(cls, aot: AheadOfTimeStep, flat: list[Tensor], state, path: Path) -> _Package:
        """Export and compile ``aot``'s search step for inputs like ``flat`` (tokens, ``state.tensors()``, the
        other tensors) into ``path``."""
        state_type, beams, state_size = type(state), state.beams, len(state.tensors())
        recorded: dict = {}

        class Flat(nn.Module):
            def __init__(self):
                super().__init__()
                self.model = aot.model  # its weights become the package's constants

            def forward(self, tokens, *inputs):
                state = state_type.from_tensors(list(inputs[:state_size]), beams)
                out = aot.search_step(aot.step, tokens, state, *inputs[state_size:], state.offset)
                leaves: list[Tensor] = []
                recorded["structure"] = _flatten(out, leaves)
                index = {id(x): i for i, x in enumerate((tokens, *inputs))}
                recorded["passed"] = [index.get(id(x)) for x in leaves]
                return tuple(x for x in leaves if id(x) not in index)

        # every size a symbol (AUTO: whatever the trace finds them to be), but the constant ones and the first
        # step's empty caches (their length is a constant of the first step's graph)
        dynamic = [{d: Dim.STATIC if n == 0 else Dim.AUTO for d, n in enumerate(x.shape)} for x in flat]
        for i in range(1 + state_size, len(flat)):
            dynamic[i].update({d: Dim.STATIC for d in _constant_dims(flat[i])})
        # Traced with one sentence, a graph computed wrong rows for three (an Inductor kernel specialised on the
        # size 1 it saw, though the exported program was right): the example has every input twice over along
        # its first dim, the batch's, which all of them are; only sizes matter to the trace, not values. A call
        # with another dim of size 1 (the caches at t == 1) does not build. The example's tensors are fresh and
        # contiguous, as the graph reads its inputs (a size-1 dim may have any stride), and sizes that happen to
        # be equal stay separate symbols.
        example = tuple(torch.cat([x, x]) if x.dim() else x for x in flat)
        with torch.no_grad(), fx_config.patch(backed_size_oblivious=True, use_duck_shape=False):
            program = torch.export.export(Flat(), example, dynamic_shapes=(dynamic[0], tuple(dynamic[1:])),
                                             strict=False)
            options = {"post_grad_custom_post_pass": _BiasAddAfterProduct()}
            torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
        runner = torch._inductor.aoti_load_package(str(path))
        return cls(runner, recorded["structure"], recorded["passed"], _bounds(program))

    def fits(self, flat: list[Tensor]) -> bool:
        return all(low <= flat[i].size(d) <= high for i, d, low, high in self.bounds)

    def run(self, flat: list[Tensor]):
        outputs = iter(self.runner.loader.run(flat))
        leaves = iter([next(outputs) if i is None else flat[i] for i in self.passed])
        return _unflatten(self.structure, leaves)


class _BiasAddAfterProduct(CustomGraphPass):
    """``addmm(bias, x, w)`` -> ``mm(x, w) + bias``: Inductor then adds the bias in the pointwise kernel that
    reads the product next (the residual's add and layer norm, the ReLU), where the library's addmm first copies
    the bias into its output, a copy and an expand per linear layer (~6 us a call at 40 rows; torch.profiler).
    Inductor does this on GPUs only."""

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
        return get_hash_for_files((__file__,))


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


def _flatten(x, leaves: list[Tensor]):
    """A search step's result as its tensors (appended to ``leaves``) and the structure to build it again."""
    if isinstance(x, Tensor):
        leaves.append(x)
        return "tensor"
    if x is None:
        return None
    if exportable(x):
        tensors = x.tensors()
        leaves.extend(tensors)
        return ("state", type(x), x.beams, len(tensors))
    if isinstance(x, tuple):
        return ("tuple", type(x), [_flatten(v, leaves) for v in x])
    raise TypeError(f"cannot export a search step that returns {type(x).__name__}")


def _unflatten(structure, leaves):
    if structure is None:
        return None
    if structure == "tensor":
        return next(leaves)
    if structure[0] == "state":
        _, state_type, beams, n = structure
        return state_type.from_tensors([next(leaves) for _ in range(n)], beams)
    _, kind, parts = structure
    values = [_unflatten(p, leaves) for p in parts]
    return kind(*values) if hasattr(kind, "_fields") else kind(values)
