"""Attention against PyTorch's reference and against the lectures' formulas."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import attnkit.fast
from attnkit.fast.attention import single_query_attention
from attnkit.fast.decoding import ReorderedKVCache
from attnkit.models import PAD
from attnkit.nn import (
    AdditiveScore,
    DotScore,
    GeneralScore,
    KVCache,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    attend,
    causal_mask,
    dot_score,
    make_score,
    masked_softmax,
    reference_attention,
    scaled_dot_score,
    sinusoidal_table,
)
from conftest import make_model, random_src

D, H = 32, 4


def _pair(seed: int = 0) -> tuple[MultiHeadAttention, torch.nn.MultiheadAttention]:
    """attnkit's and torch's multi-head attention holding the same (random, non-zero) weights."""
    torch.manual_seed(seed)
    ours = MultiHeadAttention(D, H).eval()
    with torch.no_grad():  # biases are zero-initialised: make them count
        ours.in_proj.bias.normal_()
        ours.out_proj.bias.normal_()
    ref = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.in_proj.weight)
        ref.in_proj_bias.copy_(ours.in_proj.bias)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, ref


def _padding(lengths: list[int], total: int) -> torch.Tensor:
    """[B, total] bool, True at padding."""
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def _fast(module: torch.nn.Module, *tricks: str) -> torch.nn.Module:
    """A copy of ``module`` with the fast runtime's ``tricks`` installed (the module itself keeps the core's)."""
    return attnkit.fast.use(copy.deepcopy(module), *tricks)


# the core's attention, and the fast runtime's kernels that replace it (each must compute the same)
KERNELS = {"core": (), "fused": ("fused_attention",), "fused+decoding": ("fused_attention", "decoding_attention")}


# --- against torch.nn.MultiheadAttention


@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_with_padding_matches_torch(need_weights):
    ours, ref = _pair()
    x = torch.randn(3, 7, D)
    kpm = _padding([7, 4, 1], 7)
    with torch.no_grad():
        out, w, _ = ours(x, key_padding_mask=kpm, need_weights=need_weights)
        ref_out, ref_w = ref(x, x, x, key_padding_mask=kpm, need_weights=True, average_attn_weights=False)
    assert _maxdiff(out, ref_out) <= 1e-5
    if need_weights:
        assert w.shape == (3, H, 7, 7)
        assert _maxdiff(w, ref_w) <= 1e-5
    else:
        assert w is None


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_causal_self_attention_matches_torch(need_weights, mask_kind):
    ours, ref = _pair(1)
    x = torch.randn(2, 6, D)
    disallowed = ~causal_mask(6)
    attn_mask = disallowed if mask_kind == "bool" else torch.zeros(6, 6).masked_fill(disallowed, float("-inf"))
    with torch.no_grad():
        out, w, _ = ours(x, causal=True, need_weights=need_weights)
        ref_out, ref_w = ref(x, x, x, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    assert _maxdiff(out, ref_out) <= 1e-5
    if need_weights:
        assert _maxdiff(w, ref_w) <= 1e-5
        assert torch.all(w[..., disallowed] == 0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_with_padding_matches_torch(need_weights):
    ours, ref = _pair(2)
    x = torch.randn(3, 5, D)
    kpm = _padding([5, 3, 2], 5)
    with torch.no_grad():
        out, w, _ = ours(x, causal=True, key_padding_mask=kpm, need_weights=need_weights)
        ref_out, ref_w = ref(x, x, x, attn_mask=~causal_mask(5), key_padding_mask=kpm, need_weights=True,
                             average_attn_weights=False)
    assert _maxdiff(out, ref_out) <= 1e-5
    if need_weights:
        assert _maxdiff(w, ref_w) <= 1e-5


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_matches_torch(need_weights):
    ours, ref = _pair(3)
    queries = torch.randn(3, 4, D)
    memory = torch.randn(3, 9, D)
    kpm = _padding([9, 6, 2], 9)
    with torch.no_grad():
        out, w, _ = ours(queries, memory, key_padding_mask=kpm, need_weights=need_weights)
        ref_out, ref_w = ref(queries, memory, memory, key_padding_mask=kpm, need_weights=True,
                             average_attn_weights=False)
        # the decoder's path: memory projected once, handed over as its keys/values
        out_static, _, _ = ours(queries, memory_kv=ours.project_memory(memory), key_padding_mask=kpm)
    assert out.shape == (3, 4, D)
    assert _maxdiff(out, ref_out) <= 1e-5
    assert _maxdiff(out_static, ref_out) <= 1e-5
    if need_weights:
        assert w.shape == (3, H, 4, 9)
        assert _maxdiff(w, ref_w) <= 1e-5


# --- the fast runtime's kernels against the core's


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_attention_equals_core(causal, padded, training):
    """``fused_attention`` (PyTorch's SDPA, which never builds the weights) gives the core's outputs, with and
    without autograd; a request for the weights still returns the core's weights."""
    ours, _ = _pair(4)
    fused = _fast(ours, "fused_attention")
    assert getattr(fused.kernel, "fused", False) and ours.kernel is reference_attention
    ours.train(training)
    fused.train(training)
    x = torch.randn(4, 8, D)
    kpm = _padding([8, 5, 3, 1], 8) if padded else None
    with torch.set_grad_enabled(training):
        fast, none, _ = fused(x, key_padding_mask=kpm, causal=causal, need_weights=False)
        core, _, _ = ours(x, key_padding_mask=kpm, causal=causal, need_weights=False)
        fast_w, w_fast, _ = fused(x, key_padding_mask=kpm, causal=causal, need_weights=True)
        slow, w, _ = ours(x, key_padding_mask=kpm, causal=causal, need_weights=True)
    assert none is None and w is not None
    assert _maxdiff(fast, slow) <= 1e-5 and _maxdiff(fast, core) <= 1e-5
    assert torch.equal(w_fast, w) and torch.equal(fast_w, slow)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("keys", [7, 20])
def test_single_query_kernel_equals_core(padded, keys):
    """A decoding step (one query, no gradient) takes two batched matmuls (``decoding_attention``) instead of the
    core's attention: same outputs, over fewer keys than a vector's width and more."""
    ours, _ = _pair(6)
    decoding = _fast(ours, "decoding_attention")
    x, memory = torch.randn(4, 1, D), torch.randn(4, keys, D)
    kpm = _padding([keys, 5, 2, 1], keys) if padded else None
    with torch.no_grad():
        kv = ours.project_memory(memory)
        fast, none, _ = decoding(x, key_padding_mask=kpm, memory_kv=kv)
        slow, w, _ = ours(x, memory, key_padding_mask=kpm, need_weights=True)
        core, _, _ = ours(x, key_padding_mask=kpm, memory_kv=kv)
        direct = single_query_attention(ours.project_queries(x), kv.keys, kv.values, kpm)
    assert none is None and w is not None
    assert _maxdiff(fast, slow) <= 1e-5 and _maxdiff(fast, core) <= 1e-5
    assert _maxdiff(ours.out_proj(direct.transpose(1, 2).reshape(4, 1, D)), core) <= 1e-5
    if padded:  # pads change nothing: the third row attends over its 2 real keys only
        with torch.no_grad():
            alone, _, _ = ours(x[2:3], memory[2:3, :2])
        assert _maxdiff(fast[2:3], alone) <= 1e-5


def test_single_query_attention_equals_reference_attention():
    """Several queries per row (a sentence's beams in cross-attention), pads and an all-padding row (zero
    output, as the core gives it): :func:`single_query_attention` computes the core's attention."""
    torch.manual_seed(0)
    q, k, v = torch.randn(4, H, 3, 8), torch.randn(4, H, 7, 8), torch.randn(4, H, 7, 8)
    kpm = _padding([7, 5, 2, 0], 7)
    for mask in (None, kpm):
        core, _ = reference_attention(q, k, v, key_padding_mask=mask)
        assert _maxdiff(single_query_attention(q, k, v, mask), core) <= 1e-5
    assert torch.equal(single_query_attention(q, k, v, kpm)[3], torch.zeros(H, 3, 8))
    assert torch.equal(core[3], torch.zeros(H, 3, 8))


@pytest.mark.slow
def test_compiled_single_query_attention_equals_eager():
    """Compiled, a decoding step's attention is written as products and sums for Inductor to fuse: it must give
    what the batched matmuls and the core's attention give, pads and an all-padding row (zero output) included.
    Three queries per row, as a sentence's beams in cross-attention; one query is the compiled-decoding tests'
    case."""
    torch.manual_seed(0)
    q, k, v = torch.randn(4, H, 3, 8), torch.randn(4, H, 7, 8), torch.randn(4, H, 7, 8)
    kpm = _padding([7, 5, 2, 0], 7)
    compiled = torch.compile(single_query_attention, fullgraph=True, dynamic=True)
    for mask in (None, kpm):
        eager = single_query_attention(q, k, v, mask)
        core, _ = reference_attention(q, k, v, key_padding_mask=mask)
        out = compiled(q, k, v, mask)
        assert _maxdiff(out, eager) <= 1e-5 and _maxdiff(out, core) <= 1e-5
    assert torch.equal(out[3], torch.zeros(H, 3, 8))


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_incremental_self_attention_with_cache_equals_causal(kernel):
    ours = _fast(_pair(5)[0], *KERNELS[kernel])
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        full, _, _ = ours(x, causal=True)
        cache = KVCache(torch.zeros(2, H, 0, D // H), torch.zeros(2, H, 0, D // H))
        steps = []
        for t in range(6):
            out, _, cache = ours(x[:, t:t + 1], causal=True, cache=cache)
            steps.append(out)
    assert cache.keys.shape == (2, H, 6, D // H)
    assert _maxdiff(torch.cat(steps, 1), full) <= 1e-5


def test_deferred_cache_reorder_equals_gathering_at_once():
    """The fast decoder's ``ReorderedKVCache.reorder`` (applied by the next step as it appends) ends where the
    core's ``KVCache.select`` (gathering at once) would: reorders compose, rows may repeat or drop, and a cached
    step then attends to the same keys and values."""
    ours, _ = _pair(7)
    x = torch.randn(3, 4, D)
    with torch.no_grad():
        cache = KVCache(torch.zeros(3, H, 0, D // H), torch.zeros(3, H, 0, D // H))
        for t in range(3):
            _, _, cache = ours(x[:, t:t + 1], causal=True, cache=cache)
        first, second = torch.tensor([2, 0, 0, 1]), torch.tensor([3, 1, 0])
        deferred = ReorderedKVCache(cache.keys, cache.values).reorder(first).reorder(second)
        assert deferred.keys is cache.keys and deferred.rows == 3  # nothing gathered yet
        at_once = cache.select(first).select(second)
        assert all(torch.equal(a, b) for a, b in zip(deferred.resolved(), (at_once.keys, at_once.values)))
        new = x[torch.tensor([1, 2, 2]), 3:4]
        out_deferred, _, grown = ours(new, causal=True, cache=deferred)
        out_at_once, _, grown_at_once = ours(new, causal=True, cache=at_once)
    assert isinstance(grown, ReorderedKVCache) and isinstance(grown_at_once, KVCache)
    assert grown.order is None and torch.equal(grown.keys, grown_at_once.keys)
    assert torch.equal(grown.values, grown_at_once.values) and torch.equal(out_deferred, out_at_once)
    assert torch.equal(at_once.keys, cache.keys[first][second])


# --- invariances


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_self_attention_is_permutation_equivariant(kernel):
    ours = _fast(_pair(6)[0], *KERNELS[kernel])
    x = torch.randn(2, 7, D)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(perm, torch.arange(7))
    with torch.no_grad():
        out, _, _ = ours(x)
        out_perm, _, _ = ours(x[:, perm])
    assert _maxdiff(out_perm, out[:, perm]) <= 1e-5


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_future_never_changes_past(need_weights, kernel):
    ours = _fast(_pair(7)[0], *KERNELS[kernel])
    x = torch.randn(2, 8, D)
    with torch.no_grad():
        out, _, _ = ours(x, causal=True, need_weights=need_weights)
        for t in range(7):
            y = x.clone()
            y[:, t + 1:] = torch.randn_like(y[:, t + 1:])
            out2, _, _ = ours(y, causal=True, need_weights=need_weights)
            assert _maxdiff(out2[:, : t + 1], out[:, : t + 1]) <= 1e-6
            assert _maxdiff(out2[:, t + 1:], out[:, t + 1:]) > 1e-3  # the future does change


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_transformer_decoder_is_causal(kernel):
    model = attnkit.fast.use(make_model(vocab=23, seed=1), *KERNELS[kernel])
    src = random_src([6, 4], seed=1)
    tgt = random_src([7, 7], seed=2)
    with torch.no_grad():
        memory = model.encode(src)
        logits = model.output(model.decode_all(tgt, memory)[0])
        for t in range(tgt.size(1) - 1):
            changed = tgt.clone()
            changed[:, t + 1:] = torch.randint(4, 23, changed[:, t + 1:].shape)
            logits2 = model.output(model.decode_all(changed, memory)[0])
            assert _maxdiff(logits2[:, : t + 1], logits[:, : t + 1]) <= 1e-5


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_padding_never_changes_real_positions(kernel):
    model = attnkit.fast.use(make_model(vocab=23, seed=2), *KERNELS[kernel])
    lengths = [7, 5, 2]
    src = random_src(lengths, seed=3)
    tgt = random_src([4, 4, 4], seed=4)
    with torch.no_grad():
        memory = model.encode(src)
        batch_logits = model(src, tgt).logits
        for i, n in enumerate(lengths):
            alone = model.encode(src[i:i + 1, :n])
            assert _maxdiff(memory.states[i, :n], alone.states[0]) <= 1e-5
            assert _maxdiff(batch_logits[i], model(src[i:i + 1, :n], tgt[i:i + 1]).logits[0]) <= 1e-5
    assert memory.padding_mask.tolist() == _padding(lengths, 7).tolist()


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_padded_row_gives_no_nan(need_weights, kernel):
    """A query with no key to see (its sequence all padding) gets zero weights and a zero output from the heads
    (so the layer's output is the output projection's bias), never NaN, in every kernel."""
    ours = _fast(_pair(8)[0], *KERNELS[kernel])
    x = torch.randn(2, 5, D)
    memory = torch.randn(2, 4, D)
    kpm = _padding([5, 0], 5)
    mem_kpm = _padding([4, 0], 4)
    with torch.no_grad():
        self_out, self_w, _ = ours(x, key_padding_mask=kpm, need_weights=need_weights)
        causal_out, causal_w, _ = ours(x, key_padding_mask=kpm, causal=True, need_weights=need_weights)
        cross_out, cross_w, _ = ours(x, memory, key_padding_mask=mem_kpm, need_weights=need_weights)
        step_out, _, _ = ours(x[:, :1], memory_kv=ours.project_memory(memory), key_padding_mask=mem_kpm)
        single, _, _ = ours(x[:1], key_padding_mask=kpm[:1], need_weights=need_weights)
    bias = ours.out_proj.bias
    for out in (self_out, causal_out, cross_out, step_out):
        assert torch.isfinite(out).all()
        assert torch.equal(out[1], bias.expand_as(out[1]))
    if need_weights:
        for w in (self_w, causal_w, cross_w):
            assert torch.equal(w[1], torch.zeros_like(w[1]))
    # the real row is unaffected by its all-padding neighbour
    assert _maxdiff(self_out[:1], single) <= 1e-5

    model = attnkit.fast.use(make_model(vocab=23, seed=3), *KERNELS[kernel])
    src = random_src([5, 1], seed=5)
    src[1] = PAD
    with torch.no_grad():
        assert torch.isfinite(model(src, random_src([3, 3], seed=6)).logits).all()


# --- attend() and the similarity functions


def _scores(kind):
    torch.manual_seed(11)
    return make_score(kind, 6, 6, 5)


def _attend_inputs():
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 3, 6, generator=g)
    k = torch.randn(2, 5, 6, generator=g)
    v = torch.randn(2, 5, 4, generator=g)
    mask = torch.rand(2, 3, 5, generator=g) > 0.4
    mask[..., 0] = True  # every query may see at least one key
    mask[0, 1] = torch.tensor([True, False, False, False, False])
    return q, k, v, mask


def _hand_score(kind, score, q, k):
    b, t, s = q.size(0), q.size(1), k.size(1)
    e = torch.empty(b, t, s)
    for n in range(b):
        for i in range(t):
            for j in range(s):
                qi, kj = q[n, i], k[n, j]
                if kind == "dot":
                    e[n, i, j] = qi @ kj
                elif kind == "scaled_dot":
                    e[n, i, j] = qi @ kj / math.sqrt(kj.numel())
                elif kind == "general":
                    e[n, i, j] = qi @ score.weight.weight @ kj  # q^T W k
                else:  # v^T tanh(W q + U k + b)
                    wq = score.query_proj.weight @ qi
                    uk = score.key_proj.weight @ kj + score.key_proj.bias
                    e[n, i, j] = score.v.weight[0] @ torch.tanh(wq + uk)
    return e


@pytest.mark.parametrize("kind", ["dot", "scaled_dot", "general", "additive"])
def test_attend_with_each_score(kind):
    score = _scores(kind)
    assert isinstance(score, {"dot": DotScore, "scaled_dot": DotScore, "general": GeneralScore,
                              "additive": AdditiveScore}[kind])
    q, k, v, mask = _attend_inputs()
    with torch.no_grad():
        out, w = attend(q, k, v, mask, score=score)
        e = _hand_score(kind, score, q, k)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3), atol=1e-6)
    assert torch.all(w[~mask] == 0)
    assert torch.all(w[mask] > 0)
    assert torch.allclose(out, w @ v, atol=1e-6)
    assert torch.allclose(w[0, 1], torch.tensor([1.0, 0, 0, 0, 0]))  # one allowed key takes all the weight
    expected = torch.softmax(e.masked_fill(~mask, float("-inf")), -1)
    assert torch.allclose(w, expected, atol=1e-5)
    out_hand = torch.einsum("bts,bsd->btd", expected, v)
    assert torch.allclose(out, out_hand, atol=1e-5)


@pytest.mark.parametrize("kind", ["dot", "scaled_dot", "general", "additive"])
def test_score_precompute_and_shapes(kind):
    """The key-only part computed once per source (as a decoder does) changes nothing."""
    score = _scores(kind)
    q, k, _, _ = _attend_inputs()
    with torch.no_grad():
        direct = score(q, k)
        cached = score(q, k, projected=score.precompute(k))
    assert direct.shape == (2, 3, 5)
    assert torch.equal(direct, cached)
    assert torch.allclose(direct, _hand_score(kind, score, q, k), atol=1e-5)


def test_function_scores_equal_their_modules():
    q, k, _, _ = _attend_inputs()
    assert torch.equal(dot_score(q, k), make_score("dot", 6, 6)(q, k))
    assert torch.equal(scaled_dot_score(q, k), make_score("scaled_dot", 6, 6)(q, k))


def test_make_score_rejects_unknown():
    with pytest.raises(ValueError, match="unknown attention score"):
        make_score("cosine", 4, 4)


def test_masked_softmax_all_masked_row_is_zero():
    scores = torch.randn(2, 3)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    w = masked_softmax(scores, mask)
    assert torch.equal(w[1], torch.zeros(3))
    assert w[0, 1] == 0 and abs(float(w[0].sum()) - 1) < 1e-6


def test_causal_mask_layout():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    # two new queries after three cached keys: query i sees keys j <= i + 3
    assert causal_mask(2, 5).tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


# --- positions


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_table_matches_the_paper(d_model):
    n = 60
    table = sinusoidal_table(n, d_model)
    assert table.shape == (n, d_model)
    for pos in range(n):
        for col in range(d_model):
            i = col // 2
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert abs(float(table[pos, col]) - expected) <= 1e-6, (pos, col)


def test_sinusoidal_encoding_grows_beyond_max_positions():
    pe = SinusoidalPositionalEncoding(8, max_positions=4)
    out = pe(10)
    assert torch.allclose(out, sinusoidal_table(10, 8), atol=1e-7)
    pe = SinusoidalPositionalEncoding(8, max_positions=4)
    assert torch.allclose(pe(9, offset=3), sinusoidal_table(12, 8)[3:], atol=1e-7)  # a decoding step's positions


def test_learned_positions_are_the_lookup_and_refuse_beyond_max_positions():
    pe = LearnedPositionalEmbedding(8, max_positions=6)
    assert torch.equal(pe(3, offset=2), pe.embedding(torch.arange(2, 5)))
    with pytest.raises(ValueError, match="beyond max_positions=6"):
        pe(3, offset=4)
