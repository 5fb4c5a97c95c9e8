"""Training: losses, schedules, checkpoints, the loop."""

from attnkit.train.checkpoint import average_checkpoints, load_checkpoint, resolve_checkpoint, write_checkpoint
from attnkit.train.loss import label_smoothed_nll
from attnkit.train.schedule import learning_rate
from attnkit.train.trainer import Progress, Trainer, read_metrics

__all__ = [
           "Progress",
           "Trainer",
           "average_checkpoints",
           "label_smoothed_nll",
           "learning_rate",
           "load_checkpoint",
           "read_metrics",
           "resolve_checkpoint",
           "write_checkpoint",
]
