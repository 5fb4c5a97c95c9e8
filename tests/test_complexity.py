"""``attnkit bench complexity --quick``: its measured sequential steps and path lengths are the theory's, exactly."""

from __future__ import annotations

import json
import time

import pytest

from attnkit import bench_complexity as bc
from attnkit.cli import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("complexity") / "complexity.json"
    start = time.monotonic()
    assert main(["bench", "complexity", "--quick", "--out", str(out)]) == 0
    return json.loads(out.read_text()), out, time.monotonic() - start


@pytest.mark.internals  # wall-clock time
def test_quick_mode_is_quick(quick):
    assert quick[2] < 30


def test_quick_mode_writes_results(quick):
    record, out, _ = quick
    assert record["name"] == "complexity" and record["command"] == "attnkit bench complexity --quick"
    assert out.with_suffix(".png").stat().st_size > 0
    layers = {(r["layer"], r["n"], r["d"]) for r in record["measurements"]}
    assert layers == {(k, n, d) for k in bc.LAYERS for n in bc.QUICK["ns"] for d in bc.QUICK["ds"]}
    for r in record["measurements"]:
        assert r["forward_ms"] > 0 and r["backward_ms"] > 0 and r["saved_bytes"] > 0


@pytest.mark.parametrize("kind", ["rnn", "conv", "conv_causal", "conv_dilated", "self_attention"])
def test_sequential_steps_and_path_lengths_match_theory(quick, kind):
    rows = quick[0]["metrics"]["structure"][kind]
    assert [r["n"] for r in rows] == list(bc.QUICK["path_ns"])
    for r in rows:
        assert r["path_length"] == r["theory_path_length"] == bc.theory_path_length(kind, r["n"]), r
        if r["sequential_steps"] is not None:
            assert r["sequential_steps"] == r["theory_sequential_steps"] == (r["n"] if kind == "rnn" else 1), r


def test_theory():
    assert [bc.theory_path_length("rnn", n) for n in (2, 8)] == [1, 7]
    assert [bc.theory_path_length("conv", n, k=5) for n in (2, 9, 10)] == [1, 4, 5]  # 2 positions per side
    assert [bc.theory_path_length("conv_causal", n, k=3) for n in (2, 9, 10)] == [1, 4, 5]
    assert [bc.theory_path_length("conv_dilated", n, k=3) for n in (2, 3, 4, 9, 10, 27, 28)] == [1, 1, 2, 2, 3, 3, 4]
    assert bc.theory_path_length("self_attention", 100) == 1


def test_measured_counts_off_the_quick_grid():
    """Other lengths and a wider kernel: still exact."""
    assert bc.path_length("conv", 12, kernel=5) == 6
    assert bc.path_length("conv_dilated", 10, kernel=3) == 3
    assert bc.path_length("rnn", 5) == 4
    assert bc.sequential_steps("rnn", 5) == 5
    assert bc.sequential_steps("self_attention_fused", 5) == 1


def test_flop_counts_follow_the_layers_formulas():
    """Multiply-adds of these layers: GRU 3 gates x (input + hidden) = 6 n d^2; attention Q, K, V, O = 4 n d^2
    plus QK^T and AV = 2 n^2 d; convolution k x d x 2d per position = 2 k n d^2. FLOPs are twice that."""
    import torch

    for n, d in ((8, 16), (32, 16)):
        x = torch.randn(1, n, d)
        counts = {kind: bc.count_flops(bc.make_layer(kind, d)[1], x) for kind in ("rnn", "self_attention", "conv")}
        assert counts == {"rnn": 12 * n * d * d, "self_attention": 8 * n * d * d + 4 * n * n * d,
                          "conv": 4 * bc.KERNEL * n * d * d}


def test_the_fused_layer_is_the_fast_runtimes_fused_attention():
    """``self_attention_fused`` is the same layer as ``self_attention`` (the same weights, the same outputs and
    gradients) with the fast runtime's fused kernel installed, which never builds the n x n weights; the other
    layer runs the core's attention, the formula."""
    import torch

    from attnkit.nn import reference_attention

    fused_module, fused = bc.make_layer("self_attention_fused", 64)
    core_module, core = bc.make_layer("self_attention", 64)
    assert core_module.kernel is reference_attention
    assert getattr(fused_module.kernel, "fused", False)
    assert all(torch.equal(a, b) for a, b in zip(fused_module.state_dict().values(), core_module.state_dict().values()))
    x = torch.randn(2, 16, 64, requires_grad=True)
    out_fused, out_core = fused(x), core(x)
    assert float((out_fused - out_core).detach().abs().max()) <= 1e-5
    grad_fused, grad_core = (torch.autograd.grad(y.sum(), x)[0] for y in (out_fused, out_core))
    assert float((grad_fused - grad_core).abs().max()) <= 1e-5


def test_crossover_interpolates():
    rows = [{"layer": layer, "n": n, "d": 8, "t": t} for layer, ts in
            (("rnn", (4, 8, 16)), ("self_attention", (1, 4, 32))) for n, t in zip((8, 16, 32), ts)]
    n = bc.crossover(rows, 8, "t")
    assert 16 < n < 32
    assert bc.crossover(rows, 8, "t", attention="rnn") is None  # never strictly costlier than itself
