"""``attnkit serve`` under faults, as hostile or broken clients drive it over real sockets on 127.0.0.1: malformed
and wrongly typed bodies, oversized bodies and images (bytes and pixels), unknown models and paths, clients that
leave mid-stream or before their answer, a client that trickles its body, a burst beyond the queue. Each gets its
status (400, 404, 405, 408, 413, 422, 429) and one line of JSON naming the field, while a well-behaved client
(:class:`Probe`) keeps getting its right answer throughout. Hypothesis then throws arbitrary JSON and bytes at every
endpoint: an answer is 200 or a one-line 4xx, never a 5xx."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnkit.data import generate_dates  # noqa: E402
from serving import LiveServer, answerers, classifiers, one_line_error, png, sse, tiny_speech_checkpoint, wav  # noqa: E402

PROBE_SENTENCE = "12 March 1994"
BODY_TIMEOUT = 2.0


class Probe:
    """A well-behaved client in a thread: one dates translation at a time, all along. Every answer must be 200 and
    equal to offline decoding, whatever the other clients are doing."""

    def __init__(self, url: str, expected: str):
        self.expected, self.answers, self.stopping = expected, [], False
        self.client = httpx.Client(base_url=url, timeout=60)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopping:
            try:
                r = self.client.post("/v1/translate", json={"model": "dates", "sentences": [PROBE_SENTENCE]})
                self.answers.append((r.status_code, r.json().get("translations", [r.text])[0]))
            except httpx.HTTPError as e:
                self.answers.append((None, repr(e)))
            time.sleep(0.02)

    def served_since(self, start: int, at_least: int = 2, within: float = 30.0) -> list:
        deadline = time.monotonic() + within
        while len(self.answers) < start + at_least:
            assert time.monotonic() < deadline, "the well-behaved client was not answered meanwhile"
            time.sleep(0.02)
        return self.answers[start:]

    def stop(self):
        self.stopping = True
        self.thread.join(timeout=60)
        self.client.close()


@pytest.fixture(scope="module")
def live(served_models, request, tmp_path_factory):
    import attnkit

    speech = {"las": attnkit.load(tiny_speech_checkpoint(tmp_path_factory.mktemp("las")))}
    server = LiveServer({**served_models, **classifiers(request), **answerers(tmp_path_factory), **speech},
                        max_image_bytes=200_000,
                        max_image_pixels=1_000_000, body_timeout=BODY_TIMEOUT, max_new_tokens=10**6, timeout=20.0)
    server.probe = Probe(server.url, served_models["dates"].translate([PROBE_SENTENCE])[0])
    yield server
    server.probe.stop()
    server.close()


@pytest.fixture(autouse=True)
def others_are_served(request):
    """Around every test on the shared server: the probe was answered, rightly, while the test ran."""
    if "live" not in request.fixturenames:
        yield
        return
    live = request.getfixturevalue("live")
    start = len(live.probe.answers)
    yield
    for status, text in live.probe.served_since(start):
        assert (status, text) == (200, live.probe.expected)


# --- raw HTTP: what a client library would not send


def raw_request(url: str, data: bytes, pieces: int = 1, gap: float = 0.0, wait: float = 30.0):
    """Send ``data`` over a fresh connection (in ``pieces``, ``gap`` seconds apart) -> (status, headers, body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        step = max(1, -(-len(data) // pieces))
        for i in range(0, len(data), step):
            s.sendall(data[i:i + step])
            if gap and i + step < len(data):
                time.sleep(gap)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = s.recv(65536)
            assert chunk, f"the server closed the connection without an answer: {received!r}"
            received += chunk
        head, body = received.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split()[1]), headers, body


def post_bytes(path: str, body: bytes, length: int | None = None, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n").encode() + body


def one_line(status: int, headers: dict, body: bytes, field: str | None = None) -> str:
    assert headers.get("content-type", "").startswith("application/json"), (status, headers, body)
    text = body.decode()
    assert "\n" not in text.strip() and "Traceback" not in text
    error = json.loads(text)["error"]
    if field is not None:
        assert error.startswith(f"{field}: "), error
    return error


def png_declaring(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header declares width x height pixels (1-bit grey), with no pixel data:
    the kind of file that asks a decoder for gigabytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def noise_png(side: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


# --- each fault, its status and its one line

BAD_JSON = [  # (endpoint, raw body, status, field)
    ("/v1/translate", b"{not json", 400, "body"),
    ("/v1/translate", b"", 400, "body"),
    ("/v1/translate", b'{"sentences": ["\xff\xfe"]}', 400, "body"),  # not UTF-8
    ("/v1/translate", b"null", 400, "body"),
    ("/v1/translate", b"[1, 2]", 400, "body"),
    ("/v1/translate", b'"a string"', 400, "body"),
    ("/v1/translate", b"[" * 100_000 + b"]" * 100_000, 400, "body"),  # nesting past any parser's recursion
    ("/v1/translate", b'{"sentences": ["a"], "beam": NaN}', 422, "beam"),
    ("/v1/generate", b'{"model": "lm", "temperature": Infinity}', 422, "temperature"),
    ("/v1/generate", b'{"model": "lm", "prompt": "a", "prompt": 5}', 422, "prompt"),  # the last key counts
]

WRONG_FIELDS = [  # (endpoint, JSON body, status, field)
    ("/v1/translate", {"sentences": "one sentence"}, 422, "sentences"),
    ("/v1/translate", {"sentences": []}, 422, "sentences"),
    ("/v1/translate", {"sentences": [None]}, 422, "sentences[0]"),
    ("/v1/translate", {"sentences": ["a"], "beam": 1.5}, 422, "beam"),
    ("/v1/translate", {"sentences": ["a"], "beam": True}, 422, "beam"),
    ("/v1/translate", {"sentences": ["a"], "beam": 10**30}, 422, "beam"),
    ("/v1/translate", {"sentences": ["a"], "len_penalty": -1}, 422, "len_penalty"),
    ("/v1/translate", {"sentences": ["a"], "stream": "yes"}, 422, "stream"),
    ("/v1/translate", {"sentences": ["a"], "model": 5}, 422, "model"),
    ("/v1/translate", {"sentences": ["a"], "model": "../../etc/passwd"}, 404, "model"),
    ("/v1/translate", {"sentences": ["a"], "model": "lm"}, 422, "model"),
    ("/v1/generate", {"model": "lm", "temperature": -1}, 422, "temperature"),
    ("/v1/generate", {"model": "lm", "top_p": 0}, 422, "top_p"),
    ("/v1/generate", {"model": "lm", "seed": -1}, 422, "seed"),
    ("/v1/generate", {"model": "lm", "top": 51}, 422, "top"),
    ("/v1/generate", {"model": "lm", "max_tokens": 10**7}, 413, "max_tokens"),
    ("/v1/generate", {"model": "lm", "prompt": "x" * 200}, 413, "prompt"),
    ("/v1/attention", {"model": "dates", "source": "1 May 2001", "mask_heads": [["cross", 99, 0]]}, 422,
     "mask_heads[0]"),
    ("/v1/attention", {"model": "dates", "source": "1 May 2001", "mask_heads": [["sideways", 0, 0]]}, 422,
     "mask_heads[0]"),
    ("/v1/attention", {"model": "dates", "source": "1 May 2001", "mask_source": [999]}, 422, "mask_source"),
    ("/v1/attention", {"model": "dates"}, 422, "source"),
    ("/v1/attention", {"model": "sat", "image": "***not base64***"}, 422, "image"),
    ("/v1/attention", {"model": "sat", "image": base64.b64encode(b"GIF89a not really").decode()}, 422, "image"),
    ("/v1/score", {"model": "dates", "sources": ["a"], "targets": ["a", "b"]}, 422, "targets"),
    ("/v1/score", {"model": "dates", "targets": ["a"]}, 422, "sources"),
    ("/v1/positional", {"model": "dates", "positions": 0}, 422, "positions"),
    ("/v1/positional", {"model": "dates", "side": "middle"}, 422, "side"),
    ("/v1/classify", {"model": "dates", "sentences": ["a"]}, 422, "model"),
    ("/v1/classify", {"model": "nope", "sentences": ["a"]}, 404, "model"),
    ("/v1/classify", {"sentences": []}, 422, "sentences"),
    ("/v1/classify", {"sentences": ["a"], "explain": 1}, 422, "explain"),
]

CLASSIFY_FIELDS = [  # (JSON body, status, field), to the classifier "sst" and the pair regressor "sts"
    ({"model": "sst", "sentences": ["a", "b"], "explain": True}, 422, "explain"),
    ({"model": "sst", "sentences": ["a"], "pairs": ["b"]}, 422, "pairs"),
    ({"model": "sst", "sentences": ["\t\n "]}, 422, "sentences[0]"),
    ({"model": "sst", "sentences": ["a"] * 65}, 413, "sentences"),
    ({"model": "sst", "sentences": ["a b " * 100]}, 413, "sentences[0]"),
    ({"model": "sst", "sentences": ["a"], "pairs": None, "extra": 1}, 422, "extra"),
    ({"model": "sts", "sentences": ["a"]}, 422, "pairs"),
    ({"model": "sts", "sentences": ["a"], "pairs": []}, 422, "pairs"),
    ({"model": "sts", "sentences": ["a"], "pairs": [None]}, 422, "pairs[0]"),
    ({"model": "sts", "sentences": ["a b " * 40], "pairs": ["a b " * 40]}, 413, "sentences[0]"),
]


@pytest.mark.parametrize("endpoint,body,status,field", BAD_JSON,
                         ids=[f"{e}-{b[:12]!r}" for e, b, *_ in BAD_JSON])
def test_malformed_json_is_one_line(live, endpoint, body, status, field):
    one_line_error(live.client.post(endpoint, content=body, headers={"content-type": "application/json"}),
                   status, field)


@pytest.mark.parametrize("endpoint,body,status,field", WRONG_FIELDS,
                         ids=[f"{e}-{field}-{i}" for i, (e, _, _, field) in enumerate(WRONG_FIELDS)])
def test_wrong_types_values_and_models_are_one_line_naming_the_field(live, endpoint, body, status, field):
    one_line_error(live.client.post(endpoint, json=body), status, field)


@pytest.mark.parametrize("body,status,field", CLASSIFY_FIELDS,
                         ids=[f"{b['model']}-{field}-{i}" for i, (b, _, field) in enumerate(CLASSIFY_FIELDS)])
def test_wrong_classify_requests_are_one_line_naming_the_field(live, body, status, field):
    if "sst" not in live.models:
        pytest.skip("no classifier to serve (tests/conftest.py's classifier_run)")
    one_line_error(live.client.post("/v1/classify", json=body), status, field)


def test_wrong_methods_paths_and_content_types(live):
    c = live.client
    one_line_error(c.get("/v1/translate"), 405, "method")
    one_line_error(c.get("/v1/classify"), 405, "method")
    one_line_error(c.delete("/v1/models"), 405, "method")
    one_line_error(c.get("/v1/nothing"), 404, "path")
    error = one_line_error(c.post("/v1/translate", content=b'{"sentences": ["a"]}',
                                  headers={"content-type": "text/plain"}), 400, "body")
    assert "application/json" in error
    one_line_error(c.post("/v1/caption", json={"image": "x"}), 400, "body")
    # a request line HTTP itself cannot parse is refused below the app, still without a 5xx
    status, _, _ = raw_request(live.url, b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n")
    assert status == 400


def test_oversized_bodies_and_images(live):
    c = live.client
    one_line_error(c.post("/v1/translate", json={"sentences": ["x" * (2 << 20)]}), 413, "body")
    # declared too large: answered before a byte of the body is read
    status, headers, body = raw_request(live.url, post_bytes("/v1/translate", b"{", length=1 << 30))
    assert status == 413 and "limit" in one_line(status, headers, body, "body")

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"sentences": ["'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"]}'

    one_line_error(c.post("/v1/translate", content=chunks(), headers={"content-type": "application/json"}), 413,
                   "body")
    one_line_error(c.post("/v1/translate", json={"sentences": ["a"] * 65}), 413, "sentences")
    one_line_error(c.post("/v1/translate", json={"sentences": ["1 May 2001 " * 40]}), 413, "sentences[0]")

    big = noise_png(300)
    assert len(big) > 200_000
    one_line_error(c.post("/v1/caption", data={"model": "sat"}, files={"image": ("big.png", big, "image/png")}),
                   413, "body")
    for declared in ((5000, 5000), (100_000, 100_000)):  # ours, then past PIL's own bomb limit too
        bomb = png_declaring(*declared)
        assert len(bomb) < 100
        one_line_error(c.post("/v1/caption", data={"model": "sat"}, files={"image": ("b.png", bomb, "image/png")}),
                       413, "image")
        one_line_error(c.post("/v1/attention", json={"model": "sat", "image": base64.b64encode(bomb).decode()}),
                       413, "image")
    one_line_error(c.post("/v1/attention", json={"model": "sat", "image": base64.b64encode(big).decode()}), 413)
    # within every limit, the same server captions
    assert c.post("/v1/caption", data={"model": "sat"}, files={"image": ("ok.png", png(), "image/png")}
                  ).status_code == 200


def test_answer_faults_are_one_line_and_answers_are_batched_as_the_api_answers(live):
    """/v1/answer: not an image, an empty or missing question, an image past the limits are one-line 4xx naming
    the field; a word never seen is answered, and said so; concurrent requests answer as Model.answer does."""
    c, model = live.client, live.models["vqa"]
    post = lambda image, **fields: c.post("/v1/answer", data={"model": "vqa", **fields},  # noqa: E731
                                          files={"image": ("x.png", image, "image/png")})
    one_line_error(post(b"not an image at all", question="what color?"), 422, "image")
    one_line_error(post(png(), question="   "), 422, "question")
    one_line_error(post(png()), 422, "question")
    one_line_error(post(b"", question="what color?"), 422, "image")
    one_line_error(post(png_declaring(5000, 5000), question="what color?"), 413, "image")
    one_line_error(post(noise_png(300), question="what color?"), 413, "body")
    one_line_error(post(png(), question="what color?", beam="2"), 422, "beam")
    one_line_error(c.post("/v1/answer", data={"model": "sat", "question": "what color?"},
                          files={"image": ("x.png", png(), "image/png")}), 422, "model")
    described = next(m for m in c.get("/v1/models").json()["models"] if m["name"] == "vqa")
    assert described["decode"] is None and described["answers"] == list(model.tokenizers.answers)
    assert described["glimpses"] == 2 and described["grid"] == model.kind.grid(model)
    unknown = post(png(), question="what colour is the blob?")
    assert unknown.status_code == 200 and unknown.json()["unknown_words"] == ["colour", "blob"]
    from concurrent.futures import ThreadPoolExecutor

    images = [png(color) for color in ((200, 30, 30), (30, 200, 30), (30, 30, 200), (90, 90, 90))]
    questions = ["what color is the shape?", "is there a circle?", "what shape is present?", "is there a red shape?"]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda iq: post(iq[0], question=iq[1]).json(), zip(images, questions)))
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, data in enumerate(images):
            paths.append(Path(tmp) / f"{i}.png")
            paths[-1].write_bytes(data)
        expected = model.answer(paths, questions)
    for got, want in zip(answers, expected):
        assert got["answer"] == want.answer and abs(got["probability"] - want.probability) < 1e-3
        assert len(got["glimpses"]) == model.config.model.glimpses and got["grid"] == model.kind.grid(model)


def test_a_trickled_body_is_read_within_the_body_timeout_and_refused_past_it(live, served_models):
    body = json.dumps({"model": "dates", "sentences": ["4 July 1976"]}).encode()
    start = time.monotonic()
    status, headers, answer = raw_request(live.url, post_bytes("/v1/translate", body), pieces=len(body) // 2,
                                          gap=BODY_TIMEOUT / 2 / (len(body) // 2))  # byte pairs over half the time
    assert status == 200, answer
    assert json.loads(answer)["translations"] == served_models["dates"].translate(["4 July 1976"])
    assert time.monotonic() - start >= BODY_TIMEOUT / 2 - 0.1

    with socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])), timeout=30) as s:
        s.sendall(post_bytes("/v1/translate", body[:10], length=len(body)))  # then nothing more
        start = time.monotonic()
        received = b""
        while b"}" not in received:
            chunk = s.recv(65536)
            assert chunk, received
            received += chunk
        waited = time.monotonic() - start
    head, answer = received.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 408"), head
    assert "within" in one_line(408, {"content-type": "application/json"}, answer, "body")
    assert BODY_TIMEOUT - 0.5 <= waited <= BODY_TIMEOUT + 3


def _health(live) -> dict:
    return live.client.get("/health").json()


def _count(live, endpoint: str, status: int) -> float:
    for line in live.client.get("/metrics").text.splitlines():
        if line.startswith(f'attnkit_requests_total{{endpoint="{endpoint}",status="{status}"}}'):
            return float(line.split()[1])
    return 0.0


def test_a_client_leaving_before_its_answer_frees_its_slot_and_stops_its_decoding(live):
    """Decoding a million tokens would hold the worker past the server's 20 s time limit; the client leaves after
    a moment, and within seconds its slot is free and the worker answers others."""
    before = _count(live, "/v1/generate", 499)
    body = json.dumps({"model": "lm", "prompt": "the", "max_tokens": 10**6, "seed": 3}).encode()
    s = socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
    s.sendall(post_bytes("/v1/generate", body))
    time.sleep(1.0)  # the generation is under way (the worker runs it)
    s.close()
    deadline = time.monotonic() + 5
    while _count(live, "/v1/generate", 499) < before + 1:
        assert time.monotonic() < deadline, "the server did not notice its client leave"
        time.sleep(0.05)
    start = time.monotonic()
    r = live.client.post("/v1/translate", json={"model": "dates", "sentences": ["1 May 2001"]}, timeout=10)
    assert r.status_code == 200 and time.monotonic() - start < 5  # the abandoned generation no longer runs
    assert _health(live)["in_flight"] <= 1  # at most the probe's


def test_a_client_leaving_a_stream_mid_way(live):
    body = {"model": "lm", "prompt": "the", "max_tokens": 10**6, "seed": 4, "stream": True}
    with httpx.Client(base_url=live.url, timeout=30) as other:
        with other.stream("POST", "/v1/generate", json=body) as r:
            assert r.status_code == 200
            assert any(line.startswith("data: ") for line in r.iter_lines())
    start = time.monotonic()
    assert live.client.post("/v1/translate", json={"model": "dates", "sentences": ["1 May 2001"]},
                            timeout=10).status_code == 200
    assert time.monotonic() - start < 5
    with live.client.stream("POST", "/v1/translate", json={"model": "dates", "sentences": ["2 May 2001"],
                                                           "stream": True}) as r:
        events = sse(r)
    assert events[-1][0] == "done"


def test_no_request_reaches_a_path_outside_the_explorer(live, tmp_path, monkeypatch):
    package = Path(__import__("attnkit").__file__).parent
    secret = (package / "serve" / "app.py").read_text()[:200]
    for path in ["/../serve/app.py", "/%2e%2e/serve/app.py", "/js/..%2f..%2fapp.py", "/../../../../etc/passwd",
                 "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/docs-assets/../../../../etc/passwd", "//etc/passwd",
                 "/static/../../app.py", "/index.html/../../app.py", "/..%5c..%5capp.py"]:
        status, headers, body = raw_request(live.url, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                            .encode())
        assert status in (400, 404), (path, status)
        assert b"root:" not in body and secret.encode() not in body, path
        if status == 404:
            one_line(status, headers, body, "path")
    # images are read from the request's bytes through a temporary file that is removed; the server runs in
    # this process, so a temporary directory of the test's own keeps other workers' uploads out of the count
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert live.client.post("/v1/caption", data={"model": "sat"}, files={"image": ("../../x.png", png())}
                            ).status_code == 200
    assert list(tmp_path.iterdir()) == []


def test_a_burst_beyond_the_queue_is_429_while_the_admitted_are_answered(served_models):
    server = LiveServer(served_models, queue_size=4, max_wait_ms=20.0)
    try:
        sentences = generate_dates(40, seed=5).src
        expected = dict(zip(sentences, served_models["dates"].translate(sentences)))
        clients = [httpx.Client(base_url=server.url, timeout=30) for _ in sentences]
        for c in clients:  # connections open before the burst, so its requests arrive together
            assert c.get("/health").status_code == 200
        statuses: list[int] = []
        for _ in range(5):
            barrier = threading.Barrier(len(sentences))

            def send(i, barrier=barrier):
                barrier.wait()
                r = clients[i].post("/v1/translate", json={"sentences": [sentences[i]]})
                if r.status_code == 200:
                    assert r.json()["translations"] == [expected[sentences[i]]]
                else:
                    one_line_error(r, 429, "queue")
                    assert int(r.headers["retry-after"]) >= 1
                return r.status_code

            with ThreadPoolExecutor(len(sentences)) as pool:
                statuses += list(pool.map(send, range(len(sentences))))
            if 429 in statuses:
                break
        assert set(statuses) <= {200, 429} and 429 in statuses and statuses.count(200) >= 4
        for c in clients:
            c.close()
        assert server.client.get("/health").json()["in_flight"] == 0
        assert server.client.post("/v1/translate", json={"sentences": ["1 May 2001"]}).status_code == 200
        assert 'status="5' not in server.client.get("/metrics").text
    finally:
        server.close()


# --- property-based: any payload is answered 200 or with one line of 4xx

PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
texts = st.text(max_size=40)


def mostly(valid, invalid):
    """Four times in five a value in range, else one out of it."""
    return st.one_of(valid, valid, valid, valid, invalid)


counts = mostly(st.integers(1, 6), st.integers(-3, 0) | st.integers(17, 10**9))  # beam, n_best (max_beam 16)
temperatures = mostly(st.floats(0, 3) | st.just(0.0), st.floats(-3, -1e-9) | st.floats(101, 1e9))
probabilities = mostly(st.floats(1e-6, 1) | st.just(1.0), st.floats(-1, 0) | st.floats(1.001, 5))


def request(required: dict, optional: dict):
    """Bodies of the right shape (some values out of range), and the same with one field of any JSON value."""
    return spoiled(st.fixed_dictionaries(required, optional=optional))


def spoiled(typed):
    """``typed`` bodies, and the same with one field (or an extra one) of any JSON value."""
    def spoil(body, data):
        key = data.draw(st.sampled_from(sorted(set(body) | {"model", "extra"})))
        return {**body, key: data.draw(json_values)}

    return st.one_of(typed, typed, st.tuples(typed, st.data()).map(lambda t: spoil(*t)))


def model(*names):
    """Mostly a model that can answer; sometimes an unknown one or none (the default: the dates model)."""
    return st.sampled_from([*names, *names, *names, "nope", None])


pairs = st.lists(st.tuples(texts, texts), min_size=1, max_size=3)
words = texts.filter(str.strip)  # not blank
PAYLOADS = {
    "/v1/translate": request({"sentences": st.lists(texts, min_size=1, max_size=3)}, dict(
        model=model("dates"), beam=counts, len_penalty=mostly(st.floats(0, 2), st.floats(-2, -0.1)),
        n_best=counts, attention=st.booleans(), stream=st.booleans())),
    "/v1/generate": request({"model": model("lm")}, dict(
        prompt=texts, max_tokens=mostly(st.integers(0, 30), st.integers(-3, -1)), temperature=temperatures,
        top_k=mostly(st.integers(0, 30), st.integers(-3, -1)), top_p=probabilities,
        seed=mostly(st.integers(0, 2**63 - 1), st.integers(-3, -1) | st.integers(2**63, 2**70)),
        stream=st.booleans(), attention=st.booleans(), top=mostly(st.integers(0, 5), st.integers(51, 99)))),
    "/v1/attention": st.one_of(
        request({"model": model("dates", "lm"), "source": texts}, dict(
            target=texts | st.none(), precision=mostly(st.integers(1, 8), st.integers(-1, 0)),
            mask_heads=st.lists(st.tuples(st.sampled_from(["encoder", "decoder", "cross", "x"]), st.integers(-1, 2),
                                          st.integers(-1, 4)).map(list), max_size=3),
            mask_source=st.lists(mostly(st.integers(0, 8), st.integers(-2, 200)), max_size=3))),
        request({"model": st.just("sat"), "image": mostly(st.just(base64.b64encode(png()).decode()), texts)}, dict(
            mask_source=st.lists(st.integers(-2, 60), max_size=3), target=st.sampled_from(["a dog", "zebra"])))),
    "/v1/score": st.one_of(
        spoiled(st.tuples(model("dates"), pairs).map(
            lambda t: {"model": t[0], "sources": [x for x, _ in t[1]], "targets": [y for _, y in t[1]]})),
        request({"model": model("lm"), "targets": st.lists(texts, min_size=1, max_size=3)}, {})),
    "/v1/positional": request({"model": model("dates")}, dict(positions=mostly(st.integers(1, 128),
                                                                                st.integers(-2, 3000)),
                                                              side=st.sampled_from(["source", "target", "up"]))),
    "/v1/classify": st.one_of(
        request({"model": model("sst"), "sentences": st.lists(texts, min_size=1, max_size=3)}, dict(
            pairs=st.none() | st.lists(texts, max_size=3), explain=st.booleans())),
        spoiled(st.tuples(model("sts"), pairs, st.booleans()).map(
            lambda t: {"model": t[0], "sentences": [x for x, _ in t[1]], "pairs": [y for _, y in t[1]],
                       "explain": t[2]}))),
}


def answered_sanely(r: httpx.Response) -> None:
    event(f"status {r.status_code}")
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/event-stream"):
            events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
            assert events and events[-1] in ("done", "error"), r.text[-300:]
            if events[-1] == "error":
                last = json.loads(r.text.strip().splitlines()[-1][6:])
                assert last["status"] < 500 and "\n" not in last["error"]
        else:
            r.json()
    else:
        one_line_error(r, r.status_code)


@pytest.mark.parametrize("endpoint", sorted(PAYLOADS))
def test_any_payload_is_answered_or_refused_in_one_line(live, endpoint):
    @PROPERTY
    @given(body=PAYLOADS[endpoint] | json_values)
    def check(body):
        answered_sanely(live.client.post(endpoint, json=body))

    check()


def with_n_best(body: dict):
    return st.integers(1, body.get("beam", 1)).map(lambda n: {**body, "n_best": n})


IN_RANGE = {
    "/v1/translate": st.fixed_dictionaries({"sentences": st.lists(texts, min_size=1, max_size=3)}, optional=dict(
        model=st.just("dates"), beam=st.integers(1, 5), len_penalty=st.floats(0, 2), attention=st.booleans(),
        stream=st.booleans())).flatmap(with_n_best),
    "/v1/generate": st.fixed_dictionaries({"model": st.just("lm")}, optional=dict(
        prompt=texts, max_tokens=st.integers(0, 30), temperature=st.floats(0, 3), top_k=st.integers(0, 30),
        top_p=st.floats(1e-6, 1), seed=st.integers(0, 2**63 - 1), stream=st.booleans(), attention=st.booleans(),
        top=st.integers(0, 5))),
    "/v1/score": st.one_of(
        pairs.map(lambda ps: {"model": "dates", "sources": [x for x, _ in ps], "targets": [y for _, y in ps]}),
        st.lists(texts, min_size=1, max_size=3).map(lambda ts: {"model": "lm", "targets": ts})),
    "/v1/positional": st.fixed_dictionaries({"model": st.just("dates")}, optional=dict(
        positions=st.integers(1, 128), side=st.sampled_from(["source", "target"]))),
    "/v1/classify": st.one_of(
        st.lists(words, min_size=1, max_size=3).map(lambda ts: {"sentences": ts}),
        words.map(lambda t: {"model": "sst", "sentences": [t], "explain": True}),
        st.tuples(st.lists(st.tuples(words, words), min_size=1, max_size=3), st.booleans()).map(
            lambda t: {"model": "sts", "sentences": [x for x, _ in t[0]], "pairs": [y for _, y in t[0]],
                       "explain": t[1] and len(t[0]) == 1})),
}


@pytest.mark.parametrize("endpoint", sorted(IN_RANGE))
def test_any_request_in_range_is_answered(live, endpoint):
    """Any text (any Unicode: characters the tokenizer never saw included) with options in their ranges: 200."""
    if endpoint == "/v1/classify" and "sst" not in live.models:
        pytest.skip("no classifier to serve (tests/conftest.py's classifier_run)")

    @PROPERTY
    @given(body=IN_RANGE[endpoint])
    def check(body):
        r = live.client.post(endpoint, json=body)
        assert r.status_code == 200, (body, r.text)
        answered_sanely(r)
        assert r.headers["content-type"].startswith("application/json") or "event: done" in r.text, r.text[-300:]

    check()


def test_any_bytes_are_refused_in_one_line(live):
    @PROPERTY
    @given(body=st.binary(max_size=64), endpoint=st.sampled_from(sorted(PAYLOADS) + ["/v1/caption", "/v1/transcribe"]),
           content_type=st.sampled_from(["application/json", "multipart/form-data; boundary=x", "text/plain", ""]))
    def check(body, endpoint, content_type):
        r = live.client.post(endpoint, content=body, headers={"content-type": content_type} if content_type else {})
        assert 400 <= r.status_code < 500, (r.status_code, r.text)
        one_line_error(r, r.status_code)

    check()


def test_any_caption_form_is_answered_or_refused_in_one_line(live):
    @PROPERTY
    @given(image=st.sampled_from([png(), png_declaring(4000, 4000), b"", b"GIF89a"]) | st.binary(max_size=40),
           fields=st.dictionaries(st.sampled_from(["model", "beam", "attention", "other"]),
                                  st.text(max_size=8) | st.sampled_from(["sat", "dates", "2", "true"]), max_size=3),
           with_image=st.booleans())
    def check(image, fields, with_image):
        files = {"image": ("x.png", image, "image/png")} if with_image else None
        answered_sanely(live.client.post("/v1/caption", data=fields, files=files))

    check()


def test_any_transcribe_form_is_answered_or_refused_in_one_line(live):
    @PROPERTY
    @given(audio=st.sampled_from([wav(), wav(rate=16000), wav(rate=4000), wav(seconds=12.0), wav()[:2000],
                                  wav(freq=0.0), b"", b"RIFF"]) | st.binary(max_size=40),
           fields=st.dictionaries(st.sampled_from(["model", "beam", "attention", "other"]),
                                  st.text(max_size=8) | st.sampled_from(["las", "sat", "2", "true"]), max_size=3),
           with_audio=st.booleans())
    def check(audio, fields, with_audio):
        files = {"audio": ("x.wav", audio, "audio/wav")} if with_audio else None
        answered_sanely(live.client.post("/v1/transcribe", data=fields, files=files))

    check()
