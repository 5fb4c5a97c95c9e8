"""Reading audio and making its features, with the field's libraries: ``soundfile`` reads WAV, FLAC and OGG,
``soxr`` resamples, ``librosa`` gives the mel filterbank.

    wave = read_audio("a.flac", rate=8000)         # mono float32 at 8 kHz, checked (empty, silent, truncated, long)
    features = log_mel(wave, 8000, n_mels=40)      # [T, 40]: 25 ms windows every 10 ms, log energies
    features = normalise(features)                 # per utterance: zero mean, unit variance in each band

Bad audio is a one-line :class:`AttnkitError` naming the file: not audio, empty, silent, a truncated WAV, a
rate below the model's, longer than the limit.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnkit.errors import AttnkitError

SILENCE = 1e-4  # a peak below this (of full scale 1.0) is silence
WINDOW_MS, HOP_MS = 25.0, 10.0
LOG_FLOOR = 1e-6  # added to the mel energies before the log: silence stays finite


@dataclass(frozen=True)
class AudioSettings:
    """What the features of a model are made with (``[data]`` of its config): ``rate`` the sample rate the model
    hears (other rates are resampled to it; lower ones are refused), ``n_mels`` its filterbank's bands,
    ``max_seconds`` the longest utterance it reads."""

    rate: int = 8000
    n_mels: int = 40
    max_seconds: float = 30.0

    @classmethod
    def of(cls, data) -> AudioSettings:
        return cls(data.sample_rate, data.n_mels, data.max_audio_seconds)


def _wav_truncated(data: bytes) -> bool:
    """A RIFF/WAVE file whose header declares more bytes than the file holds (a cut-off download or copy)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return False
    declared = int.from_bytes(data[4:8], "little") + 8
    if declared < len(data) - 1:  # odd padding, or a header that was never updated: not truncation
        return False
    pos = 12
    while pos + 8 <= len(data):  # the data chunk's declared size against what follows it
        chunk, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        if chunk == b"data":
            return size != 0xFFFFFFFF and pos + 8 + size > len(data)
        pos += 8 + size + (size & 1)
    return True  # no data chunk within the file


def decode_audio(data: bytes, where: str) -> tuple[np.ndarray, int]:
    """Bytes of an audio file -> (samples [N] float32 mono, rate). ``where`` names it in errors."""
    import soundfile

    if not data:
        raise AttnkitError(f"{where}: empty file (no audio)")
    if _wav_truncated(data):
        raise AttnkitError(f"{where}: truncated WAV file (its header declares more audio than the file holds)")
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise AttnkitError(f"{where}: not an audio file soundfile reads (WAV, FLAC, OGG): "
                           f"{' '.join(str(e).split())}") from None
    return samples.mean(axis=1), int(rate)  # down-mixed to mono


def prepare_wave(samples: np.ndarray, rate: int, settings: AudioSettings, where: str) -> np.ndarray:
    """Mono samples at ``rate`` -> float32 at ``settings.rate``, checked: not empty, not silent, not too long, not
    at a lower rate than the model's (its upper band would be missing)."""
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if samples.ndim != 1:
        raise AttnkitError(f"{where}: expected samples [N] or [N, channels], got an array of shape {samples.shape}")
    if samples.size == 0:
        raise AttnkitError(f"{where}: empty audio (no samples)")
    if not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise AttnkitError(f"{where}: sample rate {rate!r} is not a positive integer")
    if rate < settings.rate:
        raise AttnkitError(f"{where}: sampled at {rate} Hz, below the {settings.rate} Hz this model hears (resample "
                           f"it to at least {settings.rate} Hz)")
    seconds = samples.size / rate
    if seconds > settings.max_seconds:
        raise AttnkitError(f"{where}: {seconds:.1f} s of audio, longer than the limit of {settings.max_seconds:g} s")
    if not np.all(np.isfinite(samples)):
        raise AttnkitError(f"{where}: the samples hold NaN or infinity")
    if float(np.abs(samples).max()) < SILENCE:
        raise AttnkitError(f"{where}: silent (no sample above {SILENCE:g} of full scale)")
    if rate != settings.rate:
        import soxr

        samples = soxr.resample(samples, rate, settings.rate).astype(np.float32)
    if samples.size < settings.rate * (WINDOW_MS + 7 * HOP_MS) / 1000:
        raise AttnkitError(f"{where}: {1000 * samples.size / settings.rate:.0f} ms of audio, too short to hear")
    return samples


def read_audio(value, settings: AudioSettings, where: str | None = None) -> np.ndarray:
    """A path (str or Path), bytes of a file, or a (samples, rate) pair -> checked mono float32 samples at the
    model's rate."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        samples, rate = value
        return prepare_wave(samples, rate, settings, where or "audio")
    if isinstance(value, (bytes, bytearray)):
        samples, rate = decode_audio(bytes(value), where or "audio")
        return prepare_wave(samples, rate, settings, where or "audio")
    if isinstance(value, (str, Path)):
        path = Path(value)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise AttnkitError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise AttnkitError(f"{path}: a directory, not an audio file") from None
        except OSError as e:
            raise AttnkitError(f"{path}: cannot read ({e.strerror or e})") from None
        samples, rate = decode_audio(data, where or str(path))
        return prepare_wave(samples, rate, settings, where or str(path))
    raise AttnkitError(f"{where or 'audio'}: expected a file path or (samples, rate), got {type(value).__name__}")


def mel_filters(rate: int, n_fft: int, n_mels: int) -> Tensor:
    """librosa's (Slaney) mel filterbank M [n_mels, n_fft / 2 + 1] up to rate / 2."""
    import librosa

    return torch.from_numpy(librosa.filters.mel(sr=rate, n_fft=n_fft, n_mels=n_mels)).float()


_FILTERS: dict[tuple[int, int, int], Tensor] = {}


def log_mel(wave: np.ndarray, rate: int, n_mels: int = 40) -> Tensor:
    """Log mel filterbank energies [T, n_mels]: ``log(M |STFT(x)|^2 + 1e-6)`` with 25 ms Hann windows every 10 ms
    (frames centred, the signal reflected at its ends, as librosa's ``melspectrogram``) and librosa's mel filters
    M (:func:`mel_filters`)."""
    hop, window = round(rate * HOP_MS / 1000), round(rate * WINDOW_MS / 1000)
    n_fft = 1 << (window - 1).bit_length()
    key = (rate, n_fft, n_mels)
    if key not in _FILTERS:
        _FILTERS[key] = mel_filters(rate, n_fft, n_mels)
    x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
    spectrum = torch.stft(x, n_fft, hop, window, torch.hann_window(window), center=True, pad_mode="constant",
                          return_complex=True).abs() ** 2  # [n_fft / 2 + 1, T]
    return torch.log(_FILTERS[key] @ spectrum + LOG_FLOOR).T.contiguous()


def normalise(features: Tensor) -> Tensor:
    """Per-utterance mean and variance normalisation: each band of [T, F] to zero mean and unit variance."""
    mean = features.mean(0, keepdim=True)
    std = features.std(0, keepdim=True, unbiased=False).clamp(min=1e-5)
    return (features - mean) / std


def features_of(wave: np.ndarray, settings: AudioSettings) -> Tensor:
    """Checked samples at the model's rate -> the normalised log-mel frames [T, n_mels] a speech model reads."""
    return normalise(log_mel(wave, settings.rate, settings.n_mels))


def frame_times(n_frames: int) -> list[float]:
    """Each frame's centre, in seconds (``center=True`` framing: frame t is centred at t hops)."""
    return [round(t * HOP_MS / 1000, 3) for t in range(n_frames)]


def spec_augment(features: Tensor, freq_masks: int, freq_width: int, time_masks: int, time_width: int,
                 generator: torch.Generator | None = None) -> Tensor:
    """SpecAugment's masks (Park et al. 2019): ``freq_masks`` bands of up to ``freq_width`` mel channels and
    ``time_masks`` stretches of up to ``time_width`` frames (at most a fifth of the utterance each) set to the mean,
    0 after normalisation. features [T, F] -> a masked copy."""
    out = features.clone()
    t, f = out.shape
    for _ in range(freq_masks):
        width = int(torch.randint(0, freq_width + 1, (), generator=generator))
        start = int(torch.randint(0, max(1, f - width), (), generator=generator))
        out[:, start:start + width] = 0.0
    for _ in range(time_masks):
        width = int(torch.randint(0, min(time_width, t // 5) + 1, (), generator=generator))
        start = int(torch.randint(0, max(1, t - width), (), generator=generator))
        out[start:start + width] = 0.0
    return out
