"""attnkit.check: a learner's right answers pass, and each mistake a learner typically makes is caught and named.

The learners' functions below are written here in plain PyTorch, independently of attnkit (the right ones follow the
papers, torch's own functional attention or a loop over candidates), each wrong one the way a learner writes it.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import attnkit.check as check

# --- attention


def attention_right(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    weights = torch.where(torch.isnan(weights), torch.zeros_like(weights), weights)
    return weights @ v, weights


def attention_einsum(q, k, v, mask=None):
    """Another right one: einsum, a max-shifted exp, and the masked row's zero by hand."""
    scores = torch.einsum("btd,bsd->bts", q, k) * k.shape[-1] ** -0.5
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    scores = scores.masked_fill(~mask, -math.inf)
    top = scores.amax(-1, keepdim=True).clamp(min=-1e30)
    e = torch.exp(scores - top) * mask
    total = e.sum(-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.einsum("bts,bsd->btd", weights, v)


def attention_no_scaling(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def attention_wrong_axis(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=1).nan_to_num(0.0) @ v


def attention_mask_after_softmax(q, k, v, mask=None):
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1]), dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v


def attention_nan_rows(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention_finite_mask(q, k, v, mask=None):  # d2l's -1e6
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e6)
    return torch.softmax(scores, dim=-1) @ v


def attention_inverted_mask(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # as if True meant padding
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def attention_mask_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores * mask  # a masked score of 0 still gets weight
    return torch.softmax(scores, dim=-1) @ v


def attention_sdpa(q, k, v, mask=None):
    """Right: torch's fused attention (a row with no allowed key gives zeros)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_scaled_by_value_size(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(v.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def attention_no_scaling_and_nan(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def attention_no_mask_argument(q, k, v, mask):
    return torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])).masked_fill(~mask, -math.inf), -1) @ v


def attention_in_place(q, k, v, mask=None):
    """Right, but scales its argument in place: the check must not let that change the reference's inputs."""
    q /= math.sqrt(k.shape[-1])
    scores = q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def attention_off_by_a_little(q, k, v, mask=None):
    out = attention_right(q, k, v, mask)[0]
    if out.shape[1] > 2:
        out[0, 2] += 0.05
    return out


@pytest.mark.parametrize("fn", [attention_right, attention_einsum, attention_in_place, attention_sdpa])
def test_right_attention_passes(fn):
    result = check.attention(fn)
    assert result.ok, result.message
    assert bool(result) and str(result) == result.message and result.mistakes == ()
    assert f"{fn.__name__} matches attnkit.nn.attend on all 5 cases:" in result.message


@pytest.mark.parametrize("fn, key, words", [
    (attention_no_scaling, "no_scaling", "not divided by sqrt(d_k)"),
    (attention_wrong_axis, "wrong_axis", "softmax runs over the queries"),
    (attention_mask_after_softmax, "mask_after_softmax", "mask is applied after the softmax"),
    (attention_nan_rows, "nan_rows", "fully masked row gives NaN"),
    (attention_finite_mask, "mask_finite", "large finite number rather than -inf"),
    (attention_inverted_mask, "mask_inverted", "the wrong way round"),
    (attention_scaled_by_value_size, "scaled_by_dv", "sqrt(d_v)"),
    (attention_mask_zero, "mask_zero", "set to 0"),
])
def test_attention_mistakes_are_named(fn, key, words):
    result = check.attention(fn)
    assert not result.ok and result.mistakes == (key,), result.message
    assert words in result.message and result.message.startswith(f"{fn.__name__} does not match")
    assert result.message.count(".") >= 1 and "\n" not in result.message


def test_two_mistakes_at_once_are_both_named():
    result = check.attention(attention_no_scaling_and_nan)
    assert set(result.mistakes) == {"no_scaling", "nan_rows"}, result.message
    assert "2 mistakes" in result.message


def test_where_the_mistake_shows_is_said():
    result = check.attention(attention_nan_rows)
    assert "on a padding mask with a fully masked row" in result.message
    assert "NaN at batch 1, query 2" in result.message


def test_an_unknown_difference_says_where_and_how_much():
    result = check.attention(attention_off_by_a_little)
    assert not result.ok and result.mistakes == ()
    assert "differs from attnkit.nn.attend on random inputs without a mask" in result.message
    assert "differs by up to 0.05 at batch 0, query 2" in result.message


def test_a_function_that_raises_is_reported_with_its_case():
    result = check.attention(attention_no_mask_argument)
    assert not result.ok and result.mistakes == ("raised",)
    assert "raised TypeError on random inputs without a mask" in result.message


def test_a_wrong_shape_is_reported():
    result = check.attention(lambda q, k, v, mask=None: attention_right(q, k, v, mask)[0].transpose(1, 2))
    assert not result.ok and "has shape" in result.message and result.message.startswith("your function")


# --- score functions


def dot(q, k):
    return torch.bmm(q, k.transpose(1, 2))


def scaled_dot(q, k):
    return torch.einsum("btd,bsd->bts", q, k) / k.shape[-1] ** 0.5


def general(q, k, w):
    return torch.einsum("btq,qk,bsk->bts", q, w, k)


def additive(q, k, w_q, w_k, v):
    hidden = torch.tanh((q @ w_q.T)[:, :, None, :] + (k @ w_k.T)[:, None, :, :])
    return (hidden * v).sum(-1)


@pytest.mark.parametrize("fn, kind", [(dot, "dot"), (scaled_dot, "scaled_dot"), (general, "general"),
                                      (additive, "additive")])
def test_right_scores_pass(fn, kind):
    result = check.scores(fn, kind)
    assert result.ok, result.message


@pytest.mark.parametrize("fn, kind, key, words", [
    (dot, "scaled_dot", "no_scaling", "not divided by sqrt(d)"),
    (scaled_dot, "dot", "scaled", "divided by sqrt(d)"),
    (lambda q, k: q @ k.transpose(-1, -2) / k.shape[-1], "scaled_dot", "scaled_by_d", "not by its square root"),
    (lambda q, k: k @ q.transpose(-1, -2), "dot", "transposed", "[batch, keys, queries]"),
    (lambda q, k, w: q @ w.T @ k.transpose(-1, -2), "general", "w_transposed", "W is applied transposed"),
    (lambda q, k, w_q, w_k, v: ((q @ w_q.T)[:, :, None] + (k @ w_k.T)[:, None]) @ v, "additive", "no_tanh",
     "there is no tanh"),
    (lambda q, k, w_q, w_k, v: torch.tanh((q @ w_q.T)[:, :, None] + (k @ w_k.T)[:, None]).sum(-1), "additive",
     "no_v", "v is left out"),
])
def test_score_mistakes_are_named(fn, kind, key, words):
    result = check.scores(fn, kind)
    assert not result.ok and result.mistakes == (key,), result.message
    assert words in result.message


def test_additive_with_the_projections_swapped_is_named():
    def swapped(q, k, w_q, w_k, v):
        return additive(q, k, w_k, w_q, v)

    result = check.scores(swapped, "additive")  # raises on queries and keys of different sizes: named all the same
    assert result.mistakes == ("swapped",) and "W_q and W_k are swapped" in result.message, result.message


def test_an_unknown_score_kind_is_refused():
    with pytest.raises(ValueError, match="kind='cosine'"):
        check.scores(dot, "cosine")


# --- masked softmax


def masked_softmax_right(scores, mask):
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0)


def masked_softmax_stable_exp(scores, mask):
    top = scores.masked_fill(~mask, -1e30).amax(-1, keepdim=True)
    e = (scores - top).masked_fill(~mask, -math.inf).exp()
    total = e.sum(-1, keepdim=True)
    return e / total.clamp(min=1e-30)


def masked_softmax_naive_exp(scores, mask):
    e = torch.exp(scores) * mask
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("fn", [masked_softmax_right, masked_softmax_stable_exp])
def test_right_masked_softmax_passes(fn):
    result = check.masked_softmax(fn)
    assert result.ok, result.message


@pytest.mark.parametrize("fn, keys, words", [
    (lambda s, m: torch.softmax(s, -1) * m, {"mask_after_softmax"}, "after the softmax"),
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), -1), {"nan_rows"}, "gives NaN"),
    (lambda s, m: torch.softmax(s.masked_fill(~m, float("-inf")), 1).nan_to_num(0.0), {"wrong_axis"}, "dim -2"),
    (lambda s, m: torch.softmax(s.masked_fill(~m, -1e9), -1), {"mask_finite"}, "-inf"),
    (lambda s, m: torch.softmax(s, -1), {"mask_ignored"}, "mask is ignored"),
    (lambda s, m: torch.softmax(s * m, -1), {"mask_zero"}, "set to 0"),
    (masked_softmax_naive_exp, {"overflow", "nan_rows"}, "overflows"),
])
def test_masked_softmax_mistakes_are_named(fn, keys, words):
    result = check.masked_softmax(fn)
    assert not result.ok and set(result.mistakes) == keys, result.message
    assert words in result.message


# --- multi-head attention


def multi_head_torch(queries, keys, values, w_q, w_k, w_v, w_o, n_heads):
    """torch's own multi-head attention, fed the same weights."""
    d = queries.shape[-1]
    out, _ = F.multi_head_attention_forward(
        queries.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), d, n_heads, None, None, None, None,
        False, 0.0, w_o, None, training=False, need_weights=False, use_separate_proj_weight=True,
        q_proj_weight=w_q, k_proj_weight=w_k, v_proj_weight=w_v)
    return out.transpose(0, 1)


def _heads(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).permute(0, 2, 1, 3)


def multi_head_right(queries, keys, values, w_q, w_k, w_v, w_o, n_heads, split=_heads, scale=None, merge=None,
                     linear=F.linear, out_proj=True):
    q, k, v = split(linear(queries, w_q), n_heads), split(linear(keys, w_k), n_heads), split(linear(values, w_v),
                                                                                         n_heads)
    scale = math.sqrt(q.shape[-1]) if scale is None else scale(q)
    out = torch.softmax(q @ k.transpose(-1, -2) / scale, -1) @ v
    b, h, t, dh = out.shape
    out = out.permute(0, 2, 1, 3).reshape(b, t, h * dh) if merge is None else merge(out)
    return linear(out, w_o) if out_proj else out


def test_right_multi_head_passes():
    for fn in (multi_head_torch, multi_head_right):
        result = check.multi_head(fn)
        assert result.ok, result.message


def _split_interleaved(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, t, d // n_heads, n_heads).permute(0, 3, 1, 2)


def _split_without_transpose(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, n_heads, t, d // n_heads)


@pytest.mark.parametrize("options, keys, words", [
    ({"split": _split_interleaved}, {"heads_split_order"}, "heads are split in the wrong order"),
    ({"split": _split_without_transpose}, {"heads_split_no_transpose"}, "without the transpose"),
    ({"merge": lambda o: o.reshape(o.shape[0], o.shape[2], -1)}, {"heads_merged_no_transpose"}, "concatenated"),
    ({"scale": lambda q: math.sqrt(q.shape[1] * q.shape[-1])}, {"scaled_by_d_model"}, "sqrt(d_model)"),
    ({"scale": lambda q: 1.0}, {"no_scaling"}, "not divided by sqrt(d_head)"),
    ({"linear": lambda x, w: x @ w}, {"weights_transposed"}, "x @ W.T"),
    ({"out_proj": False}, {"no_output_projection"}, "W_o is missing"),
    ({"split": _split_interleaved, "merge": lambda o: o.permute(0, 2, 3, 1).reshape(o.shape[0], o.shape[2], -1)},
     {"heads_split_order", "heads_merged_order"}, "2 mistakes"),
])
def test_multi_head_mistakes_are_named(options, keys, words):
    def learner(*args):
        return multi_head_right(*args, **options)

    result = check.multi_head(learner)
    assert not result.ok and set(result.mistakes) == keys, result.message
    assert words in result.message


def test_the_check_reference_is_attnkits_module_and_torchs():
    """What check.multi_head compares with equals attnkit's MultiHeadAttention and torch's, on the same weights."""
    from attnkit.check import _reference_multi_head
    from attnkit.nn import MultiHeadAttention

    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    w = [torch.randn(16, 16, generator=g) * 0.25 for _ in range(4)]
    mha = MultiHeadAttention(16, 4, bias=False)
    with torch.no_grad():
        mha.in_proj.weight.copy_(torch.cat(w[:3]))
        mha.out_proj.weight.copy_(w[3])
        expected = mha(x, memory).output
    torch.testing.assert_close(_reference_multi_head(x, memory, memory, *w, 4), expected)
    torch.testing.assert_close(multi_head_torch(x, memory, memory, *w, 4), expected)


# --- positional encoding


def positional_annotated(n, d):
    """The Annotated Transformer's: frequencies as exp(-2i log(10000) / d)."""
    pe = torch.zeros(n, d)
    position = torch.arange(0, n).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def positional_loops(n, d):
    """Written as the paper's two formulas, in float64 numpy-free Python loops (small tables only)."""
    if n * d > 5000:
        return positional_annotated(n, d).double()
    return torch.tensor([[math.sin(p / 10000 ** (j / d)) if j % 2 == 0 else math.cos(p / 10000 ** ((j - 1) / d))
                          for j in range(d)] for p in range(n)], dtype=torch.float64)


@pytest.mark.parametrize("fn", [positional_annotated, positional_loops])
def test_right_positional_encoding_passes(fn):
    result = check.positional_encoding(fn)
    assert result.ok, result.message


def _positional(n, d, sin_cols, cos_cols, exponent=lambda i, d: 2 * i / d, first=0):
    pe = torch.zeros(n, d)
    pos = torch.arange(first, first + n, dtype=torch.float32)[:, None]
    i = torch.arange(d // 2, dtype=torch.float32)
    pe[:, sin_cols(d)] = torch.sin(pos / 10000 ** exponent(i, d))
    pe[:, cos_cols(d)] = torch.cos(pos / 10000 ** exponent(i, d))
    return pe


def _even(d):
    return slice(0, d, 2)


def _odd(d):
    return slice(1, d, 2)


@pytest.mark.parametrize("fn, key, words", [
    (lambda n, d: _positional(n, d, lambda d: slice(0, d // 2), lambda d: slice(d // 2, d)), "halves",
     "interleaves them"),
    (lambda n, d: _positional(n, d, _odd, _even), "sin_cos_swapped", "sine and cosine are swapped"),
    (lambda n, d: _positional(n, d, _even, _odd, exponent=lambda i, d: 4 * i / d), "exponent_doubled",
     "counts the columns twice"),
    (lambda n, d: _positional(n, d, _even, _odd, first=1), "positions_from_1", "start at 1"),
])
def test_positional_mistakes_are_named(fn, key, words):
    result = check.positional_encoding(fn)
    assert not result.ok and result.mistakes == (key,), result.message
    assert words in result.message


def test_the_cosine_with_its_own_exponent_is_named():
    def per_column(n, d):
        angles = torch.arange(n)[:, None] / 10000 ** (torch.arange(d) / d)
        pe = torch.sin(angles)
        pe[:, 1::2] = torch.cos(angles[:, 1::2])
        return pe

    result = check.positional_encoding(per_column)
    assert result.mistakes == ("cos_exponent",) and "(2i+1)/d_model" in result.message, result.message


# --- causal mask


def causal_right(t):
    return torch.tensor([[j <= i for j in range(t)] for i in range(t)])


def causal_cached(t, s):
    return torch.arange(s)[None, :] <= torch.arange(s - t, s)[:, None]


@pytest.mark.parametrize("fn", [causal_right, causal_cached])
def test_right_causal_mask_passes(fn):
    result = check.causal_mask(fn)
    assert result.ok, result.message
    assert f"on all {3 if fn is causal_right else 5} cases" in result.message


@pytest.mark.parametrize("fn, key, words", [
    (lambda t: torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1), "mask_inverted", "True at the future"),
    (lambda t: torch.tril(torch.ones(t, t, dtype=torch.bool), diagonal=-1), "no_diagonal", "may not see itself"),
    (lambda t: torch.triu(torch.ones(t, t, dtype=torch.bool)), "future", "sees the future"),
    (lambda t, s: torch.tril(torch.ones(t, s, dtype=torch.bool)), "aligned_at_start", "they are the last t"),
    (lambda t: torch.triu(torch.full((t, t), float("-inf")), diagonal=1), "additive", "additive float mask"),
    (lambda t: torch.tril(torch.ones(t, t)), "not_boolean", "ones and zeros"),
])
def test_causal_mask_mistakes_are_named(fn, key, words):
    result = check.causal_mask(fn)
    assert not result.ok and result.mistakes == (key,), result.message
    assert words in result.message


# --- a beam search step


def beam_step_loop(scores, log_probs, k):
    """Every candidate written out and sorted in Python."""
    b, beams, v = log_probs.shape
    out_scores, out_beams, out_tokens = [], [], []
    for i in range(b):
        candidates = sorted(((scores[i, j].item() + log_probs[i, j, w].item(), j, w)
                             for j in range(beams) for w in range(v)), key=lambda c: -c[0])[:k]
        out_scores.append([c[0] for c in candidates])
        out_beams.append([c[1] for c in candidates])
        out_tokens.append([c[2] for c in candidates])
    return torch.tensor(out_scores), torch.tensor(out_beams), torch.tensor(out_tokens)


def beam_step_topk(scores, log_probs, k):
    total = scores.unsqueeze(-1) + log_probs
    best, flat = total.flatten(1).topk(k)
    return best, flat // log_probs.shape[-1], flat % log_probs.shape[-1]


def test_right_beam_step_passes():
    for fn in (beam_step_topk, beam_step_loop):
        result = check.beam_search_step(fn)
        assert result.ok, result.message


@pytest.mark.parametrize("fn, key, words", [
    (lambda s, lp, k: beam_step_topk(torch.zeros_like(s), lp, k), "no_score", "log-probability alone"),
    (lambda s, lp, k: (s + lp.max(-1).values, torch.arange(lp.shape[1]).repeat(lp.shape[0], 1), lp.argmax(-1)),
     "per_beam", "its own best token"),
    (lambda s, lp, k: (lambda t, f: (t, f // lp.shape[1], f % lp.shape[1]))(
        *(s[..., None] + lp).flatten(1).topk(k)), "divisor", "number of beams"),
    (lambda s, lp, k: (lambda t, f: (t, f % lp.shape[-1], f // lp.shape[-1]))(
        *(s[..., None] + lp).flatten(1).topk(k)), "swapped", "swapped"),
    (lambda s, lp, k: (lambda t, f: (t, f // lp.shape[-1], f % lp.shape[-1]))(
        *(s[..., None] * lp).flatten(1).topk(k)), "multiply", "multiplied"),
    (lambda s, lp, k: tuple(x.flip(1) for x in beam_step_topk(s, lp, k)), "unsorted", "best first"),
])
def test_beam_step_mistakes_are_named(fn, key, words):
    result = check.beam_search_step(fn)
    assert not result.ok and result.mistakes == (key,), result.message
    assert words in result.message


# --- a check changes nothing outside itself


def test_a_check_leaves_the_process_as_it_was():
    rng, threads, dtype, grad = torch.get_rng_state(), torch.get_num_threads(), torch.get_default_dtype(), \
        torch.is_grad_enabled()
    for result in (check.attention(attention_right), check.scores(general, "general"),
                   check.scores(additive, "additive"), check.multi_head(multi_head_right),
                   check.beam_search_step(beam_step_topk)):
        assert result.ok, result.message
    assert torch.equal(torch.get_rng_state(), rng)
    assert (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()) == (threads, dtype, grad)


def test_importing_check_imports_no_fast_runtime_and_no_training():
    code = ("import sys, torch; n = torch.get_num_threads(); import attnkit.check; "
            "assert not [m for m in sys.modules if m.startswith(('attnkit.fast', 'attnkit.train'))], "
            "sorted(m for m in sys.modules if m.startswith('attnkit')); "
            "assert torch.get_num_threads() == n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
