"""POST /v1/transcribe on a real server on loopback: an uploaded clip transcribed as attnkit.load(...).transcribe
does it, with each character's attention; requests batched together answer as alone; bad audio and the limits
answer one documented 4xx; the path is in /openapi.json."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from attnkit.data.speech import digit_strings, fsdd_recordings, split_recordings  # noqa: E402
from serving import LiveServer, one_line_error  # noqa: E402


@pytest.fixture(scope="module")
def speech_model(tmp_path_factory):
    """A tiny LAS (random weights) hearing 8 kHz audio, and FSDD test strings to send it."""
    import attnkit
    from attnkit.checkpoint import model_for, write_checkpoint
    from attnkit.config import ExperimentConfig
    from attnkit.data import CharTokenizer
    from attnkit.models.las import LASConfig

    root = tmp_path_factory.mktemp("speech_serve")
    cfg = ExperimentConfig(name="las", model=LASConfig(listener_size=8, speller_size=16, embedding_size=8,
                                                       attention_size=8, dropout=0.0))
    cfg.data.format, cfg.data.n_mels, cfg.data.max_audio_seconds = "fsdd_digits", 20, 10.0
    cfg.decode.beam_size, cfg.decode.max_caption_len = 1, 12
    toks = CharTokenizer.build("0 1 2 3 4 5 6 7 8 9", root / "chars.json")
    torch.manual_seed(0)
    write_checkpoint(root / "ckpt", model_for(cfg, toks), cfg, [toks.path], {})
    strings = digit_strings(split_recordings(fsdd_recordings(), "test"), 4, seed=0, split="test", max_digits=3)
    return attnkit.load(root / "ckpt"), strings


@pytest.fixture(scope="module")
def live(speech_model):
    server = LiveServer({"las": speech_model[0]}, max_audio_seconds=8.0, max_audio_bytes=200_000)
    yield server
    server.close()


def wav(samples, rate: int = 8000, fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format=fmt)
    return buf.getvalue()


def test_transcribe_an_upload_as_the_python_api_does(live, speech_model):
    model, strings = speech_model
    samples, rate = strings.audio[0]
    r = live.client.post("/v1/transcribe", files={"audio": ("a.flac", wav(samples, fmt="FLAC"), "audio/flac")})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["transcript"] == model.transcribe((samples, rate))
    attention = np.array(a["attention"])
    assert attention.shape == (len(a["characters"]), len(a["frames"]))
    np.testing.assert_allclose(attention.sum(1), 1.0, atol=1e-3)
    assert a["frames"][0][0] == 0.0 and abs(a["seconds"] - len(samples) / rate) < 0.05
    paths = live.client.get("/openapi.json").json()["paths"]
    assert "/v1/transcribe" in paths and "/v1/attention" not in paths


def test_requests_at_once_answer_as_alone(live, speech_model):
    model, strings = speech_model
    expected = model.transcribe(strings.audio)

    def post(i):
        samples, _ = strings.audio[i]
        return live.client.post("/v1/transcribe", data={"attention": "false"},
                                files={"audio": (f"{i}.wav", wav(samples), "audio/wav")}).json()

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(post, range(4)))
    assert [a["transcript"] for a in answers] == expected and all("attention" not in a for a in answers)


@pytest.mark.parametrize("data, status", [
    (b"not a sound at all" * 10, 422),
    (b"", 422),
    (None, 422),  # silent
    ("truncated", 422),
    ("low_rate", 422),
    ("long", 413),
    ("big", 413),
])
def test_bad_audio_is_one_documented_4xx(live, data, status):
    t = np.arange(8000) / 8000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype("float32")
    data = {None: wav(np.zeros(8000, "float32")), "truncated": wav(tone)[:3000],
            "low_rate": wav(tone[::2], rate=4000), "long": wav(np.tile(tone, 9)),
            "big": wav(np.tile(tone, 30))}.get(data, data)
    r = live.client.post("/v1/transcribe", files={"audio": ("x.wav", data, "audio/wav")})
    one_line_error(r, status, "body" if len(data) > live.settings.max_audio_bytes else "audio")  # body: the guard's
    assert str(status) in live.client.get("/openapi.json").json()["paths"]["/v1/transcribe"]["post"]["responses"]


def test_bad_requests(live):
    c = live.client
    one_line_error(c.post("/v1/transcribe", data={"model": "las"}), 400, "body")
    one_line_error(c.post("/v1/transcribe", files={"model": (None, "las")}), 422, "audio")
    one_line_error(c.post("/v1/transcribe", data={"beam": "two"}, files={"audio": ("a.wav", b"x", "audio/wav")}),
                   422, "beam")
    one_line_error(c.post("/v1/transcribe", data={"model": "nope"}, files={"audio": ("a.wav", b"x")}), 404, "model")
