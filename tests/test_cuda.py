"""The CUDA paths, where there is a GPU (skipped elsewhere): training at each precision with the fast runtime's
default tricks, checkpoints that load on the CPU and compute what the GPU computed, exact resume, and decoding on
the GPU equal to decoding on the CPU (greedy and beam, cached steps equal to the whole teacher-forced pass)."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.data import generate_dates
from attnkit.decode.search import generate
from attnkit.fast.compile import compile_step
from attnkit.models import GPTClassifier, TransformerLM
from attnkit.models.gpt_classifier import collate_framed, frame
from attnkit.models.lm import LMConfig
from attnkit.tokens import BOS, EOS
from attnkit.train import Trainer, distributed, load_checkpoint
from conftest import make_model, random_src, tiny_experiment
from test_contract import CONFIGS, build, example, make_tokenizers, vocab_size

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def train(run, dates_pairs, **overrides) -> Trainer:
    trainer = Trainer(tiny_experiment(device="cuda", **overrides), run, train_pairs=dates_pairs,
                      valid_pairs=generate_dates(20, seed=1))
    trainer.result = trainer.train()
    return trainer


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_on_the_gpu_at_each_precision_gives_a_checkpoint_the_cpu_reads(tmp_path, dates_pairs, precision):
    trainer = train(tmp_path, dates_pairs, precision=precision, max_steps=8)
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in trainer.model.parameters())
    assert math.isfinite(trainer.result["valid_loss"])
    model, _, _, _ = load_checkpoint(tmp_path / "checkpoints" / "last")
    src = random_src([7, 5, 3], vocab=model.src_embed.tokens.num_embeddings)
    tgt_in = torch.tensor([[BOS, 5, 6, 7]] * 3)
    gpu = trainer.model.eval()
    with torch.no_grad():
        expected = gpu(src.cuda(), tgt_in.cuda()).logits.cpu()
        torch.testing.assert_close(model(src, tgt_in).logits, expected, atol=1e-4, rtol=1e-4)


def test_a_resumed_run_on_the_gpu_is_bit_identical_to_an_uninterrupted_one(tmp_path, dates_pairs):
    whole = train(tmp_path / "whole", dates_pairs, max_steps=6)
    train(tmp_path / "halves", dates_pairs, max_steps=3, save_every=3)
    halves = Trainer(tiny_experiment(device="cuda", max_steps=6), tmp_path / "halves", train_pairs=dates_pairs,
                     valid_pairs=generate_dates(20, seed=1))
    halves.resume(tmp_path / "halves")
    halves.train()
    for (name, a), b in zip(whole.model.state_dict().items(), halves.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("beam_size", [1, 4])
def test_decoding_on_the_gpu_equals_decoding_on_the_cpu(beam_size):
    model = make_model(vocab=23, seed=3)
    src = random_src([9, 6, 4, 2], vocab=23, seed=5)
    max_lens = torch.full((4,), 12)
    cpu = generate(model, src, max_lens, beam_size=beam_size)
    gpu = generate(model.cuda(), src, max_lens.cuda(), beam_size=beam_size)
    assert [[h.tokens for h in hyps] for hyps in gpu] == [[h.tokens for h in hyps] for hyps in cpu]
    for hyps_gpu, hyps_cpu in zip(gpu, cpu):
        assert hyps_gpu[0].score == pytest.approx(hyps_cpu[0].score, abs=1e-4)


def test_compiling_ahead_of_time_is_the_cpus_and_refuses_a_model_on_the_gpu_in_one_line():
    """The packages are the CPU's (AOTInductor's C++ kernels, loaded by its CPU loader): a model on the GPU decodes
    eagerly there, and asking to compile it says why."""
    from attnkit.errors import AttnkitError

    model = make_model(vocab=23, seed=3).cuda()
    with pytest.raises(AttnkitError, match="CPU"):
        compile_step(model)


def test_cached_steps_on_the_gpu_equal_the_teacher_forced_pass():
    model = make_model(vocab=23, seed=4).cuda()
    src = random_src([8, 5], vocab=23, seed=6).cuda()
    tokens = torch.tensor([[BOS, 5, 9, 11, 4], [BOS, 7, 7, 3, 12]], device="cuda")
    with torch.no_grad():
        whole = torch.log_softmax(model(src, tokens).logits.float(), -1)
        state = model.init_state(model.encode(src))
        for t in range(tokens.size(1)):
            log_probs, state, _ = model.step(tokens[:, t], state)
            torch.testing.assert_close(log_probs, whole[:, t], atol=1e-4, rtol=1e-4)


def test_a_gpt_classifier_trains_on_the_gpu_as_on_the_cpu():
    """GPT-1's objective (task loss + lambda LM loss) and its gradients on each device, from the same weights."""
    rows = [frame(40, [5, 6, 9]), frame(40, [11, 12], [13]), frame(40, [4, 8, 8, 8, 20])]
    tokens, padding_mask, extract = collate_framed(rows)
    targets = torch.tensor([0, 1, 1])
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        lm = TransformerLM(LMConfig(d_model=32, n_heads=2, d_ff=64, n_layers=2, dropout=0.0, max_positions=32), 40)
        model = GPTClassifier(lm, 2, dropout=0.0, seed=0).to(device)
        out = model(tokens.to(device), padding_mask.to(device), targets=targets.to(device), extract=extract)
        out.loss.backward()
        results.append((float(out.loss.detach()), {k: p.grad.cpu() for k, p in model.named_parameters()}))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_every_family_takes_a_deterministic_training_step_on_the_gpu_as_on_the_cpu(family, tmp_path, dates_pairs,
                                                                                   monkeypatch):
    """Under the determinism training on CUDA demands (every kernel deterministic, else an error), each family's
    loss and gradients on the GPU equal the CPU's, from the same weights. TF32, which cuDNN's convolutions and
    GRUs use by default (to about 1e-3), is off here: the comparison is of the code, at fp32."""
    distributed.deterministic_cuda()
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    tokenizers = make_tokenizers(tmp_path, dates_pairs)
    model, _ = build(family, tokenizers)
    src, tgt_in = example(model, vocab_size(model))
    targets = torch.cat([tgt_in[:, 1:], torch.full((2, 1), EOS)], 1)
    results = []
    for device in ("cpu", "cuda"):
        model, _ = build(family, tokenizers)
        model.train().to(device)
        out = model(None if src is None else src.to(device), tgt_in.to(device), targets=targets.to(device))
        out.loss.backward()
        results.append((float(out.loss.detach()), {k: p.grad.cpu() for k, p in model.named_parameters()
                                                   if p.grad is not None}))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    assert results[1][1].keys() == results[0][1].keys()
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
