"""Visual question answering as a training task: each example is (image, question) -> one of the answers.

The images are held in memory as uint8 pixels at ``data.image_size`` (each read once, however many questions ask
about it). A batch is made of whole images, each with all its questions, so the CNN reads an image once per batch
however many questions ask about it (easy-VQA asks about 10 per image, and the CNN is most of a step's cost): the
trainer's examples are the images, ``lengths`` an image's number of questions, and a batch holds at most
``train.batch_size`` images and ``train.max_tokens`` questions (each image counted with the batch's most questions;
images with as many questions are bucketed together). The loss sums the cross-entropy over the batch's questions;
validation reports accuracy overall and per question type (``valid_accuracy_<type>``), scored with scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit import registry
from attnkit.config import ExperimentConfig
from attnkit.data import pad, token_batches
from attnkit.data.vqa import QuestionVocab, VQAExamples, image_batch, load_pixels, questions_by_image
from attnkit.errors import AttnkitError
from attnkit.evaluate.metrics import answer_scores
from attnkit.train import distributed
from attnkit.train.tasks import LOSS, Metric


@dataclass
class VQABatch:
    """Images [M, 3, S, S] uint8, questions [B, T] (PAD-padded), answers [B] (class ids), ``image_index`` [B]
    (question b asks about ``images[image_index[b]]``) and the questions' positions in the dataset [B]."""

    images: Tensor
    questions: Tensor
    targets: Tensor
    image_index: Tensor
    indices: list[int]

    def to(self, device: torch.device) -> VQABatch:
        return VQABatch(self.images.to(device), self.questions.to(device), self.targets.to(device),
                        self.image_index.to(device), self.indices)


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
        self.questions, self.targets, self.pixels, self.asks = {}, {}, {}, {}
        for split, data in self.splits.items():
            self.questions[split] = self.vocab.encode(data.questions)
            self.targets[split] = torch.tensor([index[a] for a in data.answers], dtype=torch.long)
            self.pixels[split], image_of = load_pixels(data.images, cfg.data.image_size)
            self.asks[split] = questions_by_image(image_of, len(self.pixels[split]))

    @property
    def files(self) -> list[Path]:
        return self.vocab.paths

    def build_model(self):
        return registry.resolve(registry.task_of(self.cfg).build)(self.cfg, self.vocab, self.run_dir)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        """Each image's number of questions, and no target tokens (token_batches counts one more per example: the
        image itself stands for it)."""
        asks = self.asks[split]
        return [len(a) - 1 for a in asks], [0] * len(asks)

    def batch(self, split: str, images: list[int]) -> VQABatch:
        """``images`` (positions among the split's images), each with all its questions."""
        indices, image_index = image_batch(self.asks[split], images)
        questions = pad([self.questions[split][i] or [0] for i in indices])
        return VQABatch(self.pixels[split][images], questions, self.targets[split][indices], image_index, indices)

    def loss(self, model, batch: VQABatch, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor, int]:
        out = model(batch.images, batch.questions, targets=batch.targets, label_smoothing=label_smoothing,
                    image_index=batch.image_index)
        return out.loss, out.nll, len(batch.indices)

    @torch.no_grad()
    def predict(self, model, split: str, device: torch.device, max_tokens: int) -> Tensor:
        """Logits [N, answers] of every question of ``split``, in its order."""
        outputs = torch.zeros(len(self.questions[split]), len(self.vocab.answers))
        batch_size = self.cfg.train.batch_size or 256
        for images in token_batches(*self.lengths(split), max_tokens, max_examples=batch_size):
            b = self.batch(split, images).to(device)
            outputs[b.indices] = model(b.images, b.questions, image_index=b.image_index).logits.float().cpu()
        return outputs

    def validate(self, model, device: torch.device, max_tokens: int) -> dict:
        logits = self.predict(model, "valid", device, max_tokens)
        gold = self.targets["valid"]
        loss = float(torch.nn.functional.cross_entropy(logits, gold))
        scores = answer_scores(logits.argmax(-1).tolist(), gold.tolist(), self.splits["valid"].types)
        return {"valid_loss": loss, **{f"valid_{k}": v for k, v in scores.items()}}
