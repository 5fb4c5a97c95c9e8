"""Spoken Multi30k: the transcripts' spelling, the renditions' determinism and held-out voice, the splits against
Multi30k's own files, the cache (read back by soundfile, reused, never overwritten, safe to fill from two threads),
the errors for a missing espeak-ng, data directory or a broken cached WAV, and a tiny LAS trained on it through
``attnkit train``."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile

from attnkit.config import DataConfig, load_config
from attnkit.data.audio import AudioSettings, read_audio
from attnkit.data.corpus import resolve_data_dir
from attnkit.data.spoken_multi30k import HELD_OUT, SPLITS, renditions, spelling, spoken_captions
from attnkit.errors import AttnkitError

CONFIG = Path(__file__).parents[1] / "configs" / "multi30k_speech_las.toml"
FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr", HELD_OUT: "test_2016_flickr"}
N = 3  # captions synthesised per split
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (make espeak)")


def data_config(cache: Path, **kw) -> DataConfig:
    """The shipped config's [data] table, its cache moved to ``cache``."""
    return dataclasses.replace(load_config(CONFIG).data, speech_cache=str(cache), **kw)


def multi30k_lines(prefix: str) -> list[str]:
    with gzip.open(resolve_data_dir() / "multi30k" / "task1" / "raw" / f"{prefix}.en.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


# --- transcripts and renditions (no synthesis)


@pytest.mark.parametrize("caption, spelled", [
    ("Two young, White males are outside near many bushes.", "two young, white males are outside near many bushes"),
    ('A man in a T-shirt, "smiling" at E.S.E. Electronics.', "a man in a t shirt, smiling at e.s.e. electronics"),
    ("A man's black/white dog & a café (closed)!", "a man's black white dog and a cafe closed"),
    ("Two men play #1 at 10% off ;  ", "two men play 1 at 10 off"),
])
def test_spelling_is_las_characters(caption, spelled):
    assert spelling(caption) == spelled


def test_every_multi30k_caption_spells_into_las_characters():
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789 ,.'")
    for prefix in ("train", "val", "test_2016_flickr"):
        for line in multi30k_lines(prefix):
            s = spelling(line)
            assert s and set(s) <= allowed and s == s.strip() and "  " not in s, line


def test_renditions_are_seeded_prefix_stable_and_never_train_in_the_held_out_voice(tmp_path):
    data = data_config(tmp_path, renditions=2)
    train = renditions(data, "train", 29000)
    assert train == renditions(data, "train", 29000)  # the same every time
    assert train[:10] == renditions(data, "train", 10)  # caption i's renditions do not depend on how many are read
    assert train != renditions(dataclasses.replace(data, synthesis_seed=1), "train", 29000)
    assert all(len(ways) == 2 for ways in train)
    for split, n in (("train", 29000), ("valid", 1014), ("test", 1000)):
        spoken = [r for ways in renditions(data, split, n) for r in ways]
        assert data.held_out_voice not in {r.voice for r in spoken}
        assert {r.voice for r in spoken} == set(data.voices)  # every training voice is used
        assert {r.rate for r in spoken} <= set(range(data.speaking_rates[0], data.speaking_rates[1] + 1))
        assert {r.pitch for r in spoken} <= set(range(data.pitches[0], data.pitches[1] + 1))
    test, held = renditions(data, "test", 1000), renditions(data, HELD_OUT, 1000)
    assert {w[0].voice for w in held} == {data.held_out_voice}
    assert [(w[0].rate, w[0].pitch) for w in held] == [(w[0].rate, w[0].pitch) for w in test]  # only the voice differs
    with pytest.raises(AttnkitError, match="held_out_voice = 'en-us\\+m1' is also in data.voices"):
        renditions(dataclasses.replace(data, held_out_voice="en-us+m1"), "train", 5)


# --- synthesis and the cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """The first N captions of every split, synthesised with espeak-ng at the shipped config's rate."""
    root = tmp_path_factory.mktemp("speech_cache")
    for split in SPLITS:
        spoken_captions(data_config(root), split, limit=N)
    return root


@needs_espeak
def test_splits_are_multi30ks_own_and_the_audio_is_readable_at_the_models_rate(cache):
    data = data_config(cache)
    files = {}
    for split in SPLITS:
        u = spoken_captions(data, split, limit=N)
        assert u.transcripts == [spelling(line) for line in multi30k_lines(FILES[split])[:N]]
        files[split] = set(u.audio)
        for path in u.audio:
            assert path.parent.name == FILES[split] and path.is_relative_to(cache)
            info = soundfile.info(str(path))
            assert (info.samplerate, info.channels, info.subtype) == (data.sample_rate, 1, "PCM_16")
            assert 0.5 < info.duration < 20
            wave = read_audio(path, AudioSettings.of(data))  # the reader training uses: not silent, not cut off
            assert float(np.abs(wave).max()) > 0.05
            assert (data.held_out_voice in path.name) == (split == HELD_OUT)
    for a in SPLITS:
        for b in SPLITS:
            assert a == b or not files[a] & files[b]
    assert not list(cache.rglob("*.tmp"))
    # the held-out voice says the same captions as test, at the same rates and pitches, in another voice
    test = sorted(files["test"])
    held = sorted(files[HELD_OUT])
    assert [p.name.split("-s")[-1] for p in test] == [p.name.split("-s")[-1] for p in held]
    for a, b in zip(test, held):
        x, y = soundfile.read(str(a))[0], soundfile.read(str(b))[0]
        assert x.shape != y.shape or not np.allclose(x, y)


@needs_espeak
def test_synthesis_is_deterministic(cache, tmp_path):
    again = spoken_captions(data_config(tmp_path), "valid", limit=2)
    first = spoken_captions(data_config(cache), "valid", limit=2)
    for a, b in zip(first.audio, again.audio):
        assert a.name == b.name and a.read_bytes() == b.read_bytes()


@needs_espeak
def test_a_second_call_reads_the_cache_without_espeak(cache, monkeypatch):
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*.wav")}
    monkeypatch.setenv("PATH", "")  # no espeak-ng to call
    for split in SPLITS:
        spoken_captions(data_config(cache), split, limit=N)
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*.wav")} == before


@needs_espeak
def test_two_threads_filling_one_cache_agree(tmp_path, cache):
    errors = []

    def fill():
        try:
            spoken_captions(data_config(tmp_path), "test", limit=4, workers=2)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=fill) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    made = sorted((tmp_path / f"multi30k_en_{data_config(tmp_path).sample_rate}hz").rglob("*"))
    assert [p.name for p in made if p.is_file()] == sorted(p.name for p in spoken_captions(
        data_config(tmp_path), "test", limit=4).audio)  # four WAVs, no temporary file left
    for p in spoken_captions(data_config(cache), "test", limit=N).audio:
        assert (tmp_path / p.relative_to(cache)).read_bytes() == p.read_bytes()


@needs_espeak
def test_a_broken_cached_wav_is_kept_and_named(tmp_path):
    data = data_config(tmp_path)
    path = spoken_captions(data, "valid", limit=1).audio[0]
    path.write_bytes(path.read_bytes()[:2000])  # cut off
    assert spoken_captions(data, "valid", limit=1).audio == [path]
    assert len(path.read_bytes()) == 2000  # never written over
    from attnkit.train.speech import utterance_features

    with pytest.raises(AttnkitError) as e:
        utterance_features(spoken_captions(data, "valid", limit=1), AudioSettings.of(data))
    assert str(path) in str(e.value) and "truncated WAV" in str(e.value) and "\n" not in str(e.value)


def test_a_missing_data_directory_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(AttnkitError) as e:
        spoken_captions(data_config(tmp_path), "train", data_dir=str(tmp_path / "nowhere"), limit=2)
    assert str(tmp_path / "nowhere" / "multi30k" / "task1" / "raw" / "train.en.gz") in str(e.value)
    assert "\n" not in str(e.value)


@needs_espeak
def test_an_unknown_voice_is_one_line(tmp_path):
    with pytest.raises(AttnkitError, match="espeak-ng has no voice 'en-us\\+nosuch'"):
        spoken_captions(data_config(tmp_path, voices=("en-us+nosuch",)), "valid", limit=1)


# --- through the command line


def attnkit_train(run: Path, cache: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    small = ["model.listener_size=16", "model.speller_size=32", "model.embedding_size=8", "model.attention_size=16",
             "model.dropout=0.0", f"data.speech_cache={json.dumps(str(cache))}", f"data.max_train_pairs={N}",
             "data.max_valid_pairs=2", "data.freq_masks=0", "data.time_masks=0", "train.max_minutes=0",
             "train.fit_schedule=false", "train.max_steps=4", "train.warmup_steps=1", "train.eval_every=4",
             "train.save_every=4", "train.log_every=1", "train.max_tokens=1000", "train.progress=false",
             "decode.max_caption_len=20"]
    command = [sys.executable, "-m", "attnkit", "train", str(CONFIG), "--run-dir", str(run), "--threads", "1",
               *(x for s in small for x in ("--set", s)), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@needs_espeak
def test_a_tiny_las_trains_on_spoken_multi30k_through_attnkit_train(cache, tmp_path):
    out = attnkit_train(tmp_path / "run", cache)
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_nll"] for r in records if "train_nll" in r]
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert any("valid_cer" in r for r in records)  # validation transcribed the spoken val captions
    import attnkit

    model = attnkit.load(tmp_path / "run")
    chars = json.loads((model.path / "chars.json").read_text())["chars"]  # the training transcripts' characters
    assert chars == sorted(set("".join(spelling(line) for line in multi30k_lines("train")[:N])))
    assert isinstance(model.transcribe(spoken_captions(data_config(cache), "test", limit=1).audio[0]), str)


def test_a_missing_espeak_ng_is_one_line_and_exit_2(tmp_path):
    out = attnkit_train(tmp_path / "run", tmp_path / "empty_cache", env={"PATH": str(tmp_path / "bin")})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "espeak-ng: not found" in lines[0] and "apt-get install espeak-ng" in lines[0]
    assert not (tmp_path / "empty_cache").exists() or not list((tmp_path / "empty_cache").rglob("*.wav"))
