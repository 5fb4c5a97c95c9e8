"""Visual question answering as a training task: each example is (image, question) -> one of the answers.

The images are held in memory as uint8 pixels at ``data.image_size`` (each read once, however many questions ask
about it); batches are bucketed by question length (``lengths``: the question's words) under ``train.max_tokens``,
at most ``train.batch_size`` questions each. The loss sums the cross-entropy over the batch's questions; validation
reports accuracy overall and per question type (``valid_accuracy_<type>``), scored with scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit import registry
from attnkit.config import ExperimentConfig
from attnkit.data import pad, token_batches
from attnkit.data.vqa import QuestionVocab, VQAExamples, load_pixels
from attnkit.errors import AttnkitError
from attnkit.evaluate.metrics import answer_scores
from attnkit.train import distributed
from attnkit.train.tasks import LOSS, Metric


@dataclass
class VQABatch:
    """Images [B, 3, S, S] uint8, questions [B, T] (PAD-padded), answers [B] (class ids) and their positions in
    the dataset."""

    images: Tensor
    questions: Tensor
    targets: Tensor
    indices: list[int]

    def to(self, device: torch.device) -> VQABatch:
        return VQABatch(self.images.to(device), self.questions.to(device), self.targets.to(device), self.indices)


def read_split(cfg: ExperimentConfig, split: str, data_dir: str | None = None) -> VQAExamples:
    """A split of ``data.format`` through its registered reader, cut to ``data.max_train_pairs`` (training) or
    ``data.max_valid_pairs`` questions."""
    reader = registry.resolve(registry.data_format(cfg.data.format).reader)
    examples = reader(cfg, split, data_dir or cfg.data.data_dir or None)
    limit = {"train": cfg.data.max_train_pairs, "valid": cfg.data.max_valid_pairs}.get(split, 0)
    return examples.head(limit)


class AnswerTask:
    """Questions about images, answered by a classifier over the training answers (see the module's docstring)."""

    unit = "examples"
    metric = "accuracy"
    metrics = (Metric("accuracy", True), LOSS)

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None, world: int = 1,
                 rank: int = 0, splits: tuple[VQAExamples, VQAExamples] | None = None):
        """``splits`` (tests): (train, valid) instead of ``data.format``'s."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        train, valid = splits or (read_split(cfg, "train", data_dir), read_split(cfg, "valid", data_dir))
        if not len(train) or not len(valid):
            raise AttnkitError(f"empty training or validation data ({train.origin or cfg.data.format})")
        if rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            QuestionVocab.build(train, self.run_dir)
        distributed.barrier(world)
        self.vocab = QuestionVocab.read(self.run_dir)
        index = {a: i for i, a in enumerate(self.vocab.answers)}
        unseen = next((i for i, a in enumerate(valid.answers) if a not in index), None)
        if unseen is not None:
            where = f"{valid.origin}:{valid.lines[unseen]}" if valid.lines else valid.origin
            raise AttnkitError(f"{where}: answer {valid.answers[unseen]!r} is not among the training answers")
        self.splits = {"train": train, "valid": valid}
        self.questions, self.targets, self.pixels, self.image_of = {}, {}, {}, {}
        for split, data in self.splits.items():
            self.questions[split] = self.vocab.encode(data.questions)
            self.targets[split] = torch.tensor([index[a] for a in data.answers], dtype=torch.long)
            self.pixels[split], self.image_of[split] = load_pixels(data.images, cfg.data.image_size)

    @property
    def files(self) -> list[Path]:
        return self.vocab.paths

    def build_model(self):
        return registry.resolve(registry.task_of(self.cfg).build)(self.cfg, self.vocab, self.run_dir)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        """Each question's words (the batch pads questions to its longest), and no target tokens."""
        questions = self.questions[split]
        return [max(len(q), 1) for q in questions], [0] * len(questions)

    def batch(self, split: str, indices: list[int]) -> VQABatch:
        questions = pad([self.questions[split][i] or [0] for i in indices])
        images = self.pixels[split][self.image_of[split][indices]]
        return VQABatch(images, questions, self.targets[split][indices], list(indices))

    def loss(self, model, batch: VQABatch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, int]:
        out = model(batch.images, batch.questions, targets=batch.targets, label_smoothing=label_smoothing)
        return out.loss, out.nll, len(batch.indices)

    @torch.no_grad()
    def predict(self, model, split: str, device: torch.device, max_tokens: int) -> Tensor:
        """Logits [N, answers] of every question of ``split``, in its order."""
        outputs = torch.zeros(len(self.questions[split]), len(self.vocab.answers))
        batch_size = self.cfg.train.batch_size or 256
        for idx in token_batches(*self.lengths(split), max_tokens, max_examples=batch_size):
            b = self.batch(split, idx).to(device)
            outputs[idx] = model(b.images, b.questions).logits.float().cpu()
        return outputs

    def validate(self, model, device: torch.device, max_tokens: int) -> dict:
        logits = self.predict(model, "valid", device, max_tokens)
        gold = self.targets["valid"]
        loss = float(torch.nn.functional.cross_entropy(logits, gold))
        scores = answer_scores(logits.argmax(-1).tolist(), gold.tolist(), self.splits["valid"].types)
        return {"valid_loss": loss, **{f"valid_{k}": v for k, v in scores.items()}}
