"""Spoken Multi30k: Multi30k's English captions spoken by ``espeak-ng`` in several voices, speaking rates and
pitches, transcribed as characters.

**Splits.** Multi30k's own: ``train`` (29,000 captions), ``valid`` (``val``, 1,014) and ``test`` (test2016,
``test_2016_flickr``, 1,000), each caption spoken once per ``data.renditions`` in a voice of ``data.voices``; and
``test_held_out_voice``, test2016's captions again with the same rates and pitches as ``test`` but all in
``data.held_out_voice``, a voice no other split uses, so the two test scores differ by the voice alone.

**Renditions.** Caption i of a split is spoken by voice, rate (words a minute) and pitch (espeak-ng's 0-99) drawn
uniformly from ``data.voices``, ``data.speaking_rates`` and ``data.pitches`` by a generator seeded with
(``data.synthesis_seed``, the split): the same every time, whatever else is read, and whichever process asks.

**The cache.** Each utterance is synthesised once, resampled to ``data.sample_rate`` with ``soxr`` and kept as a
16-bit mono WAV under ``data.speech_cache``::

    <speech_cache>/multi30k_en_<rate>hz/<Multi30k split>/<line>-<voice>-s<rate>-p<pitch>-<caption hash>.wav

A name says everything the file was made from, so a changed setting gets new files and an existing file is never
written again; a file is written under a temporary name and hard-linked into place only if its name is free, so
processes that synthesise the same cache at once (two runs, ranks of one run) never see half a file and never
replace one. To make an utterance again, delete its file.

**Transcripts** are spelled in the character set of Listen, Attend and Spell (Chan et al. 2016: a-z, 0-9, space,
comma, period, apostrophe) by :func:`spelling`.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import unicodedata
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from tqdm import tqdm

from attnkit.data.corpus import read_lines, resolve_data_dir
from attnkit.data.speech import Utterances
from attnkit.errors import AttnkitError

ESPEAK = "espeak-ng"
INSTALL = "install it with `apt-get install espeak-ng` (Debian, Ubuntu; `make espeak` does it) or your system's package"
HELD_OUT = "test_held_out_voice"
SPLITS = ("train", "valid", "test", HELD_OUT)
_SPLIT_SEEDS = {"train": 0, "valid": 1, "test": 2, HELD_OUT: 2}  # the held-out voice reads test's rates and pitches


@dataclass(frozen=True)
class Rendition:
    """How one caption is spoken: an espeak-ng voice (``language[+variant]``), a rate in words a minute and a
    pitch (0-99)."""

    voice: str
    rate: int
    pitch: int


# --- transcripts

_SEPARATORS = re.compile(r"(?<=\w)[-/](?=\w)")  # t-shirt, black/white: espeak-ng reads two words
_NOT_LAS = re.compile(r"[^a-z0-9 ,.']")


def spelling(caption: str) -> str:
    """A caption as Listen, Attend and Spell's characters: a-z, 0-9, space, comma, period, apostrophe.

    Lowercased, accented letters folded to their ASCII letter (NFKD), ``&`` spelled "and", a hyphen or slash
    between two words a space (espeak-ng reads "t-shirt" as two words), every other character (quotes, brackets,
    ! ? ; : # % ...) dropped, and the caption's final periods and commas dropped: Multi30k ends some captions with a
    period and others not, and the synthesiser makes no sound for it. Commas and inner periods stay (espeak-ng pauses at
    them); digits stay digits though espeak-ng says them as words. Runs of spaces become one.

        spelling('A man in a T-shirt, "smiling" at E.S.E. Electronics.')
        -> "a man in a t shirt, smiling at e.s.e. electronics"
    """
    text = unicodedata.normalize("NFKD", caption).encode("ascii", "ignore").decode("ascii").lower()
    text = _SEPARATORS.sub(" ", text.replace("&", " and "))
    return " ".join(_NOT_LAS.sub("", text).split()).rstrip(" ,.")


# --- renditions


def _check_settings(data) -> None:
    if not data.voices:
        raise AttnkitError("data.voices: empty; name at least one espeak-ng voice (e.g. \"en-us+m1\")")
    if data.held_out_voice and data.held_out_voice in data.voices:
        raise AttnkitError(f"data.held_out_voice = {data.held_out_voice!r} is also in data.voices: a held-out voice "
                           "is never used in training")
    for key, (low, high), (floor, ceiling) in (("speaking_rates", data.speaking_rates, (80, 450)),
                                               ("pitches", data.pitches, (0, 99))):
        if not floor <= low <= high <= ceiling:
            raise AttnkitError(f"data.{key} = [{low}, {high}]: expected [low, high] within [{floor}, {ceiling}]")
    if data.renditions < 1:
        raise AttnkitError(f"data.renditions = {data.renditions} must be at least 1")


def renditions(data, split: str, n: int) -> list[list[Rendition]]:
    """How each of a split's ``n`` captions is spoken (``data.renditions`` ways each in training, one elsewhere):
    drawn from ``data.voices``, ``data.speaking_rates`` and ``data.pitches`` by a generator seeded with
    (``data.synthesis_seed``, the split). Caption i's renditions depend on i, not on how many captions are read."""
    _check_settings(data)
    if split == HELD_OUT and not data.held_out_voice:
        raise AttnkitError(f"split {HELD_OUT!r}: data.held_out_voice is empty")
    k = data.renditions if split == "train" else 1
    # one stream of uniforms read in caption order, three per rendition: the first n captions' draws are the same
    # whatever n is
    u = np.random.default_rng([data.synthesis_seed, _SPLIT_SEEDS[split]]).random((n, k, 3))

    def pick(x: float, low: int, high: int) -> int:  # uniform over low..high
        return low + min(int(x * (high - low + 1)), high - low)

    return [[Rendition(data.held_out_voice if split == HELD_OUT else data.voices[pick(v, 0, len(data.voices) - 1)],
                       pick(r, *data.speaking_rates), pick(p, *data.pitches)) for v, r, p in u[i]] for i in range(n)]


# --- espeak-ng


def espeak_ng() -> str:
    """The espeak-ng program on PATH; its absence is one line saying how to install it."""
    path = shutil.which(ESPEAK)
    if not path:
        raise AttnkitError(f"{ESPEAK}: not found on PATH (spoken Multi30k is synthesised with it); {INSTALL}")
    return path


@lru_cache(maxsize=4)
def _known_voices(program: str) -> tuple[frozenset[str], frozenset[str]]:
    """espeak-ng's languages and variants (the files under voices/!v), from ``--voices`` and ``--voices=variant``."""
    def table(*args) -> list[list[str]]:
        out = subprocess.run([program, *args], capture_output=True, text=True, timeout=60)
        return [line.split() for line in out.stdout.splitlines()[1:] if line.strip()]

    languages = {row[1] for row in table("--voices") if len(row) > 1}
    languages |= {row[4].rpartition("/")[2] for row in table("--voices") if len(row) > 4}
    variants = {row[4].rpartition("/")[2].lower() for row in table("--voices=variant") if len(row) > 4}
    return frozenset(languages), frozenset(variants)


def check_voices(program: str, voices: list[str]) -> None:
    """Each voice is ``language[+variant]`` of espeak-ng's (an unknown variant it would silently ignore)."""
    languages, variants = _known_voices(program)
    for voice in voices:
        language, _, variant = voice.partition("+")
        if language not in languages or (variant and variant.lower() not in variants):
            raise AttnkitError(f"data.voices: espeak-ng has no voice {voice!r} (`espeak-ng --voices=en` lists "
                               "the languages, `espeak-ng --voices=variant` the +variants)")


def speak(program: str, text: str, rendition: Rendition) -> tuple[np.ndarray, int]:
    """espeak-ng's audio of ``text`` (read from stdin, so no caption is taken for an option): (samples, rate)."""
    import soundfile

    command = [program, "-v", rendition.voice, "-s", str(rendition.rate), "-p", str(rendition.pitch), "--stdout"]
    try:
        out = subprocess.run(command, input=text.encode("utf-8"), capture_output=True, timeout=120)
    except OSError as e:
        raise AttnkitError(f"{program}: cannot run ({e.strerror or e}); {INSTALL}") from None
    if out.returncode != 0 or not out.stdout:
        why = " ".join(out.stderr.decode("utf-8", "replace").split()) or f"exit status {out.returncode}"
        raise AttnkitError(f"{' '.join(command)}: {why}")
    samples, rate = soundfile.read(io.BytesIO(out.stdout), dtype="float32", always_2d=True)
    return samples.mean(axis=1), int(rate)


def _write_once(path: Path, samples: np.ndarray, rate: int) -> None:
    """Write a WAV to a temporary name beside ``path``, then link it into place only if ``path`` is free."""
    import soundfile

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        soundfile.write(str(tmp), samples, rate, subtype="PCM_16", format="WAV")
        try:
            os.link(tmp, path)  # fails, and leaves what is there, when another process made it first
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: rename, still never over an existing file
            if not path.exists():
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def synthesise(program: str, text: str, rendition: Rendition, rate: int, path: Path) -> Path:
    """``path``: ``text`` spoken as ``rendition`` at ``rate`` Hz, made unless it exists."""
    if path.exists():
        return path
    samples, native = speak(program, text, rendition)
    if native != rate:
        import soxr

        samples = soxr.resample(samples, native, rate)
    _write_once(path, np.clip(samples, -1.0, 1.0).astype(np.float32), rate)
    return path


def cache_path(root: Path, prefix: str, line: int, caption: str, rendition: Rendition) -> Path:
    digest = hashlib.sha256(caption.encode("utf-8")).hexdigest()[:10]
    return root / prefix / f"{line:05d}-{rendition.voice}-s{rendition.rate}-p{rendition.pitch}-{digest}.wav"


def _workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --- the splits


def captions(data, split: str, data_dir: str | None = None) -> tuple[Path, list[str]]:
    """A split's Multi30k English captions and the file they come from; an empty caption is an error naming its
    line."""
    if split not in SPLITS:
        raise AttnkitError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    prefix = {"train": data.train_prefix, "valid": data.valid_prefix}.get(split, data.test_prefix)
    path = resolve_data_dir(data_dir or data.data_dir or None) / "multi30k" / "task1" / "raw" / f"{prefix}.en.gz"
    lines = read_lines(path)
    for number, line in enumerate(lines, 1):
        if not spelling(line):
            raise AttnkitError(f"{path}:{number}: a caption with nothing to say ({line[:60]!r})")
    return path, lines


def spoken_captions(data, split: str, data_dir: str | None = None, limit: int = 0, workers: int = 0) -> Utterances:
    """A split's utterances (the first ``limit`` captions; 0: all), each a cached WAV path with its transcript,
    synthesised first where missing (``workers`` espeak-ng processes at once; 0: one per usable core)."""
    path, lines = captions(data, split, data_dir)
    lines = lines[:limit] if limit else lines
    spoken = renditions(data, split, len(lines))  # a prefix of the whole split's
    root = Path(data.speech_cache) / f"multi30k_en_{data.sample_rate}hz"
    prefix = path.name.removesuffix(".en.gz")
    out = Utterances(origin=f"spoken Multi30k {prefix} ({split})")
    todo = []
    for number, (caption, ways) in enumerate(zip(lines, spoken), 1):
        for rendition in ways:
            file = cache_path(root, prefix, number, caption, rendition)
            out.audio.append(file)
            out.transcripts.append(spelling(caption))
            if not file.exists():
                todo.append((caption, rendition, file))
    if todo:
        program = espeak_ng()
        check_voices(program, sorted({r.voice for _, r, _ in todo}))
        (root / prefix).mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(workers or _workers()) as pool, \
                tqdm(total=len(todo), unit="utt", desc=f"{ESPEAK} {prefix}", file=sys.stderr, mininterval=10,
                     disable=len(todo) <= 50) as bar:  # each thread waits on its espeak-ng process
            try:
                for _ in pool.map(lambda job: synthesise(program, job[0], job[1], data.sample_rate, job[2]), todo):
                    bar.update()
            except BaseException:  # the first failure (or ^C) ends the synthesis: what is queued is not started
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    return out


def read_spoken_multi30k(data, split: str, data_dir: str | None = None) -> Utterances:
    """A split of spoken Multi30k for training (``data.format = "spoken_multi30k"``): ``data.max_train_pairs`` and
    ``data.max_valid_pairs`` keep the first captions of train and valid."""
    limit = {"train": data.max_train_pairs, "valid": data.max_valid_pairs}.get(split, 0)
    return spoken_captions(data, split, data_dir, limit)
