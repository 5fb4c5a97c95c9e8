"""The fast runtime (:mod:`attnkit.fast`) against the core (:mod:`attnkit.nn`, the models, :mod:`attnkit.decode`):
every trick installed by name computes what the core computes, and the fast decoder finds the core's hypotheses.

One test (or more) per name of ``attnkit.fast.TRICKS``; :class:`attnkit.fast.FastDecoder` for every family that
decodes with attention or a recurrence; and the core's files free of the compilers."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import attnkit.fast
import attnkit.fast.attention as fast_attention
from attnkit import config, registry
from attnkit.data import collate
from attnkit.decode import generate, max_lengths
from attnkit.fast import TRAINING, TRICKS, FastDecoder, ranking, reference, use
from attnkit.fast.decoding import GroupedDecoderState, ReorderedKVCache
from attnkit.fast.dropout import Dropout16
from attnkit.fast.linear import OneDNNLinear, onednn_linear, relinked
from attnkit.models import BOS, PAD, ConvTransformer, RNNSearch, TransformerLM
from attnkit.models.conv import ConvTransformerConfig
from attnkit.models.lm import LMConfig
from attnkit.models.rnn import RNNSearchConfig
from attnkit.nn import KVCache, MultiHeadAttention, label_smoothed_nll, reference_attention
from conftest import assert_projected_loss_matches_core, make_model, random_src, tiny_model_config, toy_trained_model

VOCAB = 23
LENGTHS = [6, 3, 5, 1]
SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max())


def _lm(seed: int = 0, **overrides) -> TransformerLM:
    torch.manual_seed(seed)
    cfg = {"d_model": 32, "n_heads": 4, "d_ff": 64, "n_layers": 2, "dropout": 0.0, "max_positions": 64, **overrides}
    return TransformerLM(LMConfig(**cfg), VOCAB).eval()


def _toy_batch(n: int = 16, seed: int = 0):
    """The toy task of conftest.toy_trained_model: reverse and relabel the source. A batch of ``n`` pairs of 1 to 7
    tokens (PAD-padded, BOS/EOS added)."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = [], []
    for _ in range(n):
        k = int(torch.randint(1, 8, (1,), generator=g))
        s = torch.randint(4, VOCAB, (k,), generator=g).tolist()
        src.append(s)
        tgt.append([(t * 3) % (VOCAB - 4) + 4 for t in reversed(s)])
    return collate(src, tgt, list(range(n)))


def _toy_trained(model: nn.Module, steps: int = 40) -> nn.Module:
    """``model`` trained briefly on the toy task through its own loss (``model(src, tgt_in, targets=...)``), so
    that its hypotheses depend on the source and end at varied lengths; in eval mode."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        b = _toy_batch(seed=step)
        loss = model(b.src, b.tgt_in, targets=b.tgt_out).loss
        opt.zero_grad()
        (loss / b.n_tokens).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def transformer():
    return toy_trained_model(vocab=VOCAB, steps=60)


@pytest.fixture(scope="module")
def conv_transformer():
    torch.manual_seed(0)
    cfg = ConvTransformerConfig(**{**vars(tiny_model_config()), "family": "conv_transformer"})
    return _toy_trained(ConvTransformer(cfg, VOCAB, VOCAB))


@pytest.fixture(scope="module")
def rnnsearch():
    torch.manual_seed(0)
    return _toy_trained(RNNSearch(RNNSearchConfig(embedding_size=16, hidden_size=24, dropout=0.0), VOCAB, VOCAB))


@pytest.fixture(scope="module")
def models(transformer, conv_transformer, rnnsearch):
    return {"transformer": transformer, "conv_transformer": conv_transformer, "transformer_lm": _lm(),
            "rnnsearch": rnnsearch}


def _count_calls(monkeypatch, module, name: str) -> list:
    """Count the calls of ``module.name`` (a kernel the fast runtime looks up when it runs)."""
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


# --- the registry


def test_every_trick_is_named_in_the_config_and_tested_here():
    assert attnkit.fast.TRICKS is registry.TRICKS  # one table: what train.fast may name is what installs
    assert all(callable(registry.resolve(reference)) for reference in registry.TRICKS.values())
    # a new trick needs its test here: these are the names this file checks against the core
    assert tuple(TRICKS) == ("dropout16", "fused_loss", "fused_attention", "decoding_attention", "onednn_linear")
    assert set(TRAINING) <= set(TRICKS)
    assert config.TrainConfig().fast == TRAINING
    with pytest.raises(ValueError, match="unknown fast-runtime trick"):
        use(make_model(), "fused_attention", "warp_speed")


def test_use_installs_in_place_and_reference_undoes_every_trick(monkeypatch):
    """``use`` changes how the model computes, never its weights or checkpoint; ``reference`` gives the core back."""
    monkeypatch.setattr("attnkit.fast.runtime.onednn_pays", lambda weights: True)  # as where oneDNN is faster
    core = make_model(dropout=0.1, activation_dropout=0.1)
    model = copy.deepcopy(core)
    assert use(model, *TRICKS) is model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is OneDNNLinear for m in linears)
    drops = [m for m in model.modules() if isinstance(m, (nn.Dropout, Dropout16))]
    assert drops and all(type(m) is Dropout16 and m.p == 0.1 for m in drops)
    kernels = [m.kernel for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert kernels and all(k.fused and k.decoding for k in kernels)
    assert all(m.linear is onednn_linear for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert model.projected_loss is attnkit.fast.loss.projected_smoothed_cross_entropy
    assert model.state_dict().keys() == core.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), core.state_dict().values()))
    # the tricks one by one keep each other: the attention kernel does both after two calls
    one = use(copy.deepcopy(core), "decoding_attention")
    use(one, "fused_attention")
    assert all(m.kernel.fused and m.kernel.decoding for m in one.modules() if isinstance(m, MultiHeadAttention))

    assert reference(model) is model
    assert not any(isinstance(m, Dropout16) for m in model.modules())
    assert [type(m) for m in model.modules()] == [type(m) for m in core.modules()]
    assert all(m.kernel is reference_attention for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert all("linear" not in m.__dict__ for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert all("projected_loss" not in m.__dict__ for m in model.modules())
    src, tgt = random_src(LENGTHS, seed=1), random_src([4, 4, 4, 4], seed=2)
    with torch.no_grad():
        assert torch.equal(model(src, tgt).logits, core(src, tgt).logits)


# --- "onednn_linear"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(37, 24), (3, 11, 24)])
def test_onednn_linear_equals_nn_linear_with_gradients(bias, shape):
    """The same outputs and gradients (input, weight, bias) as ``nn.Linear``, over the same parameters and state
    dict; without autograd, and under bf16 autocast, it is ``nn.Linear`` (the same bits)."""
    torch.manual_seed(0)
    core = nn.Linear(24, 40, bias=bias)
    fast = relinked(OneDNNLinear, copy.deepcopy(core))
    assert fast.state_dict().keys() == core.state_dict().keys()
    x = torch.randn(*shape, requires_grad=True)
    x_fast = x.detach().clone().requires_grad_()
    out, out_fast = core(x), fast(x_fast)
    torch.testing.assert_close(out_fast, out, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    out_fast.backward(grad)
    torch.testing.assert_close(x_fast.grad, x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.weight.grad, core.weight.grad, rtol=1e-5, atol=1e-4)
    if bias:
        torch.testing.assert_close(fast.bias.grad, core.bias.grad, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(fast(x), core(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(fast(x), core(x)) and fast(x).dtype == torch.bfloat16


def test_timing_onednn_leaves_the_random_stream_alone():
    from attnkit.fast.linear import onednn_pays

    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    onednn_pays([torch.randn(8, 4)], rows=16, repeats=1)
    torch.manual_seed(3)
    state = torch.get_rng_state()
    onednn_pays([torch.ones(8, 4)], rows=16, repeats=1)
    assert torch.equal(torch.get_rng_state(), state) and torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize("pays", [True, False])
def test_onednn_linear_installs_only_where_it_measures_faster(pays, monkeypatch):
    """Installed over the layers' own parameters (an optimizer holding them keeps training them) where oneDNN's
    products measure faster on the model's weight shapes, else the model is left as it is; a model with the trick
    trains a step as the core does."""
    timed = []
    monkeypatch.setattr("attnkit.fast.runtime.onednn_pays", lambda weights: timed.append(weights) or pays)
    core = make_model()
    model = copy.deepcopy(core)
    parameters = list(model.parameters())
    choices = {}
    use(model, "onednn_linear", choices=choices)
    assert len(timed) == 1 and {tuple(w.shape) for w in timed[0]} == {
        tuple(m.weight.shape) for m in core.modules() if type(m) is nn.Linear}
    assert choices == {"onednn_linear": pays}  # recorded, for a resumed run to follow
    other = use(copy.deepcopy(core), "onednn_linear", choices={"onednn_linear": not pays})
    assert len(timed) == 1  # a decision given is followed, not timed
    assert all((type(m) is OneDNNLinear) != pays for m in other.modules() if isinstance(m, nn.Linear))
    assert all(a is b for a, b in zip(model.parameters(), parameters, strict=True))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all((type(m) is OneDNNLinear) == pays for m in linears)
    attentions = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert attentions and all((m.linear is onednn_linear) == pays for m in attentions)  # cross-attention's slices
    src, tgt = random_src(LENGTHS, seed=1), random_src([4, 4, 4, 4], seed=2)
    losses = []
    for m in (core, model):
        loss = m(src, tgt).logits.float().logsumexp(-1).mean()
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(model.parameters(), core.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


# --- "fused_loss"


@pytest.mark.parametrize("products", ["PYTORCH", "ONEDNN"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_loss_block_by_block_equals_the_core_loss(products, eps, monkeypatch):
    """Rows in blocks (here 64, 64 and 22), with either library's products: the loss, NLL and gradients (hidden
    states and weight, scaled by the loss's own gradient) of the core's projection + ``label_smoothed_nll``; a
    padding target's row gets no gradient."""
    from attnkit.fast import loss as fast_loss

    monkeypatch.setattr(fast_loss, "CHUNK_BYTES", 1)
    monkeypatch.setattr(fast_loss, "products_for", lambda n_vocab, d_model: getattr(fast_loss, products))
    assert fast_loss.chunk_rows(50) == 64
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(6, 26, 16, generator=g)
    weight = torch.randn(50, 16, generator=g) / 2
    target = torch.randint(1, 50, (6, 26), generator=g)
    target[-1, -5:] = PAD  # 151 rows, 150 kept
    grad = assert_projected_loss_matches_core(fast_loss.projected_smoothed_cross_entropy, hidden, weight, target, eps,
                                              0.7, atol=1e-4)
    assert torch.all(grad[-1, -5:] == 0)


def test_fused_loss_under_bf16_autocast_multiplies_in_bf16_as_the_core_does():
    """Under bf16 autocast the fused loss's products take bf16 operands, as the core's projection does under
    autocast: its loss and gradients differ from fp32's by bf16's rounding, no more than the core's do."""
    from attnkit.fast.loss import projected_smoothed_cross_entropy
    from attnkit.nn.loss import projected_label_smoothed_nll

    g = torch.Generator().manual_seed(9)
    hidden = torch.randn(5, 60, 64, generator=g)
    weight = torch.randn(500, 64, generator=g) / 4
    target = torch.randint(1, 500, (5, 60), generator=g)

    def run(loss_fn, autocast: bool):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, _ = loss_fn(h, w, target, 0.1)
        loss.backward()
        assert loss.dtype == h.grad.dtype == w.grad.dtype == torch.float32
        return loss.detach(), h.grad, w.grad

    exact = run(projected_smoothed_cross_entropy, False)
    fused, core = run(projected_smoothed_cross_entropy, True), run(projected_label_smoothed_nll, True)
    for ours, theirs, fp32 in zip(fused, core, exact, strict=True):
        error = float((ours - fp32).norm() / fp32.norm())
        assert 0 < error < 1e-2  # bf16 products, not fp32 ones
        assert error <= 1.5 * float((theirs - fp32).norm() / fp32.norm()) + 1e-6


def test_fused_loss_times_its_products_once_and_follows_a_choice_given(monkeypatch):
    """The library of the fused loss's products is chosen by timing once a shape, on a generator of its own (the
    random stream untouched); a choice given (a resumed run's) replaces it, and installing the trick records it."""
    from attnkit.fast import loss as fast_loss

    monkeypatch.setattr(fast_loss, "_CHOSEN", {})
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    onednn = fast_loss.choose_products(300, 8)
    assert torch.equal(torch.rand(4), expected)
    assert fast_loss.products_for(300, 8) is (fast_loss.ONEDNN if onednn else fast_loss.PYTORCH)
    monkeypatch.setattr(fast_loss, "_onednn_faster", lambda n_vocab, d_model: pytest.fail("timed again"))
    assert fast_loss.choose_products(300, 8) == onednn  # kept, not timed again
    assert fast_loss.choose_products(300, 8, onednn=not onednn) == (not onednn)
    assert fast_loss.products_for(300, 8) is (fast_loss.PYTORCH if onednn else fast_loss.ONEDNN)

    model = make_model(share_embeddings=True)
    for given in (True, False):
        choices = {"onednn_loss": given}
        use(model, "fused_loss", choices=choices)
        assert choices == {"onednn_loss": given}
        assert fast_loss.products_for(*model.output.weight.shape) is (fast_loss.ONEDNN if given else fast_loss.PYTORCH)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("family", ["transformer", "transformer_lm"])
def test_fused_loss_equals_the_reference_loss(family, eps):
    """The fused output projection + loss gives the loss, NLL and parameter gradients of the core's
    ``label_smoothed_nll`` of the model's logits (and of the model's own core loss path), padding targets
    counting nothing."""
    core = make_model(share_embeddings=True) if family == "transformer" else _lm()
    fused = use(copy.deepcopy(core), "fused_loss")
    core.train()
    fused.train()
    b = _toy_batch(8, seed=5)
    assert b.tgt_out.eq(PAD).any()

    def run(model, reference_path: bool):
        model.zero_grad()
        if reference_path:
            loss, nll = label_smoothed_nll(model(b.src, b.tgt_in).logits, b.tgt_out, eps, ignore_index=PAD)
        else:
            out = model(b.src, b.tgt_in, targets=b.tgt_out, label_smoothing=eps)
            loss, nll = out.loss, out.nll
        (loss / b.n_tokens).backward()  # the training objective, as the Trainer scales it
        return loss.detach(), nll, {n: p.grad.clone() for n, p in model.named_parameters()}

    ref_loss, ref_nll, ref_grads = run(core, True)
    for loss, nll, grads in (run(fused, False), run(core, False)):
        assert not nll.requires_grad
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # without autograd too
        out = fused(b.src, b.tgt_in, targets=b.tgt_out, label_smoothing=eps)
        torch.testing.assert_close((out.loss, out.nll), (ref_loss, ref_nll), rtol=1e-5, atol=1e-5)


# --- "fused_attention"


def _padding(lengths: list[int], total: int) -> torch.Tensor:
    return torch.arange(total)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("length", [6, 70])
def test_fused_attention_layer_equals_core_with_masks_and_a_fully_padded_row(length, training, monkeypatch):
    """One multi-head attention, its fused kernel against the core's: padding (a row all padding: zero output
    from the heads, no NaN, in the outputs or the gradients), causal masks over as many keys as queries and over
    a cache (more keys than queries), cross-attention; outputs and input gradients. Sentences of 6 tokens take
    the short-keys kernel (padded to a vector's width), of 70 PyTorch's SDPA."""
    short = _count_calls(monkeypatch, fast_attention, "short_attention")
    sdpa = _count_calls(monkeypatch, fast_attention, "_sdpa")
    torch.manual_seed(0)
    core = MultiHeadAttention(32, 4).train(training)
    with torch.no_grad():
        core.in_proj.bias.normal_()
        core.out_proj.bias.normal_()
    fused = use(copy.deepcopy(core), "fused_attention")
    x, memory = torch.randn(3, length, 32), torch.randn(3, length - 1, 32)
    kpm, mem_kpm = _padding([length, 3, 0], length), _padding([length - 1, 2, 0], length - 1)
    prefix = KVCache(torch.randn(3, 4, 2, 8), torch.randn(3, 4, 2, 8))  # two cached positions: 2 more keys
    prefix_kpm = _padding([length + 2, 5, 0], length + 2)
    cases = {
        "padding": dict(key_padding_mask=kpm),
        "causal": dict(causal=True),
        "causal+padding": dict(causal=True, key_padding_mask=kpm),
        "causal over a cache": dict(causal=True, cache=prefix),
        "causal over a cache+padding": dict(causal=True, cache=prefix, key_padding_mask=prefix_kpm),
        "cross": dict(key_padding_mask=mem_kpm),
    }
    for name, kwargs in cases.items():
        outs = []
        for module in (core, fused):
            q = x.clone().requires_grad_(True)
            with torch.set_grad_enabled(training):
                out, weights, _ = module(q, memory if name == "cross" else None, **kwargs)
            assert weights is None
            grad = torch.autograd.grad(out.sum(), q)[0] if training else None
            outs.append((out, grad))
        (core_out, core_grad), (fused_out, fused_grad) = outs
        assert torch.isfinite(fused_out).all(), name
        assert _maxdiff(fused_out, core_out) <= 1e-5, name
        if training:
            assert torch.isfinite(fused_grad).all(), name
            assert _maxdiff(fused_grad, core_grad) <= 1e-5, name
        if "padding" in name or name == "cross":  # the third row sees no key: zero heads, the output's bias
            assert torch.equal(fused_out[2].detach(), fused.out_proj.bias.detach().expand(length, 32)), name
    # every case ran the fused kernel: the short-keys one below SHORT_KEYS keys, SDPA from there on
    assert (len(short), len(sdpa)) == ((len(cases), 0) if length + 2 < fast_attention.SHORT_KEYS else (0, len(cases)))


@pytest.mark.parametrize("keys", [1, 5, 15, 16, 17, 40])
def test_short_attention_equals_core_over_every_key_length_with_gradients(keys):
    """The short-keys kernel against the core's attention, below a vector's width (keys padded with zero weight),
    at it and above it: causal over more keys than queries, key padding with one sequence all padding, and
    attention dropout (the same mask drawn: the kernel's weights are the core's before dropout); outputs and the
    gradients of queries, keys and values."""
    torch.manual_seed(keys)
    b, h, t, dh = 3, 2, 4, 8
    q, k, v = torch.randn(b, h, t, dh), torch.randn(b, h, keys, dh), torch.randn(b, h, keys, dh)
    kpm = _padding([keys, max(keys - 2, 1), 0], keys)
    cases = [dict(), dict(key_padding_mask=kpm), dict(key_padding_mask=kpm, dropout=0.25)]
    if keys >= t:  # causal: every query sees at least its own key
        cases += [dict(causal=True), dict(key_padding_mask=kpm, causal=True)]
    for kwargs in cases:
        results = []
        for attention in (fast_attention.short_attention, None):
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            torch.manual_seed(1)
            if attention is None:
                out = reference_attention(*leaves, **kwargs)[0]
            else:
                out = attention(*leaves, kwargs.get("key_padding_mask"), kwargs.get("causal", False),
                                kwargs.get("dropout", 0.0))
            out.square().sum().backward()
            results.append((out, *(x.grad for x in leaves)))
        for fast, core, what in zip(*results, ("outputs", "queries", "keys", "values"), strict=True):
            assert torch.isfinite(fast).all(), (kwargs, what)
            torch.testing.assert_close(fast, core, rtol=1e-5, atol=1e-5, msg=f"{kwargs} {what}")


@torch.no_grad()
@pytest.mark.parametrize("keys", [1, 5, 17])
def test_broadcast_attention_compiled_equals_core_and_runs_where_a_graph_has_no_autograd(keys, monkeypatch):
    """The kernel a compiled graph without autograd runs, compiled as such a graph compiles it (dynamic sizes),
    against the core's attention: key padding with one sequence all padding (a zero output), causal over more keys
    than queries; and teacher_forced_attention picks it only while compiling without autograd."""
    torch.manual_seed(keys)
    b, h, t, dh = 3, 2, 4, 8
    q, k, v = torch.randn(b, h, t, dh), torch.randn(b, h, keys, dh), torch.randn(b, h, keys, dh)
    kpm = _padding([keys, max(keys - 2, 1), 0], keys)
    compiled = torch.compile(fast_attention.teacher_forced_attention, dynamic=True, fullgraph=True)
    cases = [dict(), dict(key_padding_mask=kpm), *([dict(causal=True)] if keys >= t else [])]
    broadcast = _count_calls(monkeypatch, fast_attention, "broadcast_attention")
    for kwargs in cases:
        out = compiled(q, k, v, kwargs.get("key_padding_mask"), kwargs.get("causal", False))
        torch.testing.assert_close(out, reference_attention(q, k, v, **kwargs)[0], rtol=1e-5, atol=1e-5,
                                   msg=str(kwargs))
    assert len(broadcast) == len(cases)  # traced once a case
    fast_attention.teacher_forced_attention(q, k, v, kpm)  # eagerly: not it
    assert len(broadcast) == len(cases)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("family", ["transformer", "transformer_lm"])
def test_fused_attention_model_equals_core(family, training, monkeypatch):
    """A Transformer (a source row all padding among them) and a language model (causal self-attention only):
    the fused kernels give the core's logits, in training (with autograd) and in eval, and the same gradients."""
    calls = _count_calls(monkeypatch, fast_attention, "teacher_forced_attention")
    core = make_model() if family == "transformer" else _lm()
    fused = use(copy.deepcopy(core), "fused_attention")
    src = random_src(LENGTHS, VOCAB, seed=3)
    src[3] = PAD  # a sentence of nothing but padding: its encoder and cross-attention see no key
    tgt = torch.cat([torch.full((4, 1), BOS), random_src([5, 5, 5, 5], VOCAB, seed=4)], 1)
    results = []
    for model in (core, fused):
        model.train(training)
        model.zero_grad()
        with torch.set_grad_enabled(training):
            logits = model(src, tgt).logits
        if training:
            logits.square().mean().backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (core_logits, core_grads), (fused_logits, fused_grads) = results
    assert torch.isfinite(fused_logits).all()
    assert _maxdiff(fused_logits, core_logits) <= 1e-5
    if training:
        for name, grad in fused_grads.items():
            if core_grads[name] is not None:
                assert torch.isfinite(grad).all(), name
                torch.testing.assert_close(grad, core_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert calls  # the fused kernel ran


# --- "decoding_attention"


def _decode(model, src, beam: int, a: float = 1.5, b: int = 3, need_weights: bool = False):
    lens = max_lengths(src.ne(PAD).sum(1), a, b) if src.size(1) else torch.tensor([13, 8, 11, 5])
    return generate(model, src, lens, beam_size=beam, n_best=beam, need_weights=need_weights)


def _same_hypotheses(fast, core, attention: bool = False):
    assert [[h.tokens for h in hyps] for hyps in fast] == [[h.tokens for h in hyps] for hyps in core]
    for fast_hyps, core_hyps in zip(fast, core):
        for f, c in zip(fast_hyps, core_hyps):
            assert math.isclose(f.score, c.score, rel_tol=1e-5, abs_tol=1e-5)
            if attention:
                torch.testing.assert_close(f.attention, c.attention, rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("family", ["transformer", "transformer_lm"])
def test_decoding_attention_equals_core(models, family, monkeypatch):
    """The single-query kernel of a decoding step: each step's log-probabilities, and greedy and beam search's
    hypotheses and scores, as the core's."""
    calls = _count_calls(monkeypatch, fast_attention, "single_query_attention")
    core = models[family]
    fast = use(copy.deepcopy(core), "decoding_attention")
    src = random_src(LENGTHS, VOCAB, seed=7) if family == "transformer" else torch.zeros(4, 0, dtype=torch.long)
    states = [m.init_state(m.encode(src)) for m in (core, fast)]
    tokens = torch.full((4,), BOS)
    for t in range(5):
        (a, states[0], _), (b, states[1], _) = core.step(tokens, states[0]), fast.step(tokens, states[1])
        assert _maxdiff(a, b) <= 1e-5, t
        tokens = a.argmax(-1)
    assert calls
    for beam in (1, 3, 5):
        _same_hypotheses(_decode(fast, src, beam), _decode(core, src, beam))


# --- "dropout16"


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout16_keeps_the_expectation_and_is_identity_in_eval(p):
    """Every ``nn.Dropout`` of the model becomes a 16-bit one of the same p. Training, it drops a fraction whose
    expectation is p' = round(p 65536) / 65536 and scales the rest by exactly 1 / (1 - p'), so the mean of many
    draws of a constant input is that input (within a statistical bound); the model's training loss has the core's
    expectation. In eval the model is the core's, bit for bit."""
    core = make_model(dropout=p, attention_dropout=0.0, activation_dropout=p)
    fast = use(copy.deepcopy(core), "dropout16")
    core_drops = [m for m in core.modules() if isinstance(m, nn.Dropout)]
    fast_drops = [m for m in fast.modules() if isinstance(m, Dropout16)]
    assert len(fast_drops) == len(core_drops) > 0 and all(m.p == p for m in fast_drops)
    assert not any(type(m) is nn.Dropout for m in fast.modules())

    # one of the model's own dropouts, on a constant input, many draws
    layer = fast_drops[0].train()
    p16 = round(p * 65536) / 65536
    torch.manual_seed(0)
    c, n = 1.5, 1_000_000
    y = torch.stack([layer(torch.full((n,), c)) for _ in range(4)])
    dropped = float(y.eq(0).double().mean())
    assert abs(dropped - p16) < 5 * (p16 * (1 - p16) / y.numel()) ** 0.5
    survivors = y[y.ne(0)]
    scale = 65536 / (65536 - round(p * 65536))  # 1 / (1 - p'): (1 - p') * scale * c = c
    assert math.isclose((1 - p16) * scale, 1.0, rel_tol=1e-15)
    assert torch.equal(survivors, torch.full_like(survivors, c) * scale)
    sd = c * (p16 / (1 - p16)) ** 0.5  # of one draw
    assert abs(float(y.double().mean()) - c) < 5 * sd / y.numel() ** 0.5

    # the model's training loss: the same expectation as with the core's dropout
    b = _toy_batch(8, seed=1)
    losses = {}
    for name, model in (("core", core), ("fast", fast)):
        model.train()
        torch.manual_seed(1)
        with torch.no_grad():
            losses[name] = torch.stack([model(b.src, b.tgt_in, targets=b.tgt_out).loss for _ in range(200)]).double()
    spread = (losses["core"].var() / 200 + losses["fast"].var() / 200).sqrt()
    assert abs(float(losses["core"].mean() - losses["fast"].mean())) < 5 * float(spread)
    assert float(losses["fast"].std()) > 0  # dropout did act

    core.eval()
    fast.eval()
    src, tgt = random_src(LENGTHS, seed=2), random_src([4, 4, 4, 4], seed=3)
    with torch.no_grad():
        assert torch.equal(fast(src, tgt).logits, core(src, tgt).logits)
    x = torch.randn(5, 7)
    assert layer.eval()(x) is x


# --- FastDecoder: grouped beams, lazy reordering, chunked ranking


@torch.no_grad()
@pytest.mark.parametrize("chunk", [None, 2])
@pytest.mark.parametrize("kernels", [False, True])
@pytest.mark.parametrize("family", ["transformer", "conv_transformer", "transformer_lm", "rnnsearch"])
def test_fast_decoder_finds_the_core_hypotheses(models, family, kernels, chunk, monkeypatch):
    """``FastDecoder(model)`` (and ``attnkit.fast.decoder``, which also installs the attention kernels): greedy
    and beam search hypotheses and scores (and attention, where the family has it) as the model's own, whether
    the ranking takes its chunked path (``chunk`` 2 at any size) or not."""
    if chunk is not None:
        monkeypatch.setattr(ranking, "CHUNK", chunk)
        monkeypatch.setattr(ranking, "SMALL", 0)
    core = models[family]
    fast = attnkit.fast.decoder(copy.deepcopy(core)) if kernels else FastDecoder(core)
    assert isinstance(fast, FastDecoder)
    assert fast.grouped == (family in ("transformer", "conv_transformer"))
    src = torch.zeros(4, 0, dtype=torch.long) if family == "transformer_lm" else random_src(LENGTHS, VOCAB, seed=7)
    weights = [False] if family == "transformer_lm" else [False, True]
    for beam in (1, 3, 5):
        for need_weights in weights:
            _same_hypotheses(_decode(fast, src, beam, need_weights=need_weights),
                             _decode(core, src, beam, need_weights=need_weights), attention=need_weights)
    if family in ("transformer", "rnnsearch"):  # trained: sentences end at varied steps, some before the limit
        lens = max_lengths(src.ne(PAD).sum(1), 1.5, 3)
        ends = [len(h[0].tokens) for h in _decode(fast, src, 3)]
        assert len(set(ends)) > 1 and any(n < int(m) - 1 for n, m in zip(ends, lens))


@torch.no_grad()
def test_grouped_state_round_trips_through_its_tensors(transformer):
    """The grouped state as flat tensors (what an exported step takes) and back: the next step is the same."""
    fast = FastDecoder(transformer)
    src = random_src(LENGTHS, VOCAB, seed=7)
    state = fast.init_state(fast.encode(src)).repeat_beams(3)
    _, state, _ = fast.step(torch.arange(12) % 7 + 4, state)
    state = state.select(torch.tensor([2, 0, 0, 3, 5, 4, 8, 8, 6, 9, 11, 10]), same_source=True)
    assert isinstance(state.caches[0], ReorderedKVCache) and state.caches[0].order is not None
    again = GroupedDecoderState.from_tensors(state.tensors(), beams=3)
    assert again.offset == state.offset and again.rows == state.rows
    tokens = torch.arange(12) % 5 + 6
    a, _, _ = fast.step(tokens, state)
    b, _, _ = fast.step(tokens, again)
    assert torch.equal(a, b)


# --- the core stays free of the compilers


CORE_FILES = sorted([*SRC.glob("nn/*.py"), *SRC.glob("models/*.py"), *SRC.glob("decode/*.py")])
COMPILER = re.compile(r"torch\._|torch\.compiler|inductor|dynamo", re.IGNORECASE)


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_core_files_use_no_compiler_or_torch_private_api(path):
    """The lectures' core (attnkit.nn, the models, the search) reads as plain PyTorch: no private ``torch._`` API,
    no ``torch.compiler``, Inductor or Dynamo; those belong to attnkit.fast."""
    hits = [f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if COMPILER.search(line)]
    assert not hits, "\n".join(hits)


def test_the_core_files_are_found():
    names = {str(p.relative_to(SRC)) for p in CORE_FILES}
    assert {"nn/attention.py", "nn/blocks.py", "nn/loss.py", "models/transformer.py", "models/contract.py",
            "decode/search.py"} <= names
