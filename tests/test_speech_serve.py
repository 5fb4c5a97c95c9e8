"""POST /v1/transcribe on a real server on loopback: an uploaded clip transcribed as attnkit.load(...).transcribe
does it, with each character's attention; requests batched together answer as alone; bad audio and the limits
answer one documented 4xx; the path is in /openapi.json. Streaming: the Python API's steps (``on_step``) agree with
its answer, and ``stream=true`` sends them as server-sent events while the search runs, ends with the plain answer,
and a client that leaves mid-stream stops the search."""

from __future__ import annotations

import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import soundfile
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from attnkit.data.speech import digit_strings, fsdd_recordings, split_recordings  # noqa: E402
from attnkit.tokens import EOS  # noqa: E402
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


# --- streaming


@pytest.fixture(scope="module")
def endless(speech_model):
    """The same LAS, loaded again, that never ends a transcript (EOS's logit pushed down): every clip of half a
    second or more is spelled for as long as the model's limit lets it: 11 characters and the end, 12 search
    steps."""
    import attnkit

    model = attnkit.load(speech_model[0].path)
    with torch.no_grad():
        model.module.character_distribution[-1].bias[EOS] = -1e4
    return model


class Gate:
    """Wraps a model's step: from the ``after``-th step on, each step waits until the gate opens (at most 20 s), so
    that what a client receives before it opens was sent while the search was still running."""

    def __init__(self, module, after: int = 3):
        self.module, self.after, self.steps = module, after, 0
        self.open_, self.step = threading.Event(), module.step

        def gated(*args, **kwargs):
            self.steps += 1
            if self.steps >= self.after:
                self.open_.wait(20)
            return self.step(*args, **kwargs)

        module.step = gated

    def open(self):
        self.open_.set()

    def close(self):
        self.open_.set()
        del self.module.step


def test_the_python_api_streams_each_step_of_a_transcription(speech_model, endless):
    """on_step gives every step of each batch (greedy and beam), the best partial transcript agreeing with the
    answer's characters and the step's attention with the answer's row, over each clip's own frames."""
    model, strings = speech_model
    clips = [strings.audio[i] for i in range(3)]
    for m, beam in ((endless, 1), (model, 1), (model, 3)):
        seen = {}

        def on_step(step, batch, seen=seen):
            k = step.scores.size(1)
            for p, row in enumerate(step.sentences.tolist()):
                seen.setdefault(batch[row], []).append((step.history[p * k].tolist(),
                                                        None if step.attention is None else step.attention[p * k]))

        out = m.transcribe(clips, beam=beam, details=True, on_step=on_step)
        assert [t.text[0] for t in out] == m.transcribe(clips, beam=beam)  # watching changes nothing
        assert sorted(seen) == [0, 1, 2]
        for i, t in enumerate(out):
            h = t.hypotheses[0]
            if beam == 1:  # greedy: each step's hypothesis is the answer's prefix, its attention the answer's row
                assert len(seen[i]) == len(h.tokens) + 1
                for step, (history, attention) in enumerate(seen[i]):
                    assert history == (h.tokens + [EOS])[:step + 1]
                    torch.testing.assert_close(attention[:t.memory_frames], h.attention[step])
                    assert float(attention[t.memory_frames:].sum()) == 0.0  # padding frames get no attention
            else:
                assert 1 <= len(seen[i]) <= len(h.tokens) + 1
    assert {len(t.hypotheses[0].tokens) for t in endless.transcribe(clips, details=True)} == {11}


def test_a_streamed_transcription_sends_steps_while_it_runs_then_the_plain_answer(speech_model, endless):
    model, strings = speech_model
    server = LiveServer({"las": endless}, max_audio_seconds=8.0)
    try:
        samples, _ = strings.audio[1]
        upload = {"audio": ("a.wav", wav(samples), "audio/wav")}
        plain = server.client.post("/v1/transcribe", files=upload).json()
        gate = Gate(endless.module)
        try:
            events, first = [], None
            with server.client.stream("POST", "/v1/transcribe", data={"stream": "true"}, files=upload) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                name = None
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        events.append((name, json.loads(line[6:])))
                        if first is None:  # the search waits at its third step: this came while it ran
                            first = (gate.steps, gate.open_.is_set())
                            gate.open()
        finally:
            gate.close()
        assert first[0] <= gate.after and not first[1]  # the search had not passed the gate: it was still running
        steps, (last, done) = events[:-1], events[-1]
        assert last == "done" and done == plain  # the final event is the answer without stream
        assert [name for name, _ in steps] == ["step"] * len(plain["characters"])
        for t, (_, e) in enumerate(steps):
            assert e["step"] == t and e["sentence"] == 0
            assert e["tokens"] == plain["characters"][:t + 1] or (t == len(steps) - 1 and e["done"])
            np.testing.assert_allclose(e["attention"], plain["attention"][t], atol=2e-4)
        assert steps[-1][1]["text"] == plain["transcript"] == endless.transcribe(strings.audio[1])
        # attention=false: the same steps, none carrying attention, as the answer carries none
        with server.client.stream("POST", "/v1/transcribe", data={"stream": "true", "attention": "false"},
                                  files=upload) as r:
            bare = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert [e["tokens"] for e in bare[:-1]] == [e["tokens"] for _, e in steps]
        assert not any("attention" in e for e in bare) and bare[-1]["transcript"] == plain["transcript"]
        document = server.client.get("/openapi.json").json()["paths"]["/v1/transcribe"]["post"]
        assert "text/event-stream" in document["responses"]["200"]["content"]
        form = document["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert form["properties"]["stream"] == {"type": "boolean", "default": False,
                                                "description": form["properties"]["stream"]["description"]}
        one_line_error(server.client.post("/v1/transcribe", data={"stream": "maybe"}, files=upload), 422, "stream")
    finally:
        server.close()


def test_a_client_leaving_a_transcription_stream_stops_its_search(speech_model, endless):
    """The client reads one step, then leaves: its slot is freed at once, its search stops at the next step instead
    of spelling all 11 characters, and the worker answers the next request."""
    _, strings = speech_model
    server = LiveServer({"las": endless}, max_audio_seconds=8.0)
    gate = Gate(endless.module)
    try:
        samples, _ = strings.audio[2]
        upload = {"audio": ("a.wav", wav(samples), "audio/wav")}
        with httpx.Client(base_url=server.url, timeout=30) as other:
            with other.stream("POST", "/v1/transcribe", data={"stream": "true"}, files=upload) as r:
                assert r.status_code == 200
                assert any(line.startswith("data: ") for line in r.iter_lines())
        deadline = time.monotonic() + 5
        while server.client.get("/health").json()["in_flight"]:
            assert time.monotonic() < deadline, "the server did not free the slot of the client that left"
            time.sleep(0.05)
        time.sleep(0.2)
        left = gate.steps
        assert left <= gate.after  # the search stopped at a step after the client left, or waits at the gate
        gate.open()
        start = time.monotonic()
        r = server.client.post("/v1/transcribe", files=upload, data={"attention": "false"}, timeout=10)
        assert r.status_code == 200 and time.monotonic() - start < 5
        assert len(r.json()["characters"]) == 12  # 11 characters and the end: a search takes 12 steps
        # the left search took at most the step it waited in, where it stopped; the answer took 12 (a search that
        # went on would have taken 24 in all)
        assert gate.steps <= left + 1 + 12, (left, gate.steps)
    finally:
        gate.close()
        server.close()
