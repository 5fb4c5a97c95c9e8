"""Speech corpora: spoken digit strings made of the Free Spoken Digit Dataset's real recordings, and your own list
of ``path<TAB>transcript`` lines.

**Spoken digit strings.** ``fsdd/recordings/{digit}_{speaker}_{index}.wav`` (8 kHz, 5 speakers x 10 digits x 50).
FSDD's official split makes recordings 0-4 of each digit and speaker the test set; here 5-9 are validation and
10-49 training. A string joins 1-10 recordings of one speaker, drawn from one split only, with 50-250 ms of
silence between them and light noise over all of it, and is transcribed as its digits ("4 0 7 1"). The strings
of a split are a function of (seed, split) alone, so no test recording is ever heard in training. With
``held_out`` a speaker's recordings (all 50 of each digit) are the test set and the other four speakers' the
training and validation sets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnkit.data.corpus import read_text, resolve_data_dir
from attnkit.errors import AttnkitError

FSDD_RATE = 8000
SPEAKERS = ("george", "jackson", "nicolas", "theo", "yweweler")
SPLIT_INDICES = {"test": range(0, 5), "valid": range(5, 10), "train": range(10, 50)}
_NAME = re.compile(r"^(\d)_([a-z]+)_(\d+)\.wav$")


@dataclass
class Utterances:
    """Utterances and their transcripts: ``audio`` each a path, or (samples, rate); ``origin`` names where they
    came from in messages."""

    audio: list = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)
    origin: str = ""


@dataclass(frozen=True)
class Recording:
    digit: int
    speaker: str
    index: int
    path: Path


def fsdd_recordings(data_dir: str | Path | None = None) -> list[Recording]:
    """Every FSDD recording under ``<data>/fsdd/recordings``, sorted by name."""
    folder = resolve_data_dir(data_dir) / "fsdd" / "recordings"
    if not folder.is_dir():
        raise AttnkitError(f"{folder}: no such directory (the Free Spoken Digit Dataset's recordings)")
    found = []
    for path in sorted(folder.glob("*.wav")):
        m = _NAME.match(path.name)
        if m:
            found.append(Recording(int(m.group(1)), m.group(2), int(m.group(3)), path))
    if not found:
        raise AttnkitError(f"{folder}: no {{digit}}_{{speaker}}_{{index}}.wav recordings")
    return found


def split_recordings(recordings: list[Recording], split: str, held_out: str = "") -> list[Recording]:
    """A split's recordings: by FSDD's index split, or with ``held_out`` all of that speaker's for "test" and the
    others' by index for "train" and "valid"."""
    if split not in SPLIT_INDICES:
        raise AttnkitError(f"split {split!r} is not one of {', '.join(SPLIT_INDICES)}")
    if held_out:
        if held_out not in {r.speaker for r in recordings}:
            raise AttnkitError(f"data.held_out_speaker = {held_out!r} is not one of "
                               f"{', '.join(sorted({r.speaker for r in recordings}))}")
        if split == "test":
            return [r for r in recordings if r.speaker == held_out]
        return [r for r in recordings if r.speaker != held_out and r.index in SPLIT_INDICES[split]]
    return [r for r in recordings if r.index in SPLIT_INDICES[split]]


def _read_fsdd(path: Path) -> np.ndarray:
    import soundfile

    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    if rate != FSDD_RATE:
        raise AttnkitError(f"{path}: sampled at {rate} Hz; FSDD's recordings are {FSDD_RATE} Hz")
    return samples.mean(axis=1)


def digit_strings(recordings: list[Recording], count: int, seed: int, split: str, max_digits: int = 10,
                  min_digits: int = 1) -> Utterances:
    """``count`` spoken digit strings of these recordings, each (samples at 8 kHz, "d d d"), a function of
    (seed, split, the recordings) alone. Each string: one speaker, ``min_digits``-``max_digits`` recordings of
    theirs (drawn with replacement), 50-250 ms of silence before, between and after them, a random gain, and
    Gaussian noise 40-30 dB below the speech's peak."""
    if not recordings:
        raise AttnkitError(f"no recordings for the {split} digit strings")
    by_speaker: dict[str, list[Recording]] = {}
    for r in recordings:
        by_speaker.setdefault(r.speaker, []).append(r)
    speakers = sorted(by_speaker)
    cache: dict[Path, np.ndarray] = {}
    rng = np.random.default_rng([seed, sum(map(ord, split))])
    out = Utterances(origin=f"fsdd digit strings ({split})")
    for _ in range(count):
        speaker = speakers[int(rng.integers(len(speakers)))]
        pool = by_speaker[speaker]
        n = int(rng.integers(min_digits, max_digits + 1))
        picks = [pool[int(rng.integers(len(pool)))] for _ in range(n)]
        pieces = []
        for r in picks:
            pieces.append(np.zeros(int(rng.uniform(0.05, 0.25) * FSDD_RATE), np.float32))
            if r.path not in cache:
                cache[r.path] = _read_fsdd(r.path)
            pieces.append(cache[r.path])
        pieces.append(np.zeros(int(rng.uniform(0.05, 0.25) * FSDD_RATE), np.float32))
        wave = np.concatenate(pieces) * np.float32(rng.uniform(0.5, 1.0))
        peak = float(np.abs(wave).max()) or 1.0
        noise = rng.standard_normal(wave.size).astype(np.float32) * np.float32(peak * 10 ** (-rng.uniform(30, 40) / 20))
        out.audio.append(((wave + noise).astype(np.float32), FSDD_RATE))
        out.transcripts.append(" ".join(str(r.digit) for r in picks))
    return out


def read_fsdd_digits(data, split: str, data_dir: str | None = None) -> Utterances:
    """A split of the spoken digit strings (``[data]``: ``n_synthetic`` training strings, a tenth of that for
    validation and test, at least 200; ``held_out_speaker``; the strings' seed ``train.seed`` is not theirs: they
    are always made with seed 0 + the split)."""
    recordings = split_recordings(fsdd_recordings(data_dir or data.data_dir or None), split, data.held_out_speaker)
    count = data.n_synthetic if split == "train" else max(200, data.n_synthetic // 10)
    if split == "train" and data.max_train_pairs:
        count = min(count, data.max_train_pairs)
    if split != "train" and data.max_valid_pairs:
        count = min(count, data.max_valid_pairs)
    return digit_strings(recordings, count, seed=0, split=split, max_digits=data.max_digits)


def read_speech_list(path: str | Path) -> Utterances:
    """``path<TAB>transcript`` lines (UTF-8; relative paths are relative to the list's folder; blank lines and
    ``#`` comments skipped). A line without a tab, or with an empty path or transcript, is an error naming its line."""
    path = Path(path)
    text = read_text(path)
    out = Utterances(origin=str(path))
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        audio, tab, transcript = line.partition("\t")
        if not tab or not audio.strip() or not transcript.strip():
            raise AttnkitError(f"{path}:{number}: expected 'path<TAB>transcript', got {line[:60]!r}")
        file = Path(audio.strip())
        out.audio.append(file if file.is_absolute() else path.parent / file)
        out.transcripts.append(transcript.strip())
    if not out.audio:
        raise AttnkitError(f"{path}: no 'path<TAB>transcript' lines")
    return out


def read_list_split(data, split: str, data_dir: str | None = None) -> Utterances:
    """``data.train_file`` / ``data.valid_file`` of format "speech_list"."""
    name = {"train": data.train_file, "valid": data.valid_file}.get(split)
    if not name:
        raise AttnkitError(f"data.{split}_file: required for data.format = 'speech_list'")
    return read_speech_list(name)
