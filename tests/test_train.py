"""Training: the loss, the schedules, exact resume, checkpoints and their averaging."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnkit import fast
from attnkit.config import TrainConfig, load_config, validate
from attnkit.data import generate_dates, load_tokenizers, token_batches
from attnkit.errors import AttnkitError
from attnkit.fast.loss import projected_smoothed_cross_entropy, smoothed_cross_entropy
from attnkit.fast.precision import cpu_flags
from attnkit.models.captioner import ShowAttendTellConfig, TransformerCaptionerConfig
from attnkit.models.classifier import BertClassifierConfig
from attnkit.models.gpt_classifier import GPTClassifierConfig
from attnkit.models.lm import LMConfig
from attnkit.models.rnn import RNNEncDecConfig, RNNSearchConfig
from attnkit.models.transformer import TransformerConfig
from attnkit.nn.loss import label_smoothed_nll, projected_label_smoothed_nll
from attnkit.train import (
    Trainer,
    average_checkpoints,
    learning_rate,
    load_checkpoint,
    read_metrics,
    write_checkpoint,
)
from conftest import assert_projected_loss_matches_core, tiny_experiment

# --- label-smoothed cross entropy: the core's reference (attnkit.nn.loss) and the fast runtime's fused one
# (attnkit.fast.loss), each against a direct computation and PyTorch, and against each other

LOSSES = [label_smoothed_nll, smoothed_cross_entropy]
LOSS_IDS = ["reference", "fused"]
PROJECTED = [projected_label_smoothed_nll, projected_smoothed_cross_entropy]


def _loss_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    target = torch.randint(1, 11, (3, 5), generator=g)
    target[0, 3:] = 0  # padding
    target[2, 1:] = 0
    return logits, target


@pytest.mark.parametrize("loss_fn", LOSSES, ids=LOSS_IDS)
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_nll_matches_direct_computation(eps, loss_fn):
    logits, target = _loss_inputs()
    loss, nll = loss_fn(logits, target, eps)
    logp = torch.log_softmax(logits.double(), -1)
    expected_loss, expected_nll, n = 0.0, 0.0, 0
    for b in range(3):
        for t in range(5):
            y = int(target[b, t])
            if y == 0:
                continue
            n += 1
            token_nll = -float(logp[b, t, y])
            expected_nll += token_nll
            expected_loss += (1 - eps) * token_nll + eps * float(-logp[b, t].mean())
    assert n == 3 + 5 + 1
    assert math.isclose(float(loss), expected_loss, rel_tol=1e-5)
    assert math.isclose(float(nll), expected_nll, rel_tol=1e-5)
    ce = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    assert math.isclose(float(nll), float(ce), rel_tol=1e-5)


@pytest.mark.parametrize("loss_fn", LOSSES, ids=LOSS_IDS)
def test_label_smoothed_nll_gradients(loss_fn):
    logits, target = _loss_inputs(1)
    logits.requires_grad_(True)
    loss, nll = loss_fn(logits, target, 0.1)
    assert not nll.requires_grad
    loss.backward()
    assert torch.all(logits.grad[target.eq(0)] == 0)  # pads contribute nothing
    assert logits.grad[target.ne(0)].abs().sum() > 0


@pytest.mark.parametrize("loss_fn", LOSSES, ids=LOSS_IDS)
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("sharpness", [1.0, 50.0])  # 50: most probabilities underflow to 0
def test_label_smoothed_nll_equals_pytorch_cross_entropy_in_value_and_gradient(eps, sharpness, loss_fn):
    logits, target = _loss_inputs(2)
    logits = logits * sharpness
    ours = logits.double().requires_grad_(True)
    theirs = logits.double().requires_grad_(True)
    loss, _ = loss_fn(ours, target, eps)
    ref = F.cross_entropy(theirs.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum")
    (2.5 * loss).backward()
    (2.5 * ref).backward()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("sharpness", [1.0, 50.0])
def test_fused_loss_equals_the_reference(eps, sharpness):
    """attnkit.fast.loss against attnkit.nn.loss on the same inputs: loss, NLL and gradients, with and without
    autograd, for the plain loss and the one fused with the output projection."""
    logits, target = _loss_inputs(5)
    logits = logits * sharpness
    fused_in, ref_in = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    loss, nll = smoothed_cross_entropy(fused_in, target, eps)
    ref_loss, ref_nll = label_smoothed_nll(ref_in, target, eps)
    (1.5 * loss).backward()
    (1.5 * ref_loss).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(fused_in.grad, ref_in.grad, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(smoothed_cross_entropy(logits, target, eps), (ref_loss.detach(), ref_nll))

    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(3, 5, 8, generator=g)
    weight = torch.randn(11, 8, generator=g) * sharpness / 8
    assert_projected_loss_matches_core(projected_smoothed_cross_entropy, hidden, weight, target, eps, 1.5)


@pytest.mark.internals  # autograd's version counter and its message
def test_label_smoothed_nll_refuses_a_second_backward():
    """The fused loss turns its saved softmax into the gradient in place: a second backward is refused."""
    logits, target = _loss_inputs(3)
    logits.requires_grad_(True)
    loss, _ = smoothed_cross_entropy(logits, target, 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("projected_loss", PROJECTED, ids=LOSS_IDS)
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("sharpness", [1.0, 50.0])
def test_projected_loss_equals_projection_then_pytorch_cross_entropy(eps, sharpness, projected_loss):
    """The output projection + loss (the reference, and the fused one): same value, NLL and gradients (hidden
    states and weight) as logits made for every position followed by ``F.cross_entropy``; padding rows get no
    gradient."""
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(3, 5, 8, generator=g)
    weight = torch.randn(11, 8, generator=g) * sharpness / 8
    _, target = _loss_inputs(4)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    h2, w2 = hidden.double().requires_grad_(True), weight.double().requires_grad_(True)
    loss, nll = projected_loss(h1, w1, target, eps)
    logits = (h2 @ w2.t()).view(-1, 11)
    ref = F.cross_entropy(logits, target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum")
    ref_nll = F.cross_entropy(logits.detach(), target.view(-1), ignore_index=0, reduction="sum")
    (2.5 * loss).backward()
    (2.5 * ref).backward()
    assert not nll.requires_grad
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h1.grad.double(), h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w1.grad.double(), w2.grad, rtol=1e-4, atol=1e-5)
    assert torch.all(h1.grad[target.eq(0)] == 0)
    with torch.no_grad():  # the path without autograd gives the same numbers
        torch.testing.assert_close(projected_loss(h1, w1, target, eps), (loss, nll))


@pytest.mark.parametrize("tricks", [(), ("fused_loss",), fast.TRAINING], ids=["core", "fused_loss", "training"])
def test_transformer_training_loss_equals_loss_of_its_logits(tricks):
    """``model(src, tgt_in, targets=...).loss`` (the core's projection + loss, or the fast runtime's fused one that
    makes logits only at non-pad targets) gives the loss, NLL and parameter gradients of
    ``label_smoothed_nll(model(src, tgt_in).logits)``."""
    from attnkit.models import Transformer

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=2,
                                          dropout=0.0, share_embeddings=True), 13, 13)
    fast.use(model, *tricks)
    fused = "fused_loss" in tricks
    assert (model.projected_loss is projected_smoothed_cross_entropy) == fused  # the trick is (not) installed
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt_in = torch.tensor([[1, 4, 5, 6, 7], [1, 9, 10, 0, 0]])
    tgt_out = torch.tensor([[4, 5, 6, 7, 2], [9, 10, 2, 0, 0]])
    out = model(src, tgt_in, targets=tgt_out, label_smoothing=0.1)
    loss, nll = out.loss, out.nll
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref, ref_nll = label_smoothed_nll(model(src, tgt_in).logits, tgt_out, 0.1)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_fast_use_and_reference_keep_each_modules_train_or_eval_mode():
    """``fast.use`` installs its tricks in place, results unchanged: a model in eval mode stays without dropout
    (and ``fast.reference`` undoes them the same way)."""
    from attnkit.models import Transformer

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                                          dropout=0.3), 13, 13).eval()
    src, tgt_in = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 4, 5, 6]])
    with torch.no_grad():
        before = model(src, tgt_in).logits
        fast.use(model, *fast.TRAINING)
        assert not any(m.training for m in model.modules())
        torch.testing.assert_close(model(src, tgt_in).logits, before, rtol=1e-5, atol=1e-5)
        fast.reference(model)
        assert not any(m.training for m in model.modules())
        assert torch.equal(model(src, tgt_in).logits, before)


# --- mixed precision


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_fp16_and_cuda_are_refused_without_a_gpu(tmp_path, dates_pairs):
    with pytest.raises(AttnkitError, match=r"train.precision = 'fp16' is for CUDA, and this run is on the cpu: use "
                                           r"bf16 \(on a CPU with avx512_bf16 or amx_bf16\) or fp32"):
        Trainer(tiny_experiment(precision="fp16"), tmp_path, train_pairs=dates_pairs,
                valid_pairs=generate_dates(20, seed=1))
    with pytest.raises(AttnkitError, match=r"train.device = 'cuda', but this machine has no CUDA device"):
        Trainer(tiny_experiment(device="cuda"), tmp_path, train_pairs=dates_pairs,
                valid_pairs=generate_dates(20, seed=1))


def test_bf16_training_is_refused_on_a_cpu_without_its_instructions(tmp_path, dates_pairs, monkeypatch):
    from attnkit.fast import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    with pytest.raises(AttnkitError) as e:
        Trainer(tiny_experiment(precision="bf16", device="cpu"), tmp_path, train_pairs=dates_pairs,
                valid_pairs=generate_dates(20, seed=1))
    assert str(e.value).startswith("train.precision: bf16 needs a CPU with avx512_bf16 or amx_bf16")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("flags", "bf16_seconds"), [({"avx2", "fma"}, 0.5), ({"avx2", "avx512f", "avx512_bf16"}, 0.5),
                                                    ({"avx2", "amx_bf16"}, 0.5), ({"avx2", "amx_bf16"}, 2.0)])
def test_auto_precision_trains_bf16_only_where_the_cpu_has_its_instructions_and_it_measures_faster(
        tmp_path, dates_pairs, monkeypatch, flags, bf16_seconds):
    """``train.precision = "auto"`` on a CPU with AVX512_BF16 or AMX-BF16 times a batch's forward and backward in
    both precisions and autocasts to bf16 only if that was faster (here the timings are given: 1 s in fp32); it
    trains fp32 without the instructions (never refused, nothing timed). run.jsonl records what it resolved to,
    metrics.jsonl the timings, and a resumed run keeps the choice without timing again."""
    from attnkit.fast import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    timed = []
    monkeypatch.setattr(Trainer, "precision_seconds",
                        lambda self: timed.append(self.progress.step) or {"fp32": 1.0, "bf16": bf16_seconds})
    cfg = tiny_experiment(precision="auto", device="cpu", max_steps=2, save_every=1, eval_every=0)
    trainer = Trainer(cfg, tmp_path, train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1))
    seen = []
    trainer.model.encoder[0].ffn.linear1.register_forward_hook(
        lambda m, i, out: seen.append(out.dtype) if m.training else None)
    trainer.train()
    has = bool(flags & {"avx512_bf16", "amx_bf16"})
    expected = "bf16" if has and bf16_seconds < 1.0 else "fp32"
    assert set(seen) == {torch.bfloat16 if expected == "bf16" else torch.float32}
    assert timed == ([0] if has else [])
    launches = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [launch["precision"] for launch in launches] == [expected]
    chosen = [r for r in read_metrics(tmp_path) if "seconds_per_batch" in r]
    assert chosen == ([{"step": 0, "precision": expected, "seconds_per_batch": {"fp32": 1.0, "bf16": bf16_seconds}}]
                      if has else [])
    resumed = Trainer(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=3)), tmp_path,
                      train_pairs=dates_pairs,
                      valid_pairs=generate_dates(20, seed=1))
    resumed.resume(tmp_path / "checkpoints" / "step-1")
    seen.clear()
    resumed.model.encoder[0].ffn.linear1.register_forward_hook(
        lambda m, i, out: seen.append(out.dtype) if m.training else None)
    resumed.train()
    assert timed == ([0] if has else []) and resumed.precision == expected
    assert set(seen) == {torch.bfloat16 if expected == "bf16" else torch.float32}


@pytest.mark.skipif(not {"avx512_bf16", "amx_bf16"} & cpu_flags(),
                    reason="bf16 training runs only on a CPU with AVX512_BF16 or AMX-BF16")
def test_timing_the_precisions_leaves_the_model_and_its_random_stream_alone(tmp_path, dates_pairs):
    """:meth:`Trainer.precision_seconds` times both precisions on a model of its own: the trainer's weights,
    gradients and random stream (dropout's) stay as they were, so a run that measured trains as one that did not."""
    trainer = Trainer(tiny_experiment(precision="auto", device="cpu"), tmp_path, train_pairs=dates_pairs,
                      valid_pairs=generate_dates(20, seed=1))
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rng = torch.get_rng_state()
    seconds = trainer.precision_seconds()
    assert set(seconds) == {"fp32", "bf16"} and all(0 < v < 60 for v in seconds.values())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_trainer_bounds_the_kernel_caches_before_it_builds_its_model(tmp_path, dates_pairs, monkeypatch):
    """oneDNN and ideep read their cache capacities at their first kernel, so the Trainer sets them first (what
    the bound does to a process's memory, and that it leaves the environment's own: tests/test_memory.py)."""
    from attnkit.fast.memory import KERNEL_CACHE_CAPACITY

    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    built, build = [], Trainer.build_model

    def build_model(self):
        built.append((os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), os.environ.get("LRU_CACHE_CAPACITY")))
        return build(self)

    monkeypatch.setattr(Trainer, "build_model", build_model)
    Trainer(tiny_experiment(max_steps=1), tmp_path, train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1))
    assert built == [(str(KERNEL_CACHE_CAPACITY),) * 2]


@pytest.mark.skipif(not {"avx512_bf16", "amx_bf16"} & cpu_flags(),
                    reason="bf16 training runs only on a CPU with AVX512_BF16 or AMX-BF16")
def test_bf16_training_on_a_cpu_computes_its_matrix_products_in_bf16_and_tracks_fp32(tmp_path, dates_pairs):
    """Autocast on the CPU: the layers' matrix products in bf16 while training, fp32 master weights, fp32
    validation, and the same steps reach about the validation loss fp32 reaches."""
    results = {}
    for precision in ("fp32", "bf16"):
        trainer = Trainer(tiny_experiment(precision=precision, device="cpu", max_steps=6), tmp_path / precision,
                          train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1))
        seen = []
        trainer.model.encoder[0].ffn.linear1.register_forward_hook(
            lambda m, i, out, seen=seen: seen.append((m.training, out.dtype)))
        results[precision] = trainer.train()["valid_loss"]
        training = torch.bfloat16 if precision == "bf16" else torch.float32
        assert {dtype for is_training, dtype in seen if is_training} == {training}
        assert {dtype for is_training, dtype in seen if not is_training} == {torch.float32}
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert math.isfinite(results["bf16"])
    assert results["bf16"] == pytest.approx(results["fp32"], rel=0.02)


def test_mixed_precision_step_and_loss_scale_survive_a_resume(tmp_path, dates_pairs):
    """The step ``train.precision`` takes on CUDA (autocast, loss scaling, gradients unscaled before clipping,
    the scaler's step), run on the CPU's autocast: the config refuses fp16 on a CPU, so the test sets the
    trainer's two attributes itself. Validation stays fp32; the loss scale is saved and resumed."""
    def mixed(trainer, scale):
        trainer.amp_dtype = torch.bfloat16
        trainer.scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1)
        return trainer

    cfg = tiny_experiment(max_steps=2, save_every=1, clip_norm=0.5)
    trainer = mixed(Trainer(cfg, tmp_path, train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1)), 2.0**10)
    seen = []
    trainer.model.encoder[0].ffn.linear1.register_forward_hook(lambda m, i, out: seen.append((m.training, out.dtype)))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    result = trainer.train()
    assert {dtype for training, dtype in seen if training} == {torch.bfloat16}
    assert {dtype for training, dtype in seen if not training} == {torch.float32}
    assert math.isfinite(result["valid_loss"])
    assert trainer.scaler.get_scale() == 2.0**12  # two steps without overflow, growing every step
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # fp32 master weights
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    resumed = mixed(Trainer(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_steps=3)), tmp_path,
                            train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1)), 1.0)
    resumed.resume(tmp_path)
    assert resumed.scaler.get_scale() == 2.0**12


# --- learning-rate schedules


def _tcfg(**kw) -> TrainConfig:
    return dataclasses.replace(TrainConfig(), **kw)


def test_noam_is_the_papers_formula():
    cfg = _tcfg(schedule="noam", lr=1.0, warmup_steps=4000)
    for step in (1, 10, 100, 3999, 4000, 4001, 10000, 100000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert math.isclose(learning_rate(step, cfg, 512), expected, rel_tol=1e-12), step
    assert learning_rate(0, cfg, 512) == learning_rate(1, cfg, 512)
    scaled = _tcfg(schedule="noam", lr=2.0, warmup_steps=4000)
    assert math.isclose(learning_rate(123, scaled, 512), 2 * learning_rate(123, cfg, 512), rel_tol=1e-12)
    steps = range(1, 12001)
    assert max(steps, key=lambda s: learning_rate(s, cfg, 512)) == 4000


def test_inverse_sqrt_peaks_at_warmup():
    cfg = _tcfg(schedule="inverse_sqrt", lr=5e-4, warmup_steps=100)
    values = {s: learning_rate(s, cfg, 256) for s in range(1, 1001)}
    assert max(values, key=values.get) == 100
    assert math.isclose(values[100], 5e-4, rel_tol=1e-12)
    assert math.isclose(values[50], 2.5e-4, rel_tol=1e-12)  # linear warmup
    assert math.isclose(values[400], 2.5e-4, rel_tol=1e-12)  # 1/sqrt decay
    assert all(values[s] < values[s + 1] for s in range(1, 100))
    assert all(values[s] > values[s + 1] for s in range(100, 1000))


def test_cosine_reaches_min_lr_at_max_steps():
    cfg = _tcfg(schedule="cosine", lr=1e-3, min_lr=1e-5, warmup_steps=10, max_steps=110)
    assert math.isclose(learning_rate(10, cfg, 256), 1e-3, rel_tol=1e-12)
    assert math.isclose(learning_rate(60, cfg, 256), (1e-3 + 1e-5) / 2, rel_tol=1e-12)
    assert math.isclose(learning_rate(110, cfg, 256), 1e-5, rel_tol=1e-12)
    assert math.isclose(learning_rate(500, cfg, 256), 1e-5, rel_tol=1e-12)
    assert all(learning_rate(s, cfg, 256) > learning_rate(s + 1, cfg, 256) for s in range(10, 110))


def _timed_by_updates(monkeypatch, tmp_path, dates_pairs, seconds) -> tuple[Trainer, list[dict]]:
    """A run with a fitted cosine over a 1-minute budget and 10 warmup steps, trained on a clock that moves only
    while the model trains: update n takes ``seconds(n)``. The trainer and its metrics."""
    import attnkit.train.trainer as trainer_module

    clock, done = [0.0], [0]
    monkeypatch.setattr(trainer_module, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0]),
                                                                    "strftime": staticmethod(lambda f: "now")}))
    update = Trainer._update

    def timed(self, *args):
        done[0] += 1
        clock[0] += seconds(done[0])
        return update(self, *args)

    monkeypatch.setattr(Trainer, "_update", timed)
    cfg = tiny_experiment(schedule="cosine", lr=1e-3, min_lr=1e-5, warmup_steps=10, max_steps=1000, max_minutes=1,
                          fit_schedule=True, log_every=1)
    trainer = Trainer(cfg, tmp_path / "run", train_pairs=dates_pairs, valid_pairs=generate_dates(10, seed=1))
    trainer.train()
    return trainer, read_metrics(tmp_path / "run")


def test_a_fitted_schedule_ends_with_the_time_budget_and_is_kept_for_a_resume(tmp_path, dates_pairs, monkeypatch):
    """``train.fit_schedule``: on a machine where an update takes one second, a 1-minute budget and 10 warmup
    steps: the speed measured over steps 5 to 10 puts the cosine's last step at 10 + floor(0.97 * 50 s / 1 s) = 58,
    where the learning rate reaches min_lr and the run ends (before the budget), whatever max_steps says; the
    checkpoint keeps that step. Without a budget it is one line."""
    trainer, records = _timed_by_updates(monkeypatch, tmp_path, dates_pairs, lambda n: 1.0)
    cfg = trainer.cfg
    assert {"step": 10, "schedule_steps": 58} in records
    lrs = {r["step"]: r["lr"] for r in records if "lr" in r}
    assert trainer.progress.step == max(lrs) == 58 and trainer.progress.train_seconds == 58.0
    assert all(math.isclose(lrs[s], learning_rate(s, cfg.train, 0, 58), rel_tol=1e-12) for s in lrs)
    assert math.isclose(lrs[58], 1e-5) and math.isclose(lrs[10], 1e-3)
    meta = json.loads((tmp_path / "run" / "checkpoints" / "last" / "meta.json").read_text())
    assert meta["progress"]["schedule_steps"] == 58

    with pytest.raises(AttnkitError, match=r"^config: train.fit_schedule = true fits .* train.max_minutes, "):
        validate(tiny_experiment(fit_schedule=True))


def test_a_fitted_schedule_moves_its_end_once_to_the_speed_after_warmup(tmp_path, dates_pairs, monkeypatch):
    """Updates of 1.5 s through warmup (10 steps), then of 1 s: fitted at warmup, the end is 10 + floor(0.97 * 45 s /
    1.5 s) = 39; measured again over the next fifth of those steps (to step 15, 20 s in), it moves to 15 + floor(0.97
    * 40 s / 1 s) = 53, where the run ends 58 s in, instead of 44 s into its minute. Each step's learning rate is the
    schedule's with the end known then, and the end moves no more."""
    trainer, records = _timed_by_updates(monkeypatch, tmp_path, dates_pairs, lambda n: 1.5 if n <= 10 else 1.0)
    assert [r for r in records if "schedule_steps" in r] == [{"step": 10, "schedule_steps": 39},
                                                             {"step": 15, "schedule_steps": 53}]
    assert trainer.progress.step == 53 and trainer.progress.train_seconds == 58.0
    lrs = {r["step"]: r["lr"] for r in records if "lr" in r}
    assert all(math.isclose(lrs[s], learning_rate(s, trainer.cfg.train, 0, 39 if s <= 15 else 53), rel_tol=1e-12)
               for s in lrs)
    assert math.isclose(lrs[53], 1e-5)


def test_constant_only_warms_up():
    cfg = _tcfg(schedule="constant", lr=3e-4, warmup_steps=10)
    assert math.isclose(learning_rate(5, cfg, 64), 1.5e-4, rel_tol=1e-12)
    assert learning_rate(10, cfg, 64) == learning_rate(10_000, cfg, 64) == 3e-4


# --- exact resume


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("n_pairs,max_tokens,n", [(300, 160, 6), (40, 120, 4)], ids=["mid-epoch", "across-epochs"])
def test_resume_is_exact(tmp_path, n_pairs, max_tokens, n):
    pairs, valid = generate_dates(n_pairs, seed=0), generate_dates(10, seed=1)

    def trainer(run, steps):
        cfg = tiny_experiment(max_steps=steps, save_every=n, max_tokens=max_tokens)
        assert cfg.model.dropout > 0
        return Trainer(cfg, tmp_path / run, train_pairs=pairs, valid_pairs=valid)

    first = trainer("A", n)
    first.train()
    n_batches = len(token_batches(*first.task.lengths("train"), max_tokens, seed=first.cfg.train.seed))
    if n_pairs == 300:
        assert first.progress.epoch == 0 and 0 < first.progress.batch_in_epoch < n_batches  # stopped mid-epoch
    else:
        assert n < n_batches < 2 * n  # the second half crosses into the next epoch
    after_first = _weights(first.model)
    del first

    resumed = trainer("A", 2 * n)
    assert not all(torch.equal(v, after_first[k]) for k, v in resumed.model.state_dict().items())
    resumed.resume(tmp_path / "A")
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, after_first[k]), k
    assert resumed.progress.step == n
    assert read_metrics(tmp_path / "A")[-1] == {"step": n, "resumed_from": f"step-{n}"}
    resumed.train()

    (tmp_path / "B").mkdir()
    shutil.copy(tmp_path / "A" / "spm.model", tmp_path / "B" / "spm.model")  # the same tokenizer, not a retrained one
    straight = trainer("B", 2 * n)
    straight.train()

    assert resumed.progress.step == straight.progress.step == 2 * n
    assert (resumed.progress.epoch, resumed.progress.batch_in_epoch) == \
        (straight.progress.epoch, straight.progress.batch_in_epoch)
    if n_pairs != 300:
        assert straight.progress.epoch == 1
    a, b = resumed.model.state_dict(), straight.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert not all(torch.equal(a[k], after_first[k]) for k in a)  # the second half did train
    sa, sb = resumed.optimizer.state_dict()["state"], straight.optimizer.state_dict()["state"]
    for i in sa:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[i][name], sb[i][name]), (i, name)


def test_a_resumed_run_follows_the_timed_decisions_of_its_first_process(tmp_path, monkeypatch):
    """train.fast's tricks that time what pays on the machine decide once per run: a resumed process that would
    decide otherwise installs what the run's first process decided (kept in its progress), over the same
    parameters the optimizer holds, so that it computes the same bits."""
    from attnkit.fast.linear import OneDNNLinear, onednn_linear
    from attnkit.nn import MultiHeadAttention

    pairs, valid = generate_dates(60, seed=0), generate_dates(10, seed=1)
    monkeypatch.setattr("attnkit.fast.runtime.onednn_pays", lambda weights: True)
    first = Trainer(tiny_experiment(max_steps=2, save_every=2), tmp_path / "A", train_pairs=pairs, valid_pairs=valid)
    assert "onednn_linear" in first.cfg.train.fast
    first.train()
    kept = json.loads((tmp_path / "A" / "checkpoints" / "last" / "meta.json").read_text())["progress"]["fast"]
    assert kept["onednn_linear"] is True and set(kept) == {"onednn_linear", "onednn_loss"}

    monkeypatch.setattr("attnkit.fast.runtime.onednn_pays", lambda weights: False)  # this machine now says no
    resumed = Trainer(tiny_experiment(max_steps=4), tmp_path / "A", train_pairs=pairs, valid_pairs=valid)
    linears = lambda: [m for m in resumed.model.modules() if isinstance(m, torch.nn.Linear)]  # noqa: E731
    assert not any(isinstance(m, OneDNNLinear) for m in linears())
    resumed.resume(tmp_path / "A")
    assert linears() and all(type(m) is OneDNNLinear for m in linears())
    assert all(m.linear is onednn_linear for m in resumed.model.modules() if isinstance(m, MultiHeadAttention))
    assert resumed.progress.fast == kept
    held = {id(p) for group in resumed.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in resumed.model.parameters()}
    resumed.train()
    assert resumed.progress.step == 4


def test_read_metrics_drops_what_a_killed_run_logged_after_its_checkpoint(tmp_path):
    killed = [{"step": s, "train_nll": 9.0 - s} for s in (1, 2, 3, 4, 5)] + [{"step": 4, "valid_loss": 5.0}]
    resumed = [{"step": 4, "resumed_from": "step-4"}, {"step": 5, "train_nll": 1.0}, {"step": 6, "train_nll": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in killed + resumed))
    assert read_metrics(tmp_path) == killed[:4] + [killed[5]] + resumed

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "tr')
    with pytest.raises(AttnkitError, match=r"metrics.jsonl:2: not a JSON record"):
        read_metrics(tmp_path)


def test_resume_refuses_a_checkpoint_without_trainer_state(tmp_path, trained_checkpoint):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained_checkpoint, ckpt)
    (ckpt / "trainer.safetensors").unlink()
    t = Trainer(tiny_experiment(), tmp_path / "run", train_pairs=generate_dates(50), valid_pairs=generate_dates(5, 1))
    shutil.copy(ckpt / "spm.model", tmp_path / "run" / "spm.model")
    with pytest.raises(AttnkitError, match="cannot resume"):
        t.resume(ckpt)


# --- the metric that ranks checkpoints: the task declares it, the trainer follows the declaration


def _dates_task(cfg, run: Path, metrics: tuple, metric: str):
    """The dates translation task, declaring ``metrics`` (ranking by ``metric``) instead of its own."""
    from attnkit.train.tasks import TranslationTask

    task = TranslationTask(cfg, run, train_pairs=generate_dates(60), valid_pairs=generate_dates(5, 1))
    task.metrics, task.metric = metrics, metric
    return task


def test_a_lower_is_better_metric_ranks_the_lower_value_better(tmp_path):
    """A metric the task declares lower-is-better, by a name the trainer has never seen: each lower value is a new
    best (kept negated in progress.best_score, as a run keeps its loss), and a value no lower counts towards early
    stopping."""
    from attnkit.train.tasks import LOSS, Metric

    cfg = tiny_experiment(patience=2)
    t = Trainer(cfg, tmp_path, task=_dates_task(cfg, tmp_path, (Metric("ter", higher_is_better=False), LOSS), "ter"))
    seen = []
    for ter in (50.0, 40.0, 45.0, 40.0, 39.5):
        seen.append((t.is_better({"valid_ter": ter, "valid_loss": 1.0}), t.out_of_patience()))
    assert seen == [(True, False), (True, False), (False, False), (False, True), (True, False)]
    assert t.progress.best_score == -39.5


def test_a_metric_validation_did_not_report_ranks_by_its_declared_fallback(tmp_path):
    """``train.best_metric`` names a higher-is-better metric that falls back to a lower-is-better one: its own value
    where validation reported it, else the fallback's, oriented by the fallback's declaration; neither: no rank."""
    from attnkit.train.tasks import Metric

    cfg = tiny_experiment(best_metric="chrf")
    metrics = (Metric("ter", higher_is_better=False), Metric("chrf", higher_is_better=True, fallback="ter"))
    t = Trainer(cfg, tmp_path, task=_dates_task(cfg, tmp_path, metrics, "ter"))
    assert t.score_value({"valid_chrf": 61.5, "valid_ter": 30.0}) == 61.5
    assert t.score_value({"valid_ter": 30.0, "valid_loss": 2.0}) == -30.0
    assert t.score_value({"valid_loss": 2.0}) is None
    assert [t.is_better(s) for s in ({"valid_ter": 30.0}, {"valid_ter": 31.0}, {"valid_ter": 29.0})] == \
        [True, False, True]


def test_translation_ranks_by_bleu_else_by_the_lower_loss(tmp_path):
    """The translation task's own declarations: BLEU, higher better; where validation computed none
    (``train.eval_bleu = false``), the loss, lower better, negated; ``train.best_metric = "loss"`` the loss always."""
    t = Trainer(tiny_experiment(), tmp_path / "a", train_pairs=generate_dates(60), valid_pairs=generate_dates(5, 1))
    assert t.score_value({"valid_bleu": 12.5, "valid_loss": 2.5}) == 12.5
    assert t.score_value({"valid_loss": 2.5, "valid_ppl": math.exp(2.5)}) == -2.5
    t = Trainer(tiny_experiment(best_metric="loss"), tmp_path / "b", train_pairs=generate_dates(60),
                valid_pairs=generate_dates(5, 1))
    assert t.score_value({"valid_bleu": 12.5, "valid_loss": 2.5}) == -2.5


def test_a_runs_best_score_is_its_best_checkpoints_ranking_value(tmp_path, trained_checkpoint):
    """What a run keeps in progress.best_score (its validation loss negated, as runs have kept it) is what the
    trainer ranks the best checkpoint's recorded scores by: a resumed run compares against the same number."""
    best = json.loads((trained_checkpoint.parent / "best" / "meta.json").read_text(encoding="utf-8"))
    t = Trainer(tiny_experiment(), tmp_path, train_pairs=generate_dates(60), valid_pairs=generate_dates(5, 1))
    assert "valid_bleu" not in best["scores"]
    assert best["progress"]["best_score"] == -best["scores"]["valid_loss"] == t.score_value(best["scores"])


def test_a_best_metric_the_task_does_not_report_is_refused_by_the_trainer_in_one_line(tmp_path):
    """The config knows no metric names (the tasks declare them): it passes any; the trainer refuses one its task
    does not report, naming the ones it does."""
    for name in ("accuracy", "rouge"):
        cfg = tiny_experiment(best_metric=name)
        validate(cfg)
        with pytest.raises(AttnkitError) as e:
            Trainer(cfg, tmp_path, train_pairs=generate_dates(60), valid_pairs=generate_dates(5, 1))
        assert str(e.value) == f"train.best_metric = {name!r}: this task's validation reports bleu, loss"


def test_every_task_declares_the_metric_it_ranks_by_and_each_fallback():
    """Each task's default metric and each declared fallback are among its declared metrics (a data format's own,
    GLUE's F1 for MRPC, among its task's); a Metric is frozen, as a declaration."""
    from attnkit import registry
    from attnkit.train import tasks

    declared = [(tasks.CLASSIFICATION_METRICS, "accuracy"), (tasks.REGRESSION_METRICS, "spearman")]
    for task in registry.TASKS.values():
        cls = registry.resolve(task.trainer)
        if cls is not tasks.ClassificationTask:
            declared.append((cls.metrics, cls.metric))
    for form in registry.FORMATS.values():
        if form.metric:
            metrics = tasks.REGRESSION_METRICS if form.regression else tasks.CLASSIFICATION_METRICS
            declared.append((metrics, form.metric))
    assert len(declared) > 4
    for metrics, metric in declared:
        names = [m.name for m in metrics]
        assert all(isinstance(m, tasks.Metric) for m in metrics) and len(set(names)) == len(names), metrics
        assert metric in names and all(m.fallback in names for m in metrics if m.fallback), (metrics, metric)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tasks.LOSS.higher_is_better = True


def test_the_trainer_names_no_metric():
    """Which score ranks checkpoints and which way is better is the task's to declare; the trainer only reads the
    declarations, so no string in it names a metric, bare or as a validation score (``valid_<name>``)."""
    import ast

    from attnkit import registry
    from attnkit.train import tasks

    metrics = (*tasks.CLASSIFICATION_METRICS, *tasks.REGRESSION_METRICS)
    for task in registry.TASKS.values():
        metrics += tuple(getattr(registry.resolve(task.trainer), "metrics", ()))
    names = {m.name for m in metrics} | {f.metric for f in registry.FORMATS.values() if f.metric} | {"ppl", "bpc"}
    source = Path(tasks.__file__).with_name("trainer.py")
    found = [f"trainer.py:{node.lineno}: {node.value!r}" for node in ast.walk(ast.parse(source.read_text("utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.removeprefix("valid_") in names]
    assert {"bleu", "loss", "accuracy", "spearman"} <= names and not found, found


# --- checkpoints


def test_keep_last_and_no_leftovers(tmp_path):
    cfg = tiny_experiment(max_steps=5, save_every=1, keep_last=2)
    t = Trainer(cfg, tmp_path / "run", train_pairs=generate_dates(60), valid_pairs=generate_dates(5, 1))
    t.train()
    ckpts = tmp_path / "run" / "checkpoints"
    names = sorted(p.name for p in ckpts.iterdir())
    best = (ckpts / "best").resolve().name
    expected = {"last", "best", "step-4", "step-5", best}
    assert set(names) == expected, names
    assert not [n for n in names if n.startswith(".")]
    assert (ckpts / "last").resolve().name == "step-5"
    assert t.progress.history == ["step-4", "step-5"]


def test_write_checkpoint_leaves_no_temp_dirs(tmp_path, trained_checkpoint):
    model, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    out = tmp_path / "ckpts" / "step-7"
    write_checkpoint(out, model, cfg, [toks.src.path], {"n": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    write_checkpoint(out, model, cfg, [toks.src.path], {"n": 2}, {"x": torch.zeros(2)})  # overwrite in place
    assert [p.name for p in out.parent.iterdir()] == ["step-7"]
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "meta.json", "model.safetensors", "spm.model",
                                                     "trainer.safetensors"]
    again, _, _, _ = load_checkpoint(out)
    for (k, v), (_, w) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(v, w), k

    # a failure half way leaves the old checkpoint intact and no temporary directory
    with pytest.raises(FileNotFoundError):
        write_checkpoint(out, model, cfg, [tmp_path / "nowhere" / "spm.model"], {"n": 3})
    assert [p.name for p in out.parent.iterdir()] == ["step-7"]
    assert '"n": 2' in (out / "meta.json").read_text()


def test_average_of_two_checkpoints_is_the_mean(tmp_path, trained_checkpoint):
    model, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    other = tmp_path / "other"
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    write_checkpoint(other, model, cfg, [toks.src.path], {"progress": {"step": 99}})
    out = average_checkpoints([trained_checkpoint, other], tmp_path / "avg")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    a, _, _, _ = load_checkpoint(trained_checkpoint)
    b, _, _, _ = load_checkpoint(other)
    avg, avg_cfg, _, _ = load_checkpoint(out)
    assert avg_cfg == cfg
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    n = 0
    for k, v in avg.named_parameters():
        mean = ((pa[k].double() + pb[k].double()) / 2).float()
        assert torch.allclose(v, mean, atol=1e-7, rtol=0), k
        assert not torch.equal(v, pa[k])
        n += 1
    assert n == len(pa) > 10
    # tied embeddings stay tied
    assert avg.output.weight.data_ptr() == avg.src_embed.tokens.weight.data_ptr()
    assert load_tokenizers(out).src.vocab_size == toks.src.vocab_size
    with pytest.raises(AttnkitError):
        average_checkpoints([], tmp_path / "none")


def test_separate_vocabularies_train_save_and_translate(tmp_path):
    from attnkit.decode import translate
    from attnkit.train import Trainer, load_checkpoint

    cfg = tiny_experiment(max_steps=3, save_every=3)
    cfg.data = dataclasses.replace(cfg.data, joint_vocab=False, vocab_size=80)
    cfg.model = dataclasses.replace(cfg.model, share_embeddings=False)
    Trainer(cfg, tmp_path / "run", train_pairs=generate_dates(80), valid_pairs=generate_dates(5, 1)).train()
    ckpt = tmp_path / "run" / "checkpoints" / "last"
    assert {"spm.src.model", "spm.tgt.model"} <= {p.name for p in ckpt.iterdir()}
    model, _, toks, _ = load_checkpoint(ckpt)
    assert not toks.joint and toks.src.path != toks.tgt.path
    assert model.src_embed.tokens.weight is not model.tgt_embed.tokens.weight
    assert model.output.weight is model.tgt_embed.tokens.weight  # the decoder's own tie stays
    [t] = translate(model, toks, ["3 May 1999"], beam_size=2, max_len_b=12)
    assert isinstance(t.text[0], str)


def test_too_small_vocabulary_is_a_clear_error(tmp_path):
    from attnkit.data import train_tokenizer

    with pytest.raises(AttnkitError, match="vocab_size=8.*smaller than required_chars"):
        train_tokenizer(generate_dates(50).src, tmp_path / "spm.model", vocab_size=8)


def test_a_lowercasing_tokenizer_reads_and_writes_lowercased_text(tmp_path):
    """data.lowercase: the SentencePiece model folds case itself, so any casing of a text encodes to the same
    pieces, and what decodes from them is lowercased; without it case is kept."""
    from attnkit.data import train_tokenizer

    texts = [f"The Dog number {i} runs to A Park in March" for i in range(300)]
    folding = train_tokenizer(texts, tmp_path / "lc" / "spm.model", vocab_size=60, lowercase=True)
    keeping = train_tokenizer(texts, tmp_path / "cased" / "spm.model", vocab_size=60)
    [upper, lower] = folding.encode(["THE DOG runs to a park", "the dog runs to a park"])
    assert upper == lower
    assert folding.decode(upper) == "the dog runs to a park"
    assert keeping.decode(keeping.encode(["The Dog runs"])[0]) == "The Dog runs"


def test_the_lowercased_recipe_is_the_headline_one_on_lowercased_text():
    """configs/multi30k_en_de_lc.toml says it differs from the headline recipe in data.lowercase and its
    vocabulary only: the model, training and decoding stay the same, so its row compares the two."""
    configs = Path(__file__).parents[1] / "configs"
    headline, lc = load_config(configs / "multi30k_en_de.toml"), load_config(configs / "multi30k_en_de_lc.toml")
    assert lc.data.lowercase and not headline.data.lowercase
    assert (lc.model, lc.train, lc.decode) == (headline.model, headline.train, headline.decode)
    assert dataclasses.replace(lc.data, lowercase=False, vocab_size=headline.data.vocab_size) == headline.data


def test_shared_embeddings_need_a_joint_vocabulary():
    from attnkit.config import config_from_dict

    with pytest.raises(AttnkitError, match="joint_vocab"):
        config_from_dict({"model": {"share_embeddings": True}, "data": {"joint_vocab": False}})


def test_gradient_accumulation_equals_one_update_on_the_union(tmp_path):
    """update_freq=2 over two batches gives the gradient of one batch holding both (a per-token mean)."""
    pairs, valid = generate_dates(200, seed=0), generate_dates(5, seed=1)
    cfg = tiny_experiment(max_steps=1, max_tokens=200, update_freq=2, clip_norm=0.0)
    cfg.model = dataclasses.replace(cfg.model, dropout=0.0)
    t = Trainer(cfg, tmp_path / "run", train_pairs=pairs, valid_pairs=valid)
    before = _weights(t.model)
    seen = {}
    step = t.optimizer.step

    def record_then_step(*args, **kwargs):
        seen.update({n: p.grad.clone() for n, p in t.model.named_parameters()})
        return step(*args, **kwargs)

    t.optimizer.step = record_then_step
    t.train()
    assert t.progress.step == 1 and t.progress.batch_in_epoch == 2

    # by hand: the same initial weights, one batch made of both micro-batches' examples
    ref = t.build_model()  # the task's model with the same fast-runtime tricks as the trainer's
    ref.load_state_dict(before)
    first_two = token_batches(*t.task.lengths("train"), 200, seed=cfg.train.seed, epoch=0)[:2]
    b = t.task.batch("train", first_two[0] + first_two[1])
    loss = ref(b.src, b.tgt_in, targets=b.tgt_out, label_smoothing=cfg.train.label_smoothing).loss
    (loss / b.n_tokens).backward()
    for n, p in ref.named_parameters():
        assert torch.allclose(p.grad, seen[n], atol=1e-6, rtol=1e-4), n
    one_batch = t.task.batch("train", first_two[0])  # and it is not just the first micro-batch's gradient
    ref.zero_grad()
    loss = ref(one_batch.src, one_batch.tgt_in, targets=one_batch.tgt_out,
               label_smoothing=cfg.train.label_smoothing).loss
    (loss / one_batch.n_tokens).backward()
    assert not torch.allclose(ref.src_embed.tokens.weight.grad, seen["src_embed.tokens.weight"], atol=1e-6, rtol=1e-4)


# --- configs: one dataclass per model family

CONFIGS = Path(__file__).parent.parent / "configs"
from attnkit.models.las import LASConfig  # noqa: E402
from attnkit.models.speech_transformer import SpeechTransformerConfig  # noqa: E402
from attnkit.models.vqa import ShowAskAttendAnswerConfig  # noqa: E402

SHIPPED = {  # each shipped config and the dataclass its [model] table must become
    "flickr8k_sat": ShowAttendTellConfig,
    "flickr8k_transformer": TransformerCaptionerConfig,
    "multi30k_en_de": TransformerConfig,
    "multi30k_en_de_lc": TransformerConfig,
    "multi30k_en_de_rnnencdec": RNNEncDecConfig,
    "multi30k_en_de_rnnsearch": RNNSearchConfig,
    "tatoeba_en_de_rnnencdec": RNNEncDecConfig,
    "tatoeba_en_de_rnnsearch": RNNSearchConfig,
    "tatoeba_en_de_transformer": TransformerConfig,
    "tinyshakespeare_char": LMConfig,
    "transfer_finetune_tinyshakespeare": LMConfig,
    "transfer_pretrain_wikitext2": LMConfig,
    "wikitext2_word": LMConfig,
    "glue_sst2": BertClassifierConfig,
    "glue_mrpc": BertClassifierConfig,
    "glue_stsb": BertClassifierConfig,
    "glue_sst2_gpt": GPTClassifierConfig,
    "easy_vqa": ShowAskAttendAnswerConfig,
    "fsdd_digits_las": LASConfig,
    "fsdd_digits_speech_transformer": SpeechTransformerConfig,
    "multi30k_speech_las": LASConfig,
    "multi30k_speech_speech_transformer": SpeechTransformerConfig,
}


def test_every_shipped_config_is_listed():
    assert {p.stem for p in CONFIGS.glob("*.toml")} == set(SHIPPED)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_config_loads(path):
    """Each shipped config loads (types, choices and cross-field checks) into its family's dataclass, with every
    key of its [model] table read as written."""
    import tomllib

    cfg = load_config(path)
    assert cfg.name == path.stem
    assert type(cfg.model) is SHIPPED[path.stem]
    assert cfg.model.family == SHIPPED[path.stem].family
    table = tomllib.loads(path.read_text(encoding="utf-8"))["model"]
    for key, value in table.items():
        got = getattr(cfg.model, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key


@pytest.mark.parametrize("family,key,new", [
    ("rnnsearch", "d_ff", "hidden_size"),
    ("rnnsearch", "d_model", "embedding_size"),
    ("rnn_encdec", "d_ff", "hidden_size"),
    ("show_attend_tell", "d_model", "hidden_size"),
    ("show_attend_tell", "d_ff", "attention_size"),
    ("transformer_lm", "n_decoder_layers", "n_layers"),
])
def test_a_0_1_model_table_in_a_user_config_names_the_new_key(tmp_path, capsys, family, key, new):
    """A user config written for attnkit 0.1 (one [model] table for every family) is a one-line error naming the
    file and the stale key, and saying what the family calls it now; ``attnkit train`` prints that line."""
    from attnkit.cli import main

    data = {"rnnsearch": "multi30k", "rnn_encdec": "multi30k", "show_attend_tell": "flickr8k",
            "transformer_lm": "tinyshakespeare"}[family]
    path = tmp_path / "old.toml"
    path.write_text(f'name = "old"\n\n[model]\nfamily = "{family}"\n{key} = 512\ndropout = 0.3\n\n'
                    f'[data]\nformat = "{data}"\n', encoding="utf-8")
    with pytest.raises(AttnkitError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and f"'{key}'" in message and f"'{new}'" in message
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    printed = capsys.readouterr().err
    assert printed == f"attnkit: error: {message}\n"
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_0_1_model_table_for_an_rnnsearch_is_refused_at_its_d_ff(tmp_path):
    """The 0.1 [model] table of an rnnsearch as it was written (d_model, d_ff beside the RNN's keys): the error
    names the file and d_ff, and says hidden_size."""
    path = tmp_path / "rnnsearch_0_1.toml"
    path.write_text('name = "rnnsearch_0_1"\n\n[model]\nfamily = "rnnsearch"\nattention_score = "additive"\n'
                    'd_ff = 256\nd_model = 256\nn_encoder_layers = 1\nn_decoder_layers = 1\n\n'
                    '[data]\nformat = "multi30k"\n', encoding="utf-8")
    with pytest.raises(AttnkitError) as err:
        load_config(path)
    assert re.fullmatch(r"\S*rnnsearch_0_1\.toml\.model: unknown key 'd_ff': a rnnsearch model calls it 'hidden_size'",
                        str(err.value)), str(err.value)  # one line: the file, the stale key, its new name
    with pytest.raises(AttnkitError, match=r"'d_ff'.*'hidden_size'"):  # --set with the old name: the same hint
        load_config(CONFIGS / "multi30k_en_de_rnnsearch.toml", ["model.d_ff=128"])


@pytest.mark.parametrize("name,cls", [("multi30k_en_de_rnnsearch", RNNSearchConfig),
                                      ("tatoeba_en_de_rnnencdec", RNNEncDecConfig)])
def test_set_overrides_the_sizes_of_an_rnn_config(name, cls):
    """``--set model.hidden_size=...`` (and embedding_size, layers) on an RNN config: the model built from it has
    those sizes; the file's other keys stay."""
    from attnkit.models import build_model

    base = load_config(CONFIGS / f"{name}.toml")
    cfg = load_config(CONFIGS / f"{name}.toml", ["model.hidden_size=48", "model.embedding_size=20",
                                                  "model.n_decoder_layers=2", "model.dropout=0.0"])
    assert type(cfg.model) is cls
    assert (cfg.model.hidden_size, cfg.model.embedding_size, cfg.model.n_decoder_layers) == (48, 20, 2)
    assert cfg.model.dropout == 0.0 and base.model.hidden_size != 48
    assert dataclasses.replace(cfg.model, hidden_size=base.model.hidden_size, embedding_size=base.model.embedding_size,
                               n_decoder_layers=base.model.n_decoder_layers, dropout=base.model.dropout) == base.model
    assert cfg.model.width == 48  # the noam schedule scales by the GRU's width
    model = build_model(cfg.model, 30, 30)
    assert model.encoder.hidden_size == 48 and model.src_embed.embedding_dim == 20
    assert model.init_h[0].out_features == 48 * 2  # one initial state per decoder layer
    with pytest.raises(AttnkitError, match="model.hidden_size = 0 must be at least 1"):
        load_config(CONFIGS / f"{name}.toml", ["model.hidden_size=0"])
    with pytest.raises(AttnkitError, match="model.hidden_size: expected an integer"):
        load_config(CONFIGS / f"{name}.toml", ["model.hidden_size=4.5"])


def test_the_fast_runtime_trains_as_the_core_does(tmp_path, dates_pairs):
    """Without dropout, training with ``train.fast = []`` (the core as the lectures read) and with the default
    tricks (16-bit dropout, fused loss, fused and decoding attention) gives the same losses step by step and the same
    validation loss. (Not bit-equal weights: Adam turns the rounding noise of a zero gradient, such as the key
    projection's bias gets, into a full-size step of either sign.)"""
    from attnkit.fast.dropout import Dropout16
    from attnkit.nn.attention import MultiHeadAttention, reference_attention

    core_tricks = load_config(None, ["train.fast=[]"]).train.fast  # as a config or --set writes it
    assert core_tricks == () and TrainConfig().fast == fast.TRAINING
    valid = generate_dates(20, seed=1)
    runs = {}
    for name, tricks in (("core", core_tricks), ("fast", TrainConfig().fast)):
        cfg = tiny_experiment(max_steps=5, log_every=1, fast=tricks, save_every=0)
        cfg.model = dataclasses.replace(cfg.model, dropout=0.0)
        run = tmp_path / name
        if runs:  # the same tokenizer, not a retrained one
            run.mkdir()
            shutil.copy(tmp_path / "core" / "spm.model", run / "spm.model")
        trainer = Trainer(cfg, run, train_pairs=dates_pairs, valid_pairs=valid)
        kernels = {m.kernel is reference_attention for m in trainer.model.modules()
                   if isinstance(m, MultiHeadAttention)}
        assert kernels == {name == "core"}  # the fast run really runs the fast attention, the core run the core's
        assert (trainer.model.projected_loss is projected_smoothed_cross_entropy) == (name == "fast")
        assert any(isinstance(m, Dropout16) for m in trainer.model.modules()) == (name == "fast")
        result = trainer.train()
        losses = [r["train_nll"] for r in read_metrics(run) if "train_nll" in r]
        runs[name] = losses, result["valid_loss"]
    (core, core_valid), (quick, quick_valid) = runs["core"], runs["fast"]
    assert len(core) == len(quick) == 5
    assert len(set(core)) == 5  # the loss moves: the steps did train
    for step, (a, b) in enumerate(zip(core, quick), 1):
        assert math.isclose(a, b, rel_tol=1e-5), (step, a, b)
    assert math.isclose(core_valid, quick_valid, rel_tol=1e-5)
