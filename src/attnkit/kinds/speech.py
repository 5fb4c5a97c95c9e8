"""Speech: an audio file (WAV, FLAC, OGG) or samples with their rate, heard as normalised log-mel frames
(:mod:`attnkit.data.audio`). The decoder attends over the encoder's frames, each a stretch of the sound with its
times."""

from __future__ import annotations

import torch

from attnkit.data.audio import HOP_MS, AudioSettings, features_of, read_audio
from attnkit.errors import AttnkitError
from attnkit.kinds import InputKind
from attnkit.nn.audio import Frames


class SpeechKind(InputKind):
    name = "speech"
    field = "audio"
    title = "audio file"
    evaluates_transcripts = True

    def settings(self, model) -> AudioSettings:
        return AudioSettings.of(model.config.data)

    def where(self, value) -> str:
        return "audio" if isinstance(value, (tuple, list, bytes, bytearray)) else str(value)

    def features(self, model, value, where: str | None = None) -> torch.Tensor:
        """The normalised log-mel frames [T, n_mels] of one input (a path, bytes of a file, or (samples, rate))."""
        settings = self.settings(model)
        return features_of(read_audio(value, settings, where or self.where(value)), settings)

    def encode(self, model, value) -> Frames:
        f = self.features(model, value)
        return Frames(f[None], torch.tensor([f.size(0)]))

    def memory_frames(self, model, frames: int) -> int:
        return int(model.module.memory_lengths(torch.tensor([frames]))[0])

    def length(self, model, value) -> int:
        return self.memory_frames(model, self.features(model, value).size(0))

    def spans(self, model, frames: int) -> list[tuple[float, float]]:
        """(start, end) in seconds of each encoder frame the decoder attends over."""
        step = model.module.time_reduction * HOP_MS / 1000
        return [(round(u * step, 3), round((u + 1) * step, 3)) for u in range(self.memory_frames(model, frames))]

    def positions(self, model, value) -> list[str]:
        return [f"{a:.2f}s" for a, _ in self.spans(model, self.features(model, value).size(0))]

    def own_output(self, model, value) -> str:
        return model.transcribe([value])[0]

    def describe(self, model) -> dict:
        s = self.settings(model)
        return {"grid": None, "sample_rate": s.rate, "n_mels": s.n_mels, "max_seconds": s.max_seconds}

    def check(self, model, values) -> None:
        if isinstance(values, (str, bytes)):
            raise AttnkitError("transcribe takes a list of inputs")


SPEECH = SpeechKind()
