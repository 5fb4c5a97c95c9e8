"""``attnkit demo``: a small Transformer learns to read dates written many ways and write ISO dates.

Needs no data and no network. Trains for a few minutes on generated pairs, prints sample
translations and the exact-match accuracy on held-out dates, and draws the cross-attention
of one example: each output digit should look at the word it comes from.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from attnkit.config import ExperimentConfig, config_from_dict
from attnkit.data import generate_dates, load_split
from attnkit.decode import translate
from attnkit.train import Trainer
from attnkit.viz import plot_attention

DEMO = {
    "name": "demo_dates",
    "model": {"d_model": 128, "d_ff": 256, "n_heads": 4, "dropout": 0.0, "n_encoder_layers": 2,
              "n_decoder_layers": 2, "norm_first": True},  # pre-LN: stable at this high learning rate
    "data": {"format": "dates", "n_synthetic": 30000, "spm_model_type": "char", "vocab_size": 80},
    "train": {"max_tokens": 1024, "lr": 3e-3, "warmup_steps": 100, "schedule": "inverse_sqrt", "max_steps": 3000,
              "eval_every": 0, "save_every": 0, "eval_bleu": False, "label_smoothing": 0.0, "log_every": 50,
              "max_epochs": 0, "keep_last": 1},
}


def demo_config(minutes: float, max_steps: int | None = None) -> ExperimentConfig:
    table = {k: dict(v) if isinstance(v, dict) else v for k, v in DEMO.items()}
    table["train"]["max_minutes"] = minutes
    if max_steps:  # a shorter run (a smoke test: attnkit demo --steps)
        table["train"]["max_steps"] = max_steps
    return config_from_dict(table, "demo")


def exact_match(model, toks, pairs, **options) -> tuple[float, list]:
    out = translate(model, toks, pairs.src, beam_size=1, **options)
    correct = sum(t.text[0] == ref for t, ref in zip(out, pairs.tgt))
    return correct / len(pairs.tgt), out


def run_demo(run_dir: Path, minutes: float = 2.5, max_steps: int | None = None) -> int:
    cfg = demo_config(minutes, max_steps)
    started = time.monotonic()
    print(f"Training a {cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers}-layer Transformer "
          f"(d_model={cfg.model.d_model}) on {cfg.data.n_synthetic} generated dates, for at most {minutes} minutes...")
    trainer = Trainer(cfg, run_dir)
    result = trainer.train()
    model, toks = trainer.model.eval(), trainer.task.toks
    test = load_split(cfg.data, "test")
    accuracy, out = exact_match(model, toks, test)
    print(f"trained {result['step']} steps in {result['train_minutes']:.1f} min")
    for t in random.Random(0).sample(out, 8):
        print(f"  {t.source:<40} -> {t.text[0]}")
    print(f"exact-match accuracy on {len(test.tgt)} held-out dates: {accuracy:.1%}")

    example = generate_dates(1, seed=7)
    [t] = translate(model, toks, example.src, beam_size=1, need_weights=True)
    source = toks.src.pieces(t.source) + ["</s>"]
    target = toks.tgt.id_to_piece(t.hypotheses[0].tokens) + ["</s>"]
    png = Path(run_dir) / "attention.png"
    plot_attention(t.hypotheses[0].attention, source, target, png, title=f"{t.source} -> {t.text[0]}")
    print(f"cross-attention of one example: {png}")
    print(f"demo finished in {(time.monotonic() - started) / 60:.1f} min")
    return 0 if accuracy >= 0.95 else 1


__all__ = ["demo_config", "exact_match", "run_demo"]
