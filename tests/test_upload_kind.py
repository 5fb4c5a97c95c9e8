"""A new input kind whose inputs are files needs no edit in the server: a kind defined here, outside the package,
declares its upload endpoint and is registered; a real server on loopback then answers that endpoint with the
generic handler (required, empty, unknown, out-of-range and oversized fields refused in one line naming the field,
requests batched), and /openapi.json describes its form and its answer from the same declaration."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from attnkit import registry  # noqa: E402
from attnkit.errors import RequestError  # noqa: E402
from attnkit.kinds import Field, InputKind, Upload, schema  # noqa: E402
from serving import LiveServer, one_line_error  # noqa: E402


class LinesKind(InputKind):
    """A text file, read as its lines: the toy model answers each upload with its lines reversed, ``times`` times."""

    name = "toy_lines"
    title = "text file"
    json_inputs = False
    upload = Upload(
        "/v1/reverse", "reverse", (
            Field("lines", "file", required=True, max_bytes="max_body_bytes", media="text/plain",
                  description="a UTF-8 text file; at most {s.max_body_bytes} bytes"),
            Field("times", "int", default=1, low=1, high=3, key=True),
            Field("title", "text", description="a heading for the answer")),
        "Reversed", schema.obj({"model": schema.STRING, "lines": schema.array(schema.STRING),
                                "title": schema.nullable(schema.STRING), "batch": schema.INTEGER},
                               ["model", "lines", "title", "batch"]),
        "a line reverser")

    def __init__(self):
        self.batches = []
        self.lock = threading.Lock()
        self.gate = None  # an Event the next batch waits for (the others queue meanwhile)

    def read_form(self, model, form: dict, settings) -> dict:
        try:
            text = form["lines"].decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(422, "lines: not UTF-8 text") from None
        return {"input": text.splitlines(), "times": form["times"], "title": form["title"]}

    def upload_tokens(self, model, payload: dict) -> int:
        return len(payload["input"])

    def answer_uploads(self, model, name: str, payloads: list[dict], on_step=None) -> list[dict]:
        with self.lock:
            self.batches.append(len(payloads))
            gate, self.gate = self.gate, None
        if gate is not None:
            gate.wait(60)
        return [{"model": name, "lines": [line[::-1] for line in p["input"]] * p["times"], "title": p["title"],
                 "batch": len(payloads)} for p in payloads]


@pytest.fixture(scope="module")
def live():
    kind = LinesKind()
    patch = pytest.MonkeyPatch()
    patch.setitem(registry._KINDS, kind.name, kind)  # as register_kind(kind) does, undone afterwards
    model = SimpleNamespace(family="toy", capabilities=frozenset({"reverse"}), kind=kind)
    server = LiveServer({"toy": model}, max_body_bytes=4096, max_wait_ms=300.0)
    try:
        yield server, kind
    finally:
        server.close()
        patch.undo()


def test_a_registered_kind_s_upload_is_served_by_the_generic_handler(live):
    server, _ = live
    c = server.client
    r = c.post("/v1/reverse", data={"times": "2", "title": "hi"},
               files={"lines": ("a.txt", b"abc\nxyz\n", "text/plain")})
    assert r.status_code == 200, r.text
    assert r.json() == {"model": "toy", "lines": ["cba", "zyx", "cba", "zyx"], "title": "hi", "batch": 1}
    r = c.post("/v1/reverse", files={"lines": ("a.txt", "é", "text/plain")})
    assert r.json()["lines"] == ["é"] and r.json()["title"] is None  # defaults: times 1, no title
    one_line_error(c.post("/v1/reverse", data={"times": "1"}), 400, "body")  # not multipart
    one_line_error(c.post("/v1/reverse", files={"title": (None, "x")}), 422, "lines")  # no file
    one_line_error(c.post("/v1/reverse", files={"lines": ("a.txt", b"")}), 422, "lines")  # empty
    one_line_error(c.post("/v1/reverse", files={"lines": ("a.txt", b"\xff\xfe")}), 422, "lines")  # the kind's check
    for times in ("0", "4", "two"):
        one_line_error(c.post("/v1/reverse", data={"times": times}, files={"lines": ("a.txt", b"a")}), 422, "times")
    error = one_line_error(c.post("/v1/reverse", data={"beam": "2"}, files={"lines": ("a.txt", b"a")}), 422, "beam")
    assert "unknown field" in error and "lines, times, title, model" in error
    error = one_line_error(c.post("/v1/reverse", files={"lines": ("a.txt", b"a" * 5000)}), 413, "lines")
    assert "limit of 4096" in error
    one_line_error(c.post("/v1/reverse", data={"model": "nope"}, files={"lines": ("a.txt", b"a")}), 404, "model")
    one_line_error(c.post("/v1/translate", json={"sentences": ["a"]}), 422, "model")  # it answers its upload only
    one_line_error(c.get("/v1/reverse"), 405, "method")


def test_requests_to_one_model_with_the_same_key_share_a_batch(live):
    server, kind = live
    kind.batches.clear()

    def post(i):
        return server.client.post("/v1/reverse", data={"times": "1"},
                                  files={"lines": ("a.txt", f"line {i}".encode())}).json()

    # the first batch is held until all four requests are admitted: those it did not take wait in the queue and
    # share the next batch, however long the threads take to start on a busy machine
    kind.gate = gate = threading.Event()
    with ThreadPoolExecutor(4) as pool:
        pending = pool.map(post, range(4))
        deadline = time.monotonic() + 60
        while server.client.get("/health").json()["in_flight"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.set()
        answers = list(pending)
    assert [a["lines"] for a in answers] == [[f"{i} enil"] for i in range(4)]
    assert max(a["batch"] for a in answers) > 1 and sum(kind.batches) == 4


def test_the_document_describes_the_kind_s_form_and_answer(live):
    server, _ = live
    document = server.client.get("/openapi.json").json()
    operation = document["paths"]["/v1/reverse"]["post"]
    body = operation["requestBody"]["content"]["multipart/form-data"]
    form = body["schema"]
    assert form["required"] == ["lines"] and form["additionalProperties"] is False
    assert form["properties"]["lines"] == {"type": "string", "format": "binary",
                                           "description": "a UTF-8 text file; at most 4096 bytes"}
    assert form["properties"]["times"] == {"type": "integer", "minimum": 1, "maximum": 3, "default": 1}
    assert form["properties"]["model"]["enum"] == ["toy", ""] and "stream" not in form["properties"]
    assert body["encoding"] == {"lines": {"contentType": "text/plain"}}
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Reversed"}
    assert document["components"]["schemas"]["Reversed"]["required"] == ["model", "lines", "title", "batch"]
    assert set(document["paths"]) == {"/health", "/v1/models", "/metrics", "/v1/reverse"}
