"""What the server's tests share: tiny models to serve (a character language model that never ends its text, a
Show-Attend-Tell captioner, the fine-tuned classifiers), a real uvicorn server on a free loopback port, and readers
of its answers."""

from __future__ import annotations

import dataclasses
import io
import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn

from attnkit.checkpoint import write_checkpoint
from attnkit.config import PRESETS, ExperimentConfig
from attnkit.models import build_model
from attnkit.models.captioner import ShowAttendTellConfig
from attnkit.models.lm import LMConfig
from attnkit.serve import Settings, create_app
from attnkit.tokens import EOS


def tiny_lm_checkpoint(d: Path) -> Path:
    """A character LM whose texts never end (no EOS): a request runs as long as its limits let it."""
    from attnkit.data import CharTokenizer

    tok = CharTokenizer.build("the quick brown fox jumps over the lazy dog. THE END!\n", d / "chars.json")
    cfg = ExperimentConfig(name="lm_tiny")
    cfg.model = LMConfig(**(PRESETS["lm_tiny"] | dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
                                                        max_positions=64)))
    cfg.data = dataclasses.replace(cfg.data, format="tinyshakespeare", block_size=32)
    torch.manual_seed(0)
    model = build_model(cfg.model, 0, tok.vocab_size)
    with torch.no_grad():  # never EOS: h . e_EOS = -8 * sum(LayerNorm(x) + 1) = -8 d, so a text goes on and on
        model.norm.bias.fill_(1.0)
        model.embed.tokens.weight[EOS] = -8.0
    return write_checkpoint(d / "checkpoint", model, cfg, [d / "chars.json"], {"step": 0})


def tiny_captioner_checkpoint(d: Path) -> Path:
    from attnkit.data import WordVocab
    from attnkit.nn.vision import grid_shape

    vocab = WordVocab.build(["a dog runs on the grass", "a man rides a bike"], d / "vocab.txt", min_count=1)
    cfg = ExperimentConfig(name="sat_tiny")
    channels, h, w = grid_shape("head")
    cfg.model = ShowAttendTellConfig(hidden_size=16, attention_size=16, d_feature=channels, dropout=0.0)
    cfg.data = dataclasses.replace(cfg.data, format="flickr8k", image_grid="head")
    cfg.decode = dataclasses.replace(cfg.decode, beam_size=2, max_caption_len=6)
    torch.manual_seed(0)
    model = build_model(cfg.model, h * w, vocab.vocab_size)
    return write_checkpoint(d / "checkpoint", model, cfg, [d / "vocab.txt"], {"step": 0})


def tiny_answerer_checkpoint(d: Path) -> Path:
    """A visual question answering model (Show, Ask, Attend and Answer, random weights) over 32-pixel images."""
    from attnkit.data.vqa import QuestionVocab, VQAExamples
    from attnkit.models.vqa import ShowAskAttendAnswerConfig

    d.mkdir(parents=True, exist_ok=True)
    questions = ["what color is the shape?", "is there a circle?", "what shape is present?"]
    vocab = QuestionVocab.build(VQAExamples([Path("x.png")] * 3, questions, ["red", "yes", "circle"], ["all"] * 3),
                                d)
    cfg = ExperimentConfig(name="vqa_tiny")
    cfg.model = ShowAskAttendAnswerConfig(cnn_channels=(4, 8), embedding_size=8, hidden_size=8, attention_size=8,
                                          classifier_size=8, dropout=0.0)
    cfg.data = dataclasses.replace(cfg.data, format="easy_vqa", image_size=32)
    torch.manual_seed(0)
    from attnkit.models.vqa import answering_model

    return write_checkpoint(d / "checkpoint", answering_model(cfg, vocab), cfg, vocab.paths, {"step": 0})


def answerers(tmp_path_factory) -> dict:
    """A tiny VQA model, loaded, as "vqa"."""
    import attnkit

    return {"vqa": attnkit.load(tiny_answerer_checkpoint(tmp_path_factory.mktemp("vqa")))}
def tiny_speech_checkpoint(d: Path) -> Path:
    """A tiny LAS (random weights) hearing 8 kHz audio of up to 10 s, its transcripts at most 8 characters."""
    from attnkit.data import CharTokenizer
    from attnkit.models.las import LASConfig

    toks = CharTokenizer.build("0 1 2 3 4 5 6 7 8 9", d / "chars.json")
    cfg = ExperimentConfig(name="las_tiny", model=LASConfig(listener_size=8, speller_size=16, embedding_size=8,
                                                            attention_size=8, dropout=0.0))
    cfg.data = dataclasses.replace(cfg.data, format="fsdd_digits", n_mels=20, max_audio_seconds=10.0)
    cfg.decode = dataclasses.replace(cfg.decode, beam_size=1, max_caption_len=8)
    torch.manual_seed(0)
    return write_checkpoint(d / "checkpoint", build_model(cfg.model, 20, toks.vocab_size), cfg, [toks.path],
                            {"step": 0})


def wav(seconds: float = 0.5, rate: int = 8000, freq: float = 440.0) -> bytes:
    """A sine tone as a WAV file's bytes."""
    import numpy as np
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype("float32"), rate, format="WAV")
    return buf.getvalue()


def classifiers(request) -> dict:
    """tests/conftest.py's fine-tuned classifier (SST-2) and regressor (STS-B pairs), loaded, as "sst" and "sts";
    {} where they cannot be built (no GLUE data, no pretrained BERT), so that a server's other endpoints are still
    tested."""
    import attnkit

    try:
        runs = {"sst": request.getfixturevalue("classifier_run"), "sts": request.getfixturevalue("regressor_run")}
    except pytest.skip.Exception:
        return {}
    return {name: attnkit.load(run) for name, run in runs.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """create_app(models, settings) under uvicorn in a thread, on a free loopback port."""

    def __init__(self, models, **settings):
        self.models = models
        self.settings = Settings(**({"max_wait_ms": 20.0} | settings))
        self.app = create_app(models, self.settings)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def close(self):
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)


def one_line_error(r, status: int, field: str | None = None) -> str:
    """The answer is ``status`` with one line of JSON {"error": "<field>: ..."} and no traceback."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    assert "\n" not in r.text.strip() and "Traceback" not in r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"], str)
    if field is not None:
        assert body["error"].startswith(f"{field}: "), body
    return body["error"]


def sse(response) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a text/event-stream answer."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
    return events


def png(color=(200, 30, 30), size=(40, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def schemathesis(tmp_path: Path) -> tuple[Path, Path]:
    """Schemathesis' ``st`` command beside this Python (the test skips without it) and a config of ``tmp_path`` in
    which 413 counts as rejecting a request (one over a size limit), as the server documents it."""
    st = Path(sys.executable).with_name("st")
    if not st.exists():
        pytest.skip("schemathesis' st command is not installed")
    config = tmp_path / "schemathesis.toml"
    config.write_text('[checks.negative_data_rejection]\nexpected-statuses = ["400", "401", "403", "404", "405", '
                      '"406", "409", "413", "415", "422", "428", "429", "5xx"]\n')
    return st, config
