"""``attnkit bench complexity``: one layer of RNN, convolution and self-attention, measured as n and d vary.

The lectures' table (Vaswani et al. 2017, table 1), for sequence length n, width d, kernel k:

    layer            complexity per layer   sequential operations   maximum path length
    self-attention   O(n^2 d)               O(1)                    O(1)
    recurrent        O(n d^2)               O(n)                    O(n)
    convolutional    O(k n d^2)             O(1)                    O(n/k) contiguous, O(log_k n) dilated

The layers: ``nn.GRU`` (d -> d), attnkit's gated convolution block (``models.conv.GatedConv``,
kernel k) and attnkit's ``MultiHeadAttention`` (d_head 64 as in the paper), both with its weights
materialised (the formula: the n x n matrix is built) and through the fused kernel. What is measured:

- **time**: forward, then backward of the output's sum; the median of repeats after a warm-up,
  on ``threads`` threads (default 1: it compares the work the layers do, not how each parallelises,
  and leaves the machine's other core alone).
- **FLOPs** of the forward pass, counted by ``torch.utils.flop_counter`` (matrix products and
  convolutions; the fused attention kernel is not counted, so it gets none).
- **memory**: bytes of the tensors autograd keeps for the backward pass, through
  ``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters excluded. Not peak
  memory: on a CPU PyTorch keeps no allocator statistics (``torch.cuda.max_memory_allocated`` has no
  CPU twin), tracemalloc does not see torch's allocations, and a process's RSS moves in pages and
  keeps freed blocks cached. What grows with n — the RNN's n hidden states, the n x n attention
  weights — is exactly what is saved for backward, and this count is exact and repeatable.
- **sequential operations**: every ATen kernel the forward pass launches is recorded
  (``TorchDispatchMode``) with the tensors it reads and writes; D(n) is the longest chain of kernels
  each needing an earlier one's output. A layer that handles positions one after another has a
  chain growing by a fixed delta = D(n+1) - D(n) kernels per position: between n and 2n positions it
  grows by n delta, so the layer waits on itself (D(2n) - D(n)) / delta = n times. A chain that does
  not grow with n means every position is computed in one parallel step: 1.
- **maximum path length**: the fewest position-to-position hops from input 0 to output n-1,
  found with autograd as the first depth at which d y_{n-1} / d x_0 != 0. For convolution and
  self-attention a hop is a layer (stacked until the dependency appears); for the RNN it is one
  transition h_{t-1} -> h_t, counted by running the recurrence as sweeps h^m_t = cell(x_t, h^{m-1}_{t-1})
  over all positions at once (after n sweeps they equal the GRU's outputs, which is checked): the
  first sweep only reads the input, each later one carries it one position further.
  Three convolutions: centred (the encoder's, kernel reach (k-1)/2 each side), causal (a decoder's,
  k-1 to the left) and causal with dilation k^l at layer l (WaveNet).

It then finds, for each d, the n from which self-attention costs more than the RNN — in time and in
FLOPs; by the FLOP count of these layers (8nd^2 + 4n^2 d against 12nd^2) that is exactly n = d, the
lectures' n^2 d = n d^2. Results go to ``bench/results/complexity.json`` and a plot beside it.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from attnkit.models.conv import GatedConv
from attnkit.nn import MultiHeadAttention

FULL = dict(ns=(16, 32, 64, 128, 256, 512, 1024), ds=(64, 128, 256, 512), batch=4, repeats=3,
            path_ns=(8, 16, 32, 64))
QUICK = dict(ns=(8, 16, 32), ds=(16, 32), batch=2, repeats=1, path_ns=(8, 16, 32))
KERNEL = 3
LAYERS = ("rnn", "conv", "self_attention", "self_attention_fused")

LECTURES = {  # Vaswani et al. 2017, table 1
    "self_attention": ("O(n^2 d)", "O(1)", "O(1)"),
    "rnn": ("O(n d^2)", "O(n)", "O(n)"),
    "conv": ("O(k n d^2)", "O(1)", "O(n/k)"),
    "conv_causal": ("", "", "O(n/k)"),
    "conv_dilated": ("", "", "O(log_k n)"),
}


# --- one layer as a function x [B, n, d] -> [B, n, d]


def make_layer(kind: str, d: int, kernel: int = KERNEL, seed: int = 0, dtype=torch.float32):
    """-> (module, forward function). Random weights: only shapes matter here."""
    torch.manual_seed(seed)
    if kind == "rnn":
        module = nn.GRU(d, d, batch_first=True)
        return module.to(dtype), lambda x: module(x)[0]
    if kind.startswith("conv"):
        module = GatedConv(d, kernel, causal=kind != "conv")
        return module.to(dtype), module
    module = MultiHeadAttention(d, max(1, d // 64))
    if kind == "self_attention":  # the formula, through attend: the n x n weights are built
        return module.to(dtype), lambda x: module(x, need_weights=True)[0]
    from attnkit.fast import use

    use(module, "fused_attention")  # PyTorch's fused kernel: the weights are never materialised
    return module.to(dtype), lambda x: module(x)[0]


def time_layer(f, x: Tensor, repeats: int) -> tuple[float, float]:
    """-> median forward and backward seconds (after one warm-up run)."""
    fwd, bwd = [], []
    for i in range(repeats + 1):
        x.grad = None
        start = time.perf_counter()
        y = f(x)
        mid = time.perf_counter()
        y.sum().backward()
        end = time.perf_counter()
        if i:
            fwd.append(mid - start)
            bwd.append(end - mid)
    return statistics.median(fwd), statistics.median(bwd)


def count_flops(f, x: Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        f(x)
    return int(counter.get_total_flops())


def saved_bytes(module: nn.Module, f, x: Tensor) -> int:
    """Bytes autograd keeps between forward and backward: each storage once, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(x)
    return sum(seen.values())


# --- sequential operations: the critical path of the kernels launched


class CriticalPath(TorchDispatchMode):
    """Records every kernel; ``depth`` is the longest chain of kernels each reading an earlier one's output.

    Tensors are tracked by storage, so a view reads its base's depth and an in-place kernel
    (sigmoid_, add_, copy_ into a buffer) moves its target's depth forward.
    """

    def __init__(self):
        super().__init__()
        self.ready: dict[int, int] = {}  # storage -> depth at which its current contents exist
        self.depth = 0
        self.alive: list[Tensor] = []  # keep storages alive so a freed address is not mistaken for another

    @staticmethod
    def _key(t: Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor)]
        depth = 1 + max((self.ready.get(self._key(t), 0) for t in inputs), default=0)
        written = [a for a, spec in zip(args, func._schema.arguments)
                   if isinstance(a, Tensor) and spec.alias_info is not None and spec.alias_info.is_write]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        for t in outputs + written:
            self.ready[self._key(t)] = depth
        self.alive += outputs
        self.depth = max(self.depth, depth)
        return out


def kernel_depth(kind: str, n: int, d: int = 8) -> int:
    _, f = make_layer(kind, d)
    x = torch.randn(1, n, d)
    with torch.no_grad(), CriticalPath() as path:
        f(x)
    return path.depth


def sequential_steps(kind: str, n: int) -> float:
    """(D(2n) - D(n)) / (D(n+1) - D(n)) when the critical path grows with n, else 1 (see the module docstring)."""
    d_n, d_next, d_double = kernel_depth(kind, n), kernel_depth(kind, n + 1), kernel_depth(kind, 2 * n)
    if d_double == d_n:
        return 1
    delta = d_next - d_n
    if delta <= 0:
        return math.nan  # the path grows with n but not position by position: not a count we can read off
    steps = (d_double - d_n) / delta
    return int(steps) if steps == int(steps) else steps


# --- maximum path length: hops until output n-1 depends on input 0


def _depends(y: Tensor, x: Tensor) -> bool:
    """Does y[:, -1] depend on x[:, 0]?"""
    (grad,) = torch.autograd.grad(y[:, -1].sum(), x, retain_graph=True, allow_unused=True)
    return grad is not None and bool(grad[:, 0].abs().max() > 0)


def path_length(kind: str, n: int, d: int = 4, kernel: int = KERNEL) -> int:
    """Hops from input 0 to output n-1, measured with autograd (float64, so no gradient underflows)."""
    x = torch.randn(1, n, d, dtype=torch.float64, requires_grad=True)
    if kind == "rnn":
        return _rnn_path_length(x)
    y, dilation = x, 1
    for hops in range(1, 4 * n + 2):
        if kind.startswith("conv"):
            layer = GatedConv(d, kernel, causal=kind != "conv", dilation=dilation).double()
            dilation *= kernel if kind == "conv_dilated" else 1
        else:
            layer = MultiHeadAttention(d, 1).double()
            layer = (lambda m: lambda h: m(h, need_weights=True)[0])(layer)
        y = layer(y)
        if _depends(y, x):
            return hops
    raise RuntimeError(f"{kind}: output {n - 1} never came to depend on input 0")


def _rnn_path_length(x: Tensor) -> int:
    gru, _ = make_layer("rnn", x.size(-1), dtype=torch.float64)
    cell = nn.GRUCell(x.size(-1), x.size(-1)).double()
    cell.load_state_dict({k[:-3]: v for k, v in gru.state_dict().items()})  # weight_ih_l0 -> weight_ih
    b, n, d = x.shape
    h = x.new_zeros(b, n, d)
    found = None
    for sweep in range(1, n + 1):
        previous = torch.cat([x.new_zeros(b, 1, d), h[:, :-1]], 1)  # h^{m-1}_{t-1}, zero before position 0
        h = cell(x.reshape(b * n, d), previous.reshape(b * n, d)).view(b, n, d)
        if found is None and _depends(h, x):
            found = sweep - 1  # transitions: the first sweep only read the input
    with torch.no_grad():  # n sweeps reproduce the recurrence exactly
        if not torch.allclose(h, gru(x)[0], atol=1e-10):
            raise RuntimeError("the sweeps do not reproduce nn.GRU: the path length would measure something else")
    if found is None:
        raise RuntimeError("output n-1 never came to depend on input 0")
    return found


def theory_path_length(kind: str, n: int, k: int = KERNEL) -> int:
    if kind == "rnn":
        return n - 1
    if kind == "conv":
        return math.ceil((n - 1) / ((k - 1) // 2))
    if kind == "conv_causal":
        return math.ceil((n - 1) / (k - 1))
    if kind == "conv_dilated":  # k^L positions seen after L layers
        layers = 0
        while k**layers < n:
            layers += 1
        return layers
    return 1


def theory_sequential_steps(kind: str, n: int) -> int:
    return n if kind == "rnn" else 1


# --- the whole benchmark


def measure(ns, ds, batch: int, repeats: int, log=None) -> list[dict]:
    rows = []
    for d in ds:
        for n in ns:
            for kind in LAYERS:
                module, f = make_layer(kind, d)
                x = torch.randn(batch, n, d, requires_grad=True)
                fwd, bwd = time_layer(f, x, repeats)
                row = {"layer": kind, "n": n, "d": d, "forward_ms": 1000 * fwd, "backward_ms": 1000 * bwd,
                       "total_ms": 1000 * (fwd + bwd), "saved_bytes": saved_bytes(module, f, x),
                       "flops": None if kind == "self_attention_fused" else count_flops(f, x)}
                rows.append(row)
                if log:
                    log(f"  d={d:<4} n={n:<5} {kind:<21} forward {row['forward_ms']:9.2f} ms  "
                        f"backward {row['backward_ms']:9.2f} ms  saved {row['saved_bytes'] / 2**20:8.2f} MiB")
    return rows


def crossover(rows: list[dict], d: int, key: str, attention: str = "self_attention") -> float | None:
    """The n from which ``attention`` costs more than the RNN at width d, interpolated in log n
    between the grid's points; the grid's first n if it already does there, None if it never does."""
    def series(layer):
        return {r["n"]: r[key] for r in rows if r["layer"] == layer and r["d"] == d and r[key] is not None}

    a, r = series(attention), series("rnn")
    ns = sorted(set(a) & set(r))
    if not ns or a[ns[0]] > r[ns[0]]:
        return None if not ns else float(ns[0])
    for lo, hi in zip(ns, ns[1:]):
        if a[hi] > r[hi]:
            gap_lo, gap_hi = math.log(a[lo] / r[lo]), math.log(a[hi] / r[hi])
            frac = gap_lo / (gap_lo - gap_hi)
            return float(math.exp(math.log(lo) + frac * (math.log(hi) - math.log(lo))))
    return None


def exponent(rows: list[dict], layer: str, vary: str, fixed: dict, key: str = "flops") -> float | None:
    """Least-squares slope of log(key) against log(vary) with the other size fixed."""
    pts = [(math.log(r[vary]), math.log(r[key])) for r in rows
           if r["layer"] == layer and all(r[k] == v for k, v in fixed.items()) and r[key]]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    return sum((px - mx) * (py - my) for px, py in pts) / sum((px - mx) ** 2 for px, _ in pts)


def run(quick: bool = False, out: str | Path | None = None, plot: str | Path | None = None, threads: int = 1,
        command: str = "attnkit bench complexity", log=print) -> dict:
    from attnkit.evaluate.results import write_results
    from attnkit.viz import plot_complexity

    grid = QUICK if quick else FULL
    torch.set_num_threads(threads)
    started = time.monotonic()
    log(f"one layer, batch {grid['batch']}, {threads} thread(s), kernel k = {KERNEL}")
    rows = measure(grid["ns"], grid["ds"], grid["batch"], grid["repeats"], log=log)
    structure = {}
    for kind in ("rnn", "conv", "conv_causal", "conv_dilated", "self_attention"):
        structure[kind] = [{"n": n, "sequential_steps": sequential_steps(kind, n) if kind in LAYERS else None,
                            "theory_sequential_steps": theory_sequential_steps(kind, n) if kind in LAYERS else None,
                            "path_length": path_length(kind, n), "theory_path_length": theory_path_length(kind, n)}
                           for n in grid["path_ns"]]
    ns, ds = grid["ns"], grid["ds"]
    fits = {kind: {"flops_exponent_n": exponent(rows, kind, "n", {"d": ds[-1]}),
                   "flops_exponent_d": exponent(rows, kind, "d", {"n": ns[-1]})}
            for kind in ("rnn", "conv", "self_attention")}
    cross = {str(d): {"time": crossover(rows, d, "total_ms"), "time_fused": crossover(rows, d, "total_ms",
                                                                                        "self_attention_fused"),
                      "flops": crossover(rows, d, "flops"), "theory": d} for d in ds}
    log("")
    log(report(structure, fits, cross, ns, ds))
    seconds = time.monotonic() - started
    result = {"structure": structure, "flop_exponents": fits, "crossover_n": cross, "measurements": rows,
              "seconds": seconds}
    if out:
        out = Path(out)
        plot = Path(plot) if plot else out.with_suffix(".png")
        plot_complexity(rows, plot, title=f"one layer, batch {grid['batch']}, {threads} thread(s)")
        write_results(out, "complexity", command, metrics={"structure": structure, "crossover_n": cross,
                                                           "flop_exponents": fits},
                      measurements=rows, grid={k: list(v) if isinstance(v, tuple) else v for k, v in grid.items()},
                      kernel=KERNEL, threads=threads, quick=quick, seconds=round(seconds, 1), plot=str(plot))
        log(f"wrote {out} and {plot}")
    return result


def report(structure: dict, fits: dict, cross: dict, ns, ds) -> str:
    """The lectures' table with the measurements beside it."""
    path_ns = [r["n"] for r in next(iter(structure.values()))]
    names = {"self_attention": "self-attention", "rnn": "recurrent (GRU)", "conv": "convolutional (centred)",
             "conv_causal": "  causal", "conv_dilated": "  causal, dilated k^l"}
    lines = [f"{'layer':<24} {'per layer':<11} {'FLOPs ~ n^a d^b':<16} {'seq. ops':<9} "
             f"{'measured n=' + ','.join(map(str, path_ns)):<22} {'max path':<11} measured (theory)"]
    for kind, name in names.items():
        per_layer, seq, path = LECTURES[kind]
        fit = fits.get(kind)
        flops = "" if fit is None else f"n^{fit['flops_exponent_n']:.2f} d^{fit['flops_exponent_d']:.2f}"
        rows = structure[kind]
        steps = ",".join(str(r["sequential_steps"]) for r in rows) if rows[0]["sequential_steps"] is not None else ""
        paths = ",".join(str(r["path_length"]) for r in rows)
        theory = ",".join(str(r["theory_path_length"]) for r in rows)
        lines.append(f"{name:<24} {per_layer:<11} {flops:<16} {seq:<9} {steps:<22} {path:<11} {paths} ({theory})")
    lines.append(f"(FLOP exponents: n from {ns[0]} to {ns[-1]} at d = {ds[-1]}; d from {ds[0]} to {ds[-1]} "
                 f"at n = {ns[-1]}; kernel k = {KERNEL})")
    lines.append("")
    lines.append("self-attention costs more than the RNN from n =  (time | time, fused kernel | FLOPs | lectures)")
    for d, c in cross.items():
        cells = ["never in the grid" if v is None else f"{v:.0f}" for v in (c["time"], c["time_fused"], c["flops"])]
        lines.append(f"  d = {d:<5} {cells[0]:>18} | {cells[1]:>18} | {cells[2]:>18} | {c['theory']}")
    return "\n".join(lines)


def main(args) -> int:
    """The ``attnkit bench complexity`` face."""
    command = "attnkit bench complexity" + (" --quick" if args.quick else "")
    out = args.out or ("bench/results/complexity_quick.json" if args.quick else "bench/results/complexity.json")
    run(quick=args.quick, out=out, plot=args.plot, threads=args.threads, command=command,
        log=lambda s: print(s, file=sys.stderr) if s.startswith("  d=") else print(s))
    return 0
