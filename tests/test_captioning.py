"""Captioners: the decoding interface on image grids, the caption task end to end, caption BLEU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attnkit.config import ExperimentConfig
from attnkit.decode import beam_search, greedy, max_lengths
from attnkit.evaluate import caption_bleu
from attnkit.models import BOS, PAD, build_model
from attnkit.models.captioner import ShowAttendTellConfig, TransformerCaptionerConfig
from attnkit.nn.loss import label_smoothed_nll

VOCAB, CELLS, FEAT = 30, 49, 16


def _config(family: str, **overrides):
    if family == "show_attend_tell":
        return ShowAttendTellConfig(**({"hidden_size": 32, "attention_size": 32, "d_feature": FEAT, "dropout": 0.0}
                                       | overrides))
    assert family == "transformer_captioner", family
    return TransformerCaptionerConfig(**({"d_model": 32, "d_ff": 32, "d_feature": FEAT, "n_heads": 4,
                                          "n_encoder_layers": 1, "n_decoder_layers": 2, "dropout": 0.0} | overrides))


def _model(family: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(_config(family, **overrides), CELLS, VOCAB).eval()


@pytest.fixture
def grids():
    return torch.randn(3, CELLS, FEAT, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", ["show_attend_tell", "transformer_captioner"])
@torch.no_grad()
def test_cached_steps_equal_teacher_forcing_and_attention_sums_to_one(family, grids):
    model = _model(family)
    tgt_in = torch.cat([torch.full((3, 1), BOS), torch.randint(4, VOCAB, (3, 6))], 1)
    out = model(grids, tgt_in, need_weights=True)
    logits, cross = out.logits, out.attention.cross
    assert torch.equal(model(grids, tgt_in).logits, logits)  # asking for the weights changes nothing
    if family == "show_attend_tell":  # one layer of one head: the alphas [B, T, L]
        assert len(cross) == 1 and cross[0].shape == (3, 1, tgt_in.size(1), CELLS)
        alphas = cross[0][:, 0]
        assert torch.equal(model.teacher_forced(grids, tgt_in)[1], alphas)
    else:  # per decoder layer [B, H, T, L]; the step shows their mean over layers and heads
        assert len(cross) == 2 and all(w.shape == (3, 4, tgt_in.size(1), CELLS) for w in cross)
        alphas = torch.stack(cross).mean((0, 2))
    state = model.init_state(model.encode(grids))
    for t in range(tgt_in.size(1)):
        log_probs, state, attn = model.step(tgt_in[:, t], state, need_weights=True)
        assert (log_probs - F.log_softmax(logits[:, t], -1)).abs().max() <= 1e-5
        assert attn.shape == (3, CELLS)
        assert torch.allclose(attn.sum(-1), torch.ones(3), atol=1e-5)
        # the teacher-forced attention is the same distributions
        assert torch.allclose(alphas[:, t], attn, atol=1e-6 if family == "show_attend_tell" else 1e-5)


@pytest.mark.parametrize("penalty", [0.0, 1.0, 2.5])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_show_attend_tell_loss_adds_the_doubly_stochastic_penalty_exactly(grids, penalty, eps):
    """``model(..., targets=...).loss`` is the label-smoothed NLL of its logits plus
    ``lambda * sum_i (1 - sum_t alpha_ti)^2`` over the real words only (Xu et al. eq. 14), with the gradient of
    that sum; ``.nll`` is the NLL alone."""
    model = _model("show_attend_tell", attention_penalty=penalty)
    g = torch.Generator().manual_seed(2)
    tgt_in = torch.cat([torch.full((3, 1), BOS), torch.randint(4, VOCAB, (3, 6), generator=g)], 1)
    targets = torch.cat([tgt_in[:, 1:], torch.full((3, 1), 3)], 1)
    targets[1, 4:] = PAD  # shorter captions: their padded steps count neither in the loss nor in the coverage
    targets[2, 2:] = PAD
    out = model(grids, tgt_in, targets=targets, label_smoothing=eps, need_weights=True)
    logits, alphas = model.teacher_forced(grids, tgt_in)
    smoothed, nll = label_smoothed_nll(logits, targets, eps)
    coverage = torch.zeros(3, CELLS, dtype=torch.float64)  # by hand: sum over the real words t of alpha_ti
    for b in range(3):
        for t in range(targets.size(1)):
            if targets[b, t] != PAD:
                coverage[b] += alphas[b, t].double()
    expected_penalty = penalty * ((1 - coverage) ** 2).sum()
    assert (expected_penalty > 1.0) == (penalty > 0)  # a real penalty: the random alphas are far from covering
    torch.testing.assert_close(out.loss.double(), smoothed.double() + expected_penalty, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(out.nll, nll)
    torch.testing.assert_close(out.attention.cross[0][:, 0], alphas)
    if penalty:
        torch.testing.assert_close(model.attention_penalty(alphas, targets).double(), expected_penalty,
                                   rtol=1e-6, atol=1e-6)
    # the gradient is that of the NLL plus the penalty
    model.zero_grad()
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    logits, alphas = model.teacher_forced(grids, tgt_in)
    real = targets.ne(PAD)[..., None].float()
    (label_smoothed_nll(logits, targets, eps)[0] + penalty * ((1 - (alphas * real).sum(1)) ** 2).sum()).backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["show_attend_tell", "transformer_captioner"])
@torch.no_grad()
def test_beam_one_equals_greedy_on_grids(family, grids):
    model = _model(family, seed=3)
    lens = max_lengths(torch.full((3,), 8), 1.0, 0)
    g = greedy(model, model.init_state(model.encode(grids)), lens)
    b = beam_search(model, model.init_state(model.encode(grids)), lens, beam_size=1)
    assert [h.tokens for h in g] == [hyps[0].tokens for hyps in b]


def test_caption_bleu_matches_nltk():
    nltk_bleu = pytest.importorskip("nltk.translate.bleu_score")
    hyps = ["a dog runs on the grass", "two men play soccer in a field", "a girl in a red dress"]
    refs = [["a dog is running on the grass", "a brown dog runs across a lawn", "the dog runs on grass"],
            ["two men are playing soccer", "men play football on a field", "two people kick a ball in a field"],
            ["a little girl wearing a red dress", "a girl in red", "a child in a red dress smiles"]]
    ours = caption_bleu(hyps, refs)
    for n in range(1, 5):
        weights = tuple([1.0 / n] * n)
        theirs = nltk_bleu.corpus_bleu([[r.split() for r in rs] for rs in refs], [h.split() for h in hyps],
                                       weights=weights)
        assert ours[f"bleu{n}"] == pytest.approx(100 * theirs, abs=1e-6), n


def test_caption_task_trains_on_a_few_real_images(tmp_path, data_dir):
    """A short Show-Attend-Tell run on 60 Flickr8k images: validation loss drops and captions are real words."""
    if not (data_dir / "flickr8k").is_dir():
        pytest.skip("Flickr8k not available")
    from attnkit.decode import caption
    from attnkit.train import Trainer, load_checkpoint

    cfg = ExperimentConfig(name="sat_tiny")
    cfg.model = ShowAttendTellConfig(hidden_size=64, attention_size=64, d_feature=1280, dropout=0.0)
    cfg.data = dataclasses.replace(cfg.data, format="flickr8k", data_dir=str(data_dir), max_train_pairs=60,
                                   max_valid_pairs=12, min_word_count=3, feature_cache=str(tmp_path / "features"))
    cfg.train = dataclasses.replace(cfg.train, max_tokens=400, lr=3e-3, schedule="constant", warmup_steps=1,
                                    max_steps=60, eval_every=30, save_every=0, eval_bleu=True, eval_beam=2,
                                    label_smoothing=0.0, progress=False, threads=1, clip_norm=5.0)
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.train()
    log = [line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if "valid_loss" in line]
    import json

    losses = [json.loads(line)["valid_loss"] for line in log]
    assert len(losses) == 2 and losses[-1] < losses[0]
    model, cfg2, vocab, _ = load_checkpoint(tmp_path / "run")
    out = caption(model, vocab, trainer.task.grids["valid"][:4], beam_size=2, need_weights=True)
    for c in out:
        assert c.text[0].split() and all(w in vocab.stoi for w in c.text[0].split())
        assert c.hypotheses[0].attention.shape[1] == 49
    # attnkit caption captions a list of Flickr8k dev images (its file names, as Flickr_8k.devImages.txt holds them)
    # into JSON lines, each the caption attnkit.load gives that file, in the list's order
    import attnkit
    from attnkit.cli import main

    names = (data_dir / "flickr8k" / "Flickr_8k.devImages.txt").read_text().split()[:3]
    listing = tmp_path / "dev3.txt"
    listing.write_text("\n".join(names) + "\n\n")
    out = tmp_path / "captions.jsonl"
    images = data_dir / "flickr8k" / "images_224"
    assert main(["caption", "--checkpoint", str(tmp_path / "run"), "--list", str(listing), "--image-dir", str(images),
                 "--beam", "2", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["file"] for r in rows] == [str(images / n) for n in names]
    assert [r["caption"] for r in rows] == attnkit.load(tmp_path / "run").caption([r["file"] for r in rows], beam=2)
