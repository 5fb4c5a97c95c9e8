"""Captioners: the decoding interface on image grids, the caption task end to end, caption BLEU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from attnkit.config import ExperimentConfig, ModelConfig
from attnkit.decode import beam_search, greedy, max_lengths
from attnkit.evaluate import caption_bleu
from attnkit.models import BOS, build_model

VOCAB, CELLS, FEAT = 30, 49, 16


def _model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(family=family, d_model=32, d_ff=32, d_feature=FEAT, n_heads=4, n_encoder_layers=1,
                      n_decoder_layers=2, dropout=0.0, share_embeddings=False)
    return build_model(cfg, CELLS, VOCAB).eval()


@pytest.fixture
def grids():
    return torch.randn(3, CELLS, FEAT, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", ["show_attend_tell", "transformer_captioner"])
@torch.no_grad()
def test_cached_steps_equal_teacher_forcing_and_attention_sums_to_one(family, grids):
    model = _model(family)
    tgt_in = torch.cat([torch.full((3, 1), BOS), torch.randint(4, VOCAB, (3, 6))], 1)
    logits, alphas = model(grids, tgt_in)
    state = model.init_state(model.encode(grids))
    for t in range(tgt_in.size(1)):
        log_probs, state, attn = model.step(tgt_in[:, t], state, need_weights=True)
        assert (log_probs - F.log_softmax(logits[:, t], -1)).abs().max() <= 1e-5
        assert attn.shape == (3, CELLS)
        assert torch.allclose(attn.sum(-1), torch.ones(3), atol=1e-5)
        if alphas is not None:  # Show-Attend-Tell's teacher-forced alphas are the same distributions
            assert torch.allclose(alphas[:, t], attn, atol=1e-6)


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
    cfg.model = ModelConfig(family="show_attend_tell", d_model=64, d_ff=64, d_feature=1280, dropout=0.0,
                            share_embeddings=False)
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
