"""What the training loop trains on. A task owns the data, its batching and its task-specific scores.

The Trainer only needs, from a task: ``build_model()``, ``lengths(split)`` for bucketing,
``batch(split, indices)`` -> :class:`attnkit.data.Batch`, ``scores(model)`` for validation
beyond the loss (BLEU, ...), and ``files`` to copy into every checkpoint (tokenizers).
"""

from __future__ import annotations

from pathlib import Path

from attnkit.config import ExperimentConfig
from attnkit.data import Batch, Parallel, build_tokenizers, collate, encode_pairs, load_split
from attnkit.decode import translate
from attnkit.errors import AttnkitError
from attnkit.evaluate import bleu
from attnkit.models import build_model
from attnkit.train import distributed


class TranslationTask:
    """Sentence pairs: SentencePiece subwords trained on the training side, BLEU on validation."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None,
                 train_pairs: Parallel | None = None, valid_pairs: Parallel | None = None, world: int = 1,
                 rank: int = 0):
        self.cfg = cfg
        train_pairs = train_pairs or load_split(cfg.data, "train", data_dir)
        self.valid_pairs = valid_pairs or load_split(cfg.data, "valid", data_dir)
        if not train_pairs.src or not self.valid_pairs.src:
            raise AttnkitError(f"empty training or validation data ({train_pairs.origin or cfg.data.format})")
        if rank == 0:  # one rank trains the tokenizer; the others load it
            build_tokenizers(cfg.data, train_pairs, run_dir)
        distributed.barrier(world)
        self.toks = build_tokenizers(cfg.data, train_pairs, run_dir)
        self.data = {"train": encode_pairs(self.toks, train_pairs, cfg.data.max_len),
                     "valid": encode_pairs(self.toks, self.valid_pairs)}

    @property
    def files(self) -> list[Path]:
        return sorted({self.toks.src.path, self.toks.tgt.path})

    def build_model(self):
        return build_model(self.cfg.model, self.toks.src.vocab_size, self.toks.tgt.vocab_size)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        d = self.data[split]
        return [len(s) for s in d.src], [len(t) for t in d.tgt]

    def batch(self, split: str, indices: list[int]) -> Batch:
        d = self.data[split]
        return collate([d.src[i] for i in indices], [d.tgt[i] for i in indices], indices)

    def scores(self, model) -> dict:
        t, d = self.cfg.train, self.cfg.decode
        if not t.eval_bleu:
            return {}
        out = translate(model, self.toks, self.valid_pairs.src, beam_size=t.eval_beam, len_penalty=d.len_penalty,
                        max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        return {"valid_bleu": bleu([x.text[0] for x in out], self.valid_pairs.tgt).score}
