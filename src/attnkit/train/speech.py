"""Speech recognition as a training task: utterances' log-mel frames in, their characters out.

The data format's reader gives each split's utterances (:mod:`attnkit.data.speech`); their features are made once,
kept in memory as float16, and SpecAugment masks the training batches afresh each time (``data.freq_masks``,
``data.time_masks``). The characters of the training transcripts are the vocabulary (``chars.json``). Validation
reports the loss and, of greedy transcripts, the character and word error rates (jiwer) and string accuracy; CER
ranks checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit import registry
from attnkit.checkpoint import SPEECH_TOKENIZER_FILE as TOKENIZER_FILE
from attnkit.config import ExperimentConfig
from attnkit.data import Batch, CharTokenizer, collate
from attnkit.data.audio import AudioSettings, features_of, read_audio, spec_augment
from attnkit.data.speech import Utterances
from attnkit.decode.transcribe import transcribe
from attnkit.errors import AttnkitError
from attnkit.evaluate.speech import speech_scores
from attnkit.models import build_model
from attnkit.nn.audio import pad_frames
from attnkit.train import distributed
from attnkit.train.tasks import LOSS, GenerationTask, Metric

CER = Metric("cer", higher_is_better=False, fallback=LOSS.name)  # without validation decoding: the loss
WER = Metric("wer", higher_is_better=False)
STRING_ACCURACY = Metric("string_accuracy", higher_is_better=True)


def read_utterances(cfg: ExperimentConfig, split: str, data_dir: str | None = None) -> Utterances:
    """A split of ``data.format``'s utterances (:mod:`attnkit.registry` names its reader)."""
    return registry.resolve(registry.data_format(cfg.data.format).reader)(cfg.data, split, data_dir)


def utterance_features(utterances: Utterances, settings: AudioSettings) -> list[torch.Tensor]:
    """Each utterance's normalised log-mel frames [T, n_mels], float16; a bad file is an error naming it."""
    out = []
    for i, audio in enumerate(utterances.audio):
        where = None if not isinstance(audio, tuple) else f"{utterances.origin}: utterance {i + 1}"
        out.append(features_of(read_audio(audio, settings, where), settings).half())
    return out


class SpeechTask(GenerationTask):
    metric = CER.name
    metrics = (CER, WER, STRING_ACCURACY, LOSS)

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, data_dir: str | None = None, world: int = 1,
                 rank: int = 0, splits: dict[str, Utterances] | None = None):
        """``splits`` (tests): {"train": ..., "valid": ...} instead of ``data.format``'s."""
        self.cfg = cfg
        self.splits = splits or {split: read_utterances(cfg, split, data_dir) for split in ("train", "valid")}
        if not self.splits["train"].audio or not self.splits["valid"].audio:
            raise AttnkitError(f"empty training or validation data ({cfg.data.format})")
        path = Path(run_dir) / TOKENIZER_FILE
        if rank == 0 and not path.exists():  # the training transcripts' characters; a resumed run keeps its own
            CharTokenizer.build("".join(self.splits["train"].transcripts), path)
        distributed.barrier(world)
        self.tokenizer = CharTokenizer(path)
        self.settings = AudioSettings.of(cfg.data)
        self.features = {split: utterance_features(u, self.settings) for split, u in self.splits.items()}
        self.targets = {split: self.tokenizer.encode(u.transcripts) for split, u in self.splits.items()}

    @property
    def files(self) -> list[Path]:
        return [self.tokenizer.path]

    def build_model(self):
        return build_model(self.cfg.model, self.cfg.data.n_mels, self.tokenizer.vocab_size)

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        """Frames (10 ms each) and characters: a batch holds ``train.max_tokens`` padded frames at most."""
        return [f.size(0) for f in self.features[split]], [len(t) for t in self.targets[split]]

    def batch(self, split: str, indices: list[int]) -> Batch:
        d = self.cfg.data
        features = [self.features[split][i].float() for i in indices]
        if split == "train":
            features = [spec_augment(f, d.freq_masks, d.freq_mask, d.time_masks, d.time_mask) for f in features]
        b = collate([[] for _ in indices], [self.targets[split][i] for i in indices], indices)
        b.src = pad_frames(features)
        return b

    def scores(self, model) -> dict:
        if not self.cfg.train.eval_bleu:  # the switch for validation's decoding, whatever the task scores it with
            return {}
        out = transcribe(model, self.tokenizer, [f.float() for f in self.features["valid"]],
                         beam_size=self.cfg.train.eval_beam, max_len=self.cfg.decode.max_caption_len)
        scores = speech_scores([t.text[0] for t in out], self.splits["valid"].transcripts)
        return {f"valid_{k}": v for k, v in scores.items()}
