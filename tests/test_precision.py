"""bf16 and int8 decoding (attnkit.fast.precision): the int8 product equals its fp64 reference, both precisions
decode close to fp32, and a CPU without the instructions gets a one-line refusal, never a slow path."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnkit import fast
from attnkit.decode import beam_search, greedy, max_lengths
from attnkit.errors import AttnkitError
from attnkit.fast.precision import (
    NEEDS,
    Int8Linear,
    at_precision,
    check_precision,
    cpu_flags,
    int8_linear_reference,
    quantize_rows,
)
from attnkit.models import PAD
from conftest import random_src, toy_trained_model


def runs_here(precision: str) -> bool:
    return any(f in cpu_flags() for f in NEEDS[precision])


@pytest.fixture(scope="module")
def model():
    """Trained until fewer of its choices are near-ties, so that a lower precision has decisions to keep: after 120
    steps, bf16 products on an AMX Xeon flipped two of eight greedy outputs that fp32 took by hair's breadths."""
    return toy_trained_model(steps=300)


@pytest.fixture(scope="module")
def decisive_model():
    """Trained until no greedy choice of ``src`` is a near-tie at bf16's precision, for comparing two bf16 decoders
    token for token: on an AMX Xeon the compiled bf16 step's products round otherwise than the eager one's, and in
    :func:`model` they flipped a first token that fp32 preferred by 0.057 in log-probability; after 1000 steps
    every greedy choice of these sentences leads by at least 0.22."""
    return toy_trained_model(steps=1000)


@pytest.fixture(scope="module")
def src():
    return random_src([7, 5, 3, 6, 1, 4, 7, 2], seed=5)


def test_rows_are_quantized_symmetrically_to_within_half_a_step():
    x = torch.randn(6, 40) * torch.tensor([1e-3, 1.0, 30.0, 1.0, 1.0, 0.0])[:, None]
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8 and scale.shape == (6, 1)
    assert int(q.abs().amax(-1)[:5].min()) == 127  # each row's largest entry maps to +-127
    assert torch.all((q.float() * scale - x).abs() <= scale / 2 + 1e-7)
    assert torch.equal(q[5], torch.zeros(40, dtype=torch.int8))  # a zero row stays zero


@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_the_int8_product_equals_its_reference(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    q = Int8Linear(linear)
    x = torch.randn(2, rows, 96)
    want = int8_linear_reference(x, q.q_weight_t.t(), q.w_scale[:, None], q.bias)
    torch.testing.assert_close(q(x), want, rtol=1e-5, atol=1e-5)
    # and close to fp32: int8 rounding of both operands, about 1% of the output's scale
    exact = linear(x).detach()
    assert float((q(x) - exact).abs().max()) < 0.02 * float(exact.abs().max())
    # the readable weight is the dequantized one, which sliced products use, column-major as BLAS reads it fastest
    torch.testing.assert_close(q.weight, q.q_weight_t.t().float() * q.w_scale[:, None])
    assert q.weight.stride() == (1, 200)


@pytest.mark.slow
@torch.no_grad()
def test_the_int8_product_in_a_fixed_graph_equals_the_eager_one(tmp_path):
    """In a graph whose sizes are all fixed (a search of one sentence), :class:`Int8Linear` is oneDNN's quantized
    linear over unsigned activations with zero point 128, which Inductor lowers to its own VNNI GEMM: the integer
    sums are the same, so the layers give what ``torch._int_mm`` gives eagerly, bias or not, at widths that are not
    multiples of the GEMM's blocks, for one row (greedy search) and for five (a beam). One package holds both."""
    from torch.export import Dim

    from attnkit.fast.aot import FIXED_GRAPH, _Package

    if not runs_here("int8"):
        pytest.skip(f"this CPU has none of {NEEDS['int8']}")
    torch.manual_seed(0)
    layers = at_precision(nn.Sequential(nn.Linear(96, 200), nn.ReLU(), nn.Linear(200, 72, bias=False)).eval(), "int8")
    # a copy for the five rows: Inductor lowers a weight once a graph (two products of one weight at two sizes fail
    # its assertion on the packed weight's compensation buffers), and a search's graph has one size a weight
    beam = copy.deepcopy(layers)
    traced = []
    product = Int8Linear._product_in_graph

    def spy(self, rows_):
        traced.append(tuple(rows_.shape))
        return product(self, rows_)

    def both(one, five):
        return layers(one), beam(five)

    Int8Linear._product_in_graph = spy
    try:
        package = _Package.export(nn.ModuleList([layers, beam]), both, [torch.randn(1, 96), torch.randn(5, 96)],
                                  [{0: Dim.STATIC, 1: Dim.STATIC}] * 2, tmp_path / "int8.pt2", FIXED_GRAPH)
    finally:
        Int8Linear._product_in_graph = product
    assert traced == [(1, 96), (1, 200), (5, 96), (5, 200)]  # every layer traced as the in-graph product
    for _ in range(3):
        one, five = torch.randn(1, 96) * 3, torch.randn(5, 96) * 3
        got = package.run([one, five])
        torch.testing.assert_close(got[0], layers(one), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[1], beam(five), rtol=1e-6, atol=1e-6)


def test_one_row_multiplies_by_the_other_layout_to_the_same_bits():
    """A single row reads the weight as [out, in] (oneDNN's matrix-vector product), more rows as [in, out]: the int32
    products are exact either way, so each row's output is the one it gets among many."""
    torch.manual_seed(0)
    q = Int8Linear(nn.Linear(128, 300))
    x = torch.randn(9, 128)
    many = q(x)
    for i in range(len(x)):
        assert torch.equal(q(x[i:i + 1]), many[i:i + 1])
        assert torch.equal(q(x[i]), many[i])  # a vector, [in] -> [out]
    torch.testing.assert_close(q(x[:1]), int8_linear_reference(x[:1], q.q_weight, q.w_scale[:, None], q.bias),
                               rtol=1e-5, atol=1e-5)


def test_a_cpu_without_the_instructions_gets_one_line_naming_them():
    for precision in ("bf16", "int8"):
        with pytest.raises(AttnkitError) as e:
            check_precision(precision, flags=frozenset({"avx2", "fma"}))
        message = str(e.value)
        assert "\n" not in message and message.startswith("precision: ")
        assert all(flag in message for flag in NEEDS[precision])
        check_precision(precision, flags=frozenset({NEEDS[precision][0]}))  # one of them is enough
    check_precision("fp32", flags=frozenset())
    with pytest.raises(AttnkitError, match="precision: 'fp16' is not one of fp32, bf16, int8"):
        check_precision("fp16")


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_lower_precision_decodes_close_to_fp32_and_leaves_the_model_alone(model, src, precision):
    if not runs_here(precision):
        with pytest.raises(AttnkitError, match=f"precision: {precision} needs"):
            at_precision(model, precision)
        pytest.skip(f"this CPU has none of {NEEDS[precision]}: refused, as tested")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    low = fast.decoder(model, precision=precision)
    ref = fast.decoder(model)
    lens = max_lengths(src.ne(PAD).sum(1), 1.0, 4)
    # greedy and beam search: the same outputs but for at most one sentence, scores within 5%
    ours = greedy(low, low.init_state(low.encode(src)), lens)
    theirs = greedy(ref, ref.init_state(ref.encode(src)), lens)
    same = sum(a.tokens == b.tokens for a, b in zip(ours, theirs))
    assert same >= len(theirs) - 1, (precision, [a.tokens for a in ours], [b.tokens for b in theirs])
    for a, b in zip(ours, theirs):
        if a.tokens == b.tokens:
            assert abs(a.score - b.score) < 0.05 * max(1.0, abs(b.score)), (precision, a.score, b.score)
    beams = beam_search(low, low.init_state(low.encode(src)), lens, beam_size=4)
    ref_beams = beam_search(ref, ref.init_state(ref.encode(src)), lens, beam_size=4)
    assert sum(a[0].tokens == b[0].tokens for a, b in zip(beams, ref_beams)) >= len(ref_beams) - 1
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # decoding at a precision used a copy
    kinds = {type(m).__name__ for m in low.model.modules()}
    if precision == "int8":
        assert "Int8Linear" in kinds and "Linear" not in kinds
    else:
        assert all(p.dtype == torch.bfloat16 for p in low.model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "int8"])
@torch.no_grad()
def test_compiled_decoding_at_a_lower_precision_decodes_as_its_eager_decoding(decisive_model, src, precision):
    """``--compile --precision``: the search steps compiled ahead of time over the model at that precision (int8's
    integer products included) choose what the same precision's eager steps choose; the steps are not checked
    against eager ones here (``check=False``), so the compiled graphs are what decodes. The output projection's
    oneDNN packing is asked for (``pack_output``), which AOTInductor cannot lower for a bf16 weight: the decoder packs
    fp32 weights only.

    One compiled check per path: each of the precision's graph kinds once. A batch's graphs (the library's
    products, the batch size a symbol) are the step's, its encoder sealed (the encoder's graph of a batch is lowered
    as the step's is; test_aot.py checks it at fp32); one sentence's graphs (Inductor's own GEMMs) are the step's,
    every size fixed, and the encoder's, its source length a symbol."""
    from attnkit.fast.aot import AheadOfTimeStep

    if not runs_here(precision):
        pytest.skip(f"this CPU has none of {NEEDS[precision]}")
    eager = fast.decoder(decisive_model, precision=precision)
    compiled = fast.decoder(decisive_model, compile=True, precision=precision, freeze=True, pack_output=True,
                             check=False)
    lens = max_lengths(src.ne(PAD).sum(1), 1.0, 4)
    encoder = compiled._aot_encoder
    encoder.sealed = True
    for batch in (src, src):  # the first makes the graphs (eagerly), the second runs them on its 8 sentences
        ours = greedy(compiled, compiled.init_state(compiled.encode(batch)), lens[: len(batch)])
        theirs = greedy(eager, eager.init_state(eager.encode(batch)), lens[: len(batch)])
        assert [h.tokens for h in ours] == [h.tokens for h in theirs], precision
    step = compiled.search_steps()["greedy_step"]
    # one graph: its first step runs the later steps' graph over the empty cache
    assert isinstance(step, AheadOfTimeStep) and len(step.packages) == 1 and all(step.packages.values())
    assert encoder.packages == {}
    encoder.sealed = False
    # one sentence at a time: graphs whose sizes are all fixed (int8's products there Inductor's own GEMMs)
    for i in (0, 0, 1, 3):
        one, limit = src[i:i + 1], lens[i:i + 1]
        ours = greedy(compiled, compiled.init_state(compiled.encode(one)), limit)
        theirs = greedy(eager, eager.init_state(eager.encode(one)), limit)
        assert ours[0].tokens == theirs[0].tokens, (precision, i)
    assert len(step.packages) == 2 and all(step.packages.values())
    assert list(encoder.packages) == ["one sentence"] and encoder.packages["one sentence"] is not None


@pytest.mark.slow
@torch.no_grad()
def test_a_wide_int8_search_packs_its_fp32_products_and_decodes_as_eager_int8(model):
    """An int8 model still multiplies by slices of its dequantized weights in fp32 (cross-attention's queries); where
    packing pays (``pack_wide``, forced here) a search of WIDE_SENTENCES sentences or more runs graphs in which
    those products are oneDNN's packed ones, with eager int8 decoding's outputs."""
    from attnkit.fast.aot import WIDE_SENTENCES, AheadOfTimeStep

    if not runs_here("int8"):
        pytest.skip(f"this CPU has none of {NEEDS['int8']}")
    eager = fast.decoder(model, precision="int8")
    compiled = fast.decoder(model, compile=True, precision="int8", freeze=True, check=False,
                             pack_wide=True)
    assert compiled.wide_sentences == WIDE_SENTENCES
    # the encoder sealed: it has no sliced products (cross-attention's are the decoder's), and test_aot.py checks
    # its wide graph at fp32
    compiled._aot_encoder.sealed = True
    wide = random_src([2 + i % 6 for i in range(WIDE_SENTENCES)], seed=11)
    lens = max_lengths(wide.ne(PAD).sum(1), 1.0, 4)
    for _ in range(2):  # eagerly while the graph is made, then through it
        ours = greedy(compiled, compiled.init_state(compiled.encode(wide)), lens)
        theirs = greedy(eager, eager.init_state(eager.encode(wide)), lens)
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
    step = compiled.search_steps()["greedy_step"]
    assert isinstance(step, AheadOfTimeStep) and [key[-1] for key in step.packages] == ["wide"]
    assert all(step.packages.values()) and compiled._aot_encoder.packages == {}


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_the_command_line_decodes_at_a_precision_or_refuses_in_one_line(trained_checkpoint, dates_pairs, precision):
    """``attnkit translate --precision``: the translations of a CPU that has the instructions (close to fp32's: at
    most one of eight differs), else one line naming what is missing and exit status 2."""
    import subprocess

    from test_cli import ENV, attnkit_cmd

    sources = "\n".join(dates_pairs.src[:8]) + "\n"

    def translate(*extra):
        return subprocess.run(attnkit_cmd("translate", "--checkpoint", str(trained_checkpoint), "--beam", "1",
                                          "--threads", "1", *extra), input=sources, capture_output=True, text=True,
                              env=ENV, timeout=120)

    out = translate("--precision", precision)
    if not runs_here(precision):
        assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
        assert f"precision: {precision} needs" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    ours, fp32 = out.stdout.splitlines(), translate().stdout.splitlines()
    assert len(ours) == len(fp32) == 8 and sum(a == b for a, b in zip(ours, fp32)) >= 7
