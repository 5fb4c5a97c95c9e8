"""Speech: an audio file (WAV, FLAC, OGG) or samples with their rate, heard as normalised log-mel frames
(:mod:`attnkit.data.audio`). The decoder attends over the encoder's frames, each a stretch of the sound with its
times."""

from __future__ import annotations

import torch

from attnkit.data.audio import HOP_MS, AudioSettings, features_of, read_audio
from attnkit.errors import AttnkitError, RequestError
from attnkit.kinds import Field, InputKind, Upload, schema
from attnkit.nn.audio import Frames

_MATRIX = schema.array(schema.array(schema.NUMBER))
TRANSCRIBE = Upload(
    "/v1/transcribe", "transcribe", (
        Field("audio", "file", required=True, max_bytes="max_audio_bytes", media="audio/*",
              description="the audio file (WAV, FLAC, OGG); at most {s.max_audio_bytes} bytes and "
                          "{s.max_audio_seconds:g} s (more: 413); not audio, empty, silent, truncated or at a rate "
                          "below the model's: 422"),
        Field("beam", "int", low=1, high="max_beam", key=True, description="1 is greedy (default: the checkpoint's)"),
        Field("attention", "bool", default=True, key=True, description="each character's attention over the frames")),
    "Transcript", schema.obj({
        "model": schema.STRING, "transcript": schema.STRING, "characters": schema.array(schema.STRING),
        "score": schema.NUMBER, "frames": schema.array(schema.array(schema.NUMBER)), "seconds": schema.NUMBER,
        "attention": _MATRIX, "spectrogram": _MATRIX},
        ["model", "transcript", "characters", "score", "frames", "seconds"]),
    "a speech model", streams=True)


class SpeechKind(InputKind):
    name = "speech"
    field = "audio"
    title = "audio file"
    evaluates = "attnkit.cli.decode:evaluate_speech"  # a list of clips with their transcripts: CER, WER
    json_inputs = False  # audio is uploaded (/v1/transcribe), not sent in JSON
    upload = TRANSCRIBE

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

    def check(self, model, values) -> None:
        if isinstance(values, (str, bytes)):
            raise AttnkitError("transcribe takes a list of inputs")

    # --- uploads: POST /v1/transcribe

    def read_form(self, model, form: dict, settings) -> dict:
        return {"input": self.read_upload(model, form["audio"], settings), "beam": form["beam"],
                "attention": form["attention"]}

    def upload_tokens(self, model, payload: dict) -> int:
        """The clip's feature frames (one per ``HOP_MS``), without computing them."""
        samples, rate = payload["input"]
        return int(len(samples) * 1000 // (rate * HOP_MS))

    def answer_uploads(self, model, name: str, payloads: list[dict], on_step=None) -> list[dict]:
        """The batch's clips transcribed together (:meth:`attnkit.api.Model.transcribe`), each answer with its
        characters, the encoder frames' times, its spectrogram and, where asked, each character's attention over the
        frames; ``on_step`` streams the search."""
        clips = [p["input"] for p in payloads]
        out = model.transcribe(clips, beam=payloads[0]["beam"], details=True, on_step=on_step)
        answers = []
        for p, t in zip(payloads, out):
            h = t.hypotheses[0]
            answer = {"model": name, "transcript": t.text[0],
                      "characters": list(model.tokenizers.id_to_piece(h.tokens)) + ["<end>"],
                      "score": schema.finite(h.score), "frames": [list(span) for span in self.spans(model, t.frames)],
                      "seconds": round(t.frames * HOP_MS / 1000, 2),
                      "spectrogram": schema.rounded(self.features(model, p["input"]), 2)}
            if p["attention"]:
                answer["attention"] = [] if h.attention is None else schema.rounded(h.attention)
            answers.append(answer)
        return answers

    def read_upload(self, model, data: bytes, settings, field: str = "audio"):
        """An uploaded audio file -> (samples, rate) at the model's rate, checked: 413 past the server's bytes or
        seconds (or the model's), 422 for bytes that are no audio, empty, silent or truncated, or a rate too low."""
        from dataclasses import replace

        from attnkit.data.audio import decode_audio, prepare_wave

        if len(data) > settings.max_audio_bytes:
            raise RequestError(413, f"{field}: {len(data)} bytes, more than this server's limit of "
                                    f"{settings.max_audio_bytes}")
        limit = min(settings.max_audio_seconds, self.settings(model).max_seconds)
        try:
            samples, rate = decode_audio(data, field)
        except AttnkitError as e:
            raise RequestError(422, str(e)) from None
        if samples.size / rate > limit:
            raise RequestError(413, f"{field}: {samples.size / rate:.1f} s of audio, longer than this server's "
                                    f"limit of {limit:g} s")
        try:
            wave = prepare_wave(samples, rate, replace(self.settings(model), max_seconds=limit), field)
        except AttnkitError as e:
            raise RequestError(422, str(e)) from None
        return wave, self.settings(model).rate


SPEECH = SpeechKind()
