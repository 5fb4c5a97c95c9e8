"""Training: the loop, tasks, schedules, distributed training, the trainer's checkpoint state."""

from attnkit.checkpoint import load_checkpoint, resolve_checkpoint, write_checkpoint
from attnkit.train.checkpoint import average_checkpoints
from attnkit.train.schedule import learning_rate
from attnkit.train.trainer import Progress, Trainer, read_metrics

__all__ = [
           "Progress",
           "Trainer",
           "average_checkpoints",
           "learning_rate",
           "load_checkpoint",
           "read_metrics",
           "resolve_checkpoint",
           "write_checkpoint",
]
