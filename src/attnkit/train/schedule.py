"""Learning-rate schedules, as functions of the update number (1-based)."""

from __future__ import annotations

import math

from attnkit.config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig, d_model: int, total_steps: int | None = None) -> float:
    """``noam`` is the paper's ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` times ``cfg.lr`` (1.0 = the paper);
    ``inverse_sqrt`` warms up linearly to ``cfg.lr`` then decays as ``1/sqrt(step)`` (fairseq);
    ``cosine`` warms up then follows a half cosine to ``min_lr`` at the last step; ``linear`` warms up then falls
    in a straight line to ``min_lr`` at the last step (BERT's fine-tuning schedule); ``constant`` only warms up.
    The last step is ``total_steps`` (the trainer's: fewer than ``max_steps`` where ``max_epochs`` ends first)."""
    total = total_steps or cfg.max_steps
    step = max(step, 1)
    warmup = max(cfg.warmup_steps, 1)
    if cfg.schedule == "noam":
        return cfg.lr * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if step < warmup:
        return cfg.lr * step / warmup
    if cfg.schedule == "inverse_sqrt":
        return cfg.lr * math.sqrt(warmup / step)
    if cfg.schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))
    if cfg.schedule == "linear":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return cfg.lr - (cfg.lr - cfg.min_lr) * progress
    return cfg.lr
