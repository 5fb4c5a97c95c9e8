"""``attnkit serve`` as a client sees it: a real uvicorn server on 127.0.0.1 (a random free port), driven over HTTP
with httpx. Every endpoint, streaming, outputs equal to offline decoding, cross-request batching, the limits
(413, 429 with Retry-After, 504), one-line JSON errors naming the field, the API key, a client that leaves a
stream mid-way freeing its slot, and the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from attnkit.data import generate_dates  # noqa: E402
from serving import LiveServer, free_port, one_line_error, png, sse  # noqa: E402

SENTENCES = generate_dates(8, seed=21).src


@pytest.fixture(scope="module")
def models(served_models):
    return served_models


@pytest.fixture(scope="module")
def live(models):
    server = LiveServer(models)
    yield server
    server.close()


# --- discovery, health, metrics, docs


def test_health_models_docs_metrics_and_the_page(live):
    c = live.client
    health = c.get("/health").json()
    assert health["status"] == "ok" and health["models"] == ["dates", "lm", "sat"] and health["in_flight"] == 0
    models = {m["name"]: m for m in c.get("/v1/models").json()["models"]}
    assert models["dates"]["default"] and not models["lm"]["default"]
    assert models["dates"]["family"] == "transformer" and "translate" in models["dates"]["capabilities"]
    assert models["dates"]["attention"] == {k: {"layers": 2, "heads": 4} for k in ("encoder", "decoder", "cross")}
    assert models["lm"]["family"] == "transformer_lm" and models["lm"]["attention"]["cross"]["layers"] == 0
    assert models["sat"]["grid"] == [7, 7] and models["sat"]["attention"]["cross"] == {"layers": 1, "heads": 1}
    docs = c.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    paths = c.get("/openapi.json").json()["paths"]
    assert {"/v1/translate", "/v1/generate", "/v1/caption", "/v1/attention", "/v1/score", "/v1/models",
            "/health", "/metrics"} <= set(paths)
    page = c.get("/")
    assert page.status_code == 200 and "html" in page.headers["content-type"]
    c.post("/v1/translate", json={"sentences": SENTENCES[:1]})
    metrics = c.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'attnkit_requests_total{endpoint="/v1/translate",status="200"}' in text
    for name in ("attnkit_request_seconds_bucket", "attnkit_batch_sentences_bucket", "attnkit_queue_depth",
                 "attnkit_in_flight", "process_resident_memory_bytes"):
        assert name in text


# --- translation: equal to offline, batched across requests, streamed


def test_translate_equals_offline_decoding(live, models):
    model = models["dates"]
    for beam in (None, 1):
        r = live.client.post("/v1/translate", json={"sentences": SENTENCES, **({"beam": beam} if beam else {})})
        assert r.status_code == 200, r.text
        offline = model.translate(SENTENCES, beam=beam, details=True)
        assert r.json()["translations"] == [t.text[0] for t in offline]
        assert r.json()["scores"] == pytest.approx([t.hypotheses[0].score for t in offline], abs=1e-5)
    r = live.client.post("/v1/translate", json={"sentences": SENTENCES[:2], "beam": 4, "n_best": 3, "len_penalty": 0.5,
                                               "attention": True}).json()
    offline = model.translate(SENTENCES[:2], beam=4, n_best=3, len_penalty=0.5, details=True)
    assert [[h["text"] for h in hyps] for hyps in r["hypotheses"]] == [t.text for t in offline]
    for att, t in zip(r["attention"], offline):
        source = model.tokenizers.src.pieces(t.source) + ["</s>"]
        assert att["source"] == source and len(att["target"]) == len(t.hypotheses[0].tokens) + 1
        weights = torch.tensor(att["weights"])
        assert weights.shape == (len(att["target"]), len(source))
        torch.testing.assert_close(weights.sum(-1), torch.ones(len(att["target"])), atol=2e-3, rtol=0)


def test_concurrent_requests_share_a_batch_and_equal_offline(live, models):
    before = _batch_stats(live)
    with ThreadPoolExecutor(len(SENTENCES)) as pool:
        answers = list(pool.map(lambda s: live.client.post("/v1/translate", json={"sentences": [s]}), SENTENCES))
    assert all(a.status_code == 200 for a in answers)
    assert [a.json()["translations"][0] for a in answers] == models["dates"].translate(SENTENCES)
    after = _batch_stats(live)
    batches, sentences = after[0] - before[0], after[1] - before[1]
    assert sentences == len(SENTENCES) and batches < len(SENTENCES), (batches, sentences)  # some shared a batch


def test_only_requests_with_the_same_options_share_a_batch(live, models):
    options = [{}, {"beam": 1}, {"beam": 2, "len_penalty": 0.0}, {"attention": True}]
    jobs = [(s, options[i % len(options)]) for i, s in enumerate(SENTENCES)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: live.client.post("/v1/translate", json={"sentences": [job[0]], **job[1]}),
                                jobs))
    for (sentence, o), a in zip(jobs, answers):
        assert a.status_code == 200
        offline = models["dates"].translate(sentence, beam=o.get("beam"), len_penalty=o.get("len_penalty"))
        assert a.json()["translations"] == [offline] and ("attention" in a.json()) == ("attention" in o)


def _batch_stats(live) -> tuple[int, int]:
    lines = live.client.get("/metrics").text.splitlines()
    value = {line.split()[0]: float(line.split()[1]) for line in lines if line and not line.startswith("#")}
    return int(value["attnkit_batch_sentences_count"]), int(value["attnkit_batch_sentences_sum"])


@pytest.mark.parametrize("beam", [3, 1])
def test_translate_streams_each_step_then_the_answer(live, beam):
    body = {"sentences": SENTENCES[:2], "beam": beam, "attention": True}
    with live.client.stream("POST", "/v1/translate", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names[:-1]) == {"step"}
    assert events[-1][1] == live.client.post("/v1/translate", json=body).json()  # done = the plain answer
    answer = events[-1][1]
    for i in range(2):
        steps = [d for n, d in events if n == "step" and d["sentence"] == i]
        assert [d["step"] for d in steps] == list(range(len(steps)))
        assert steps[-1]["done"] and not any(d["done"] for d in steps[:-1])
        assert steps[-1]["text"] == answer["translations"][i]
        assert len(steps[-1]["tokens"]) == len(answer["attention"][i]["target"]) - 1
        source_length = len(answer["attention"][i]["source"])
        for d in steps[:-1]:
            assert len(d["attention"]) == source_length and abs(sum(d["attention"]) - 1) < 2e-3
            assert ("beams" in d) == (beam > 1)
            if beam > 1:
                assert d["beams"][0]["tokens"] == d["tokens"] and len(d["beams"]) <= beam
                assert [b["score"] for b in d["beams"]] == sorted((b["score"] for b in d["beams"]), reverse=True)


# --- language models, captioners, attention, scores


def test_generate_plain_streamed_and_with_next_token_probabilities(live, models):
    c = live.client
    body = {"model": "lm", "prompt": "the ", "max_tokens": 12, "temperature": 0.8, "top_k": 5, "seed": 3}
    a = c.post("/v1/generate", json=body)
    assert a.status_code == 200, a.text
    a = a.json()
    expected = models["lm"].generate("the ", 12, 0.8, 5, 1.0, 3)
    assert a["text"] == expected and a["text"] == "the " + a["completion"] and len(a["tokens"]) <= 12
    with c.stream("POST", "/v1/generate", json={**body, "stream": True, "attention": True, "top": 3}) as r:
        events = sse(r)
    assert events[-1][0] == "done"
    done = events[-1][1]
    assert done["text"] == a["text"]  # the same sample, streamed
    steps = [d for n, d in events if n == "step"]
    assert "".join(d["text"] for d in steps) == done["completion"] and len(steps) == len(done["tokens"])
    for j, d in enumerate(steps):
        assert len(d["attention"]) == len("the ") + 1 + j  # BOS, the prompt, the new tokens before it
        assert len(d["top"]) == 3 and sum(q for _, _, q in d["top"]) <= 1.0001
    assert [s["token"] for s in done["steps"]] == done["tokens"]
    for d, s in zip(steps, done["steps"]):  # the teacher-forced distributions are the sampled-from ones
        assert [t[0] for t in d["top"]] == [t[0] for t in s["top"]]
        assert [t[1] for t in d["top"]] == pytest.approx([t[1] for t in s["top"]], abs=2e-3)
    greedy = c.post("/v1/generate", json={"model": "lm", "prompt": "a", "max_tokens": 5, "temperature": 0}).json()
    assert greedy["text"] == models["lm"].generate("a", 5, 0.0)
    # greedy with the attention kept: the decoder's own search step over the step that keeps it
    watched = c.post("/v1/generate", json={"model": "lm", "prompt": "a", "max_tokens": 5, "temperature": 0,
                                           "attention": True})
    assert watched.status_code == 200, watched.text
    assert watched.json()["text"] == greedy["text"]
    one_line_error(c.post("/v1/generate", json={"model": "lm", "top_p": 0}), 422, "top_p")
    one_line_error(c.post("/v1/generate", json={"model": "lm", "prompt": "x" * 70}), 413, "prompt")


def test_caption_an_uploaded_image_with_attention_per_word(live, models):
    c = live.client
    r = c.post("/v1/caption", data={"model": "sat"}, files={"image": ("dog.png", png(), "image/png")})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["grid"] == [7, 7] and a["words"][-1] == "<end>" and len(a["words"]) <= 7
    assert a["caption"] == " ".join(a["words"][:-1])
    assert len(a["attention"]) == len(a["words"]) and all(len(row) == 49 for row in a["attention"])
    assert all(abs(sum(row) - 1) < 5e-3 for row in a["attention"])
    one_line_error(c.post("/v1/caption", data={"model": "sat"}, files={"image": ("x.png", b"not an image")}),
                   422, "image")
    one_line_error(c.post("/v1/caption", files={"model": (None, "sat")}), 422, "image")  # multipart, no image
    one_line_error(c.post("/v1/caption", data={"model": "sat"}), 400, "body")  # not multipart
    one_line_error(c.post("/v1/caption", data={"model": "sat", "beam": "two"},
                          files={"image": ("dog.png", png(), "image/png")}), 422, "beam")
    one_line_error(c.post("/v1/caption", data={"model": "dates"}, files={"image": ("dog.png", png(), "image/png")}),
                   422, "model")
    # naming no model: the server's first captioner, although its first model translates
    r = c.post("/v1/caption", files={"image": ("dog.png", png(), "image/png")})
    assert r.status_code == 200 and r.json()["model"] == "sat" and r.json()["caption"] == a["caption"]


def test_attention_of_one_example_with_interventions(live, models):
    c = live.client
    model = models["dates"]
    source = SENTENCES[0]
    a = c.post("/v1/attention", json={"source": source}).json()
    offline = model.attention(source)
    assert a["output"] == model.translate(source) and a["source"] == offline.source and a["target"] == offline.target
    assert a["score"] == pytest.approx(model.score([source], [a["output"]])[0], abs=1e-3)
    for kind in ("encoder", "decoder", "cross"):
        ours = torch.tensor(a[kind])
        assert ours.shape == torch.stack(getattr(offline, kind)).shape
        torch.testing.assert_close(ours, torch.stack(getattr(offline, kind)), atol=6e-5, rtol=0)
    # a given target; source tokens masked: no attention reaches them
    target = a["output"]
    m = c.post("/v1/attention", json={"source": source, "target": target, "mask_source": [0, 2]}).json()
    assert m["output"] == target and m["masked"] == {"heads": [], "source": [0, 2]}
    cross = torch.tensor(m["cross"])
    assert cross[..., [0, 2]].abs().max() == 0 and torch.allclose(cross.sum(-1), torch.ones(cross.shape[:-1]),
                                                                   atol=2e-3)
    assert m["score"] != a["score"]
    # every cross-attention head masked: the output no longer depends on the source (but for its length limit)
    heads = [["cross", layer, head] for layer in range(2) for head in range(4)]
    outs = sorted((c.post("/v1/attention", json={"source": s, "mask_heads": heads}).json()["output"]
                   for s in SENTENCES[:4]), key=len)
    assert all(outs[-1].startswith(o) for o in outs) and outs[-1] != a["output"]
    masked = c.post("/v1/attention", json={"source": source, "target": target, "mask_heads": heads[:1]}).json()
    assert masked["score"] != a["score"] and masked["masked"]["heads"] == heads[:1]
    # the module is left as it was
    assert model.attention(source).cross[0].shape == offline.cross[0].shape
    assert c.post("/v1/attention", json={"source": source}).json()["score"] == a["score"]
    one_line_error(c.post("/v1/attention", json={"source": source, "mask_heads": [["cross", 2, 0]]}), 422,
                   "mask_heads[0]")
    one_line_error(c.post("/v1/attention", json={"source": source, "mask_source": [99]}), 422, "mask_source")
    # a language model's text, a captioner's image
    lm = c.post("/v1/attention", json={"model": "lm", "source": "the fox"}).json()
    assert lm["output"] == "the fox" and len(lm["decoder"]) == 2 and lm["cross"] == [] and lm["source"] == []
    import base64

    sat = c.post("/v1/attention", json={"model": "sat", "image": base64.b64encode(png()).decode()}).json()
    assert sat["grid"] == [7, 7] and len(sat["cross"]) == 1 and len(sat["cross"][0][0][0]) == 49
    one_line_error(c.post("/v1/attention", json={"model": "sat", "source": "x"}), 422, "image")
    one_line_error(c.post("/v1/attention", json={"model": "sat", "source": "x", "image": base64.b64encode(png())
                                                 .decode()}), 422, "source")  # an image model reads no source


def test_score_and_positional(live, models):
    c = live.client
    targets = generate_dates(3, seed=21).tgt
    r = c.post("/v1/score", json={"sources": SENTENCES[:3], "targets": targets}).json()
    assert r["scores"] == pytest.approx(models["dates"].score(SENTENCES[:3], targets), abs=1e-4)
    lm = c.post("/v1/score", json={"model": "lm", "targets": ["the dog"]}).json()
    assert lm["scores"] == pytest.approx(models["lm"].score(["the dog"]), abs=1e-4)
    one_line_error(c.post("/v1/score", json={"sources": SENTENCES[:2], "targets": targets}), 422, "targets")
    p = c.post("/v1/positional", json={"positions": 5}).json()
    assert p["kind"] == "sinusoidal" and len(p["matrix"]) == 5 and len(p["matrix"][0]) == 32
    assert len(p["dot"]) == 5 and p["dot"][0][0] == pytest.approx(16.0, abs=1e-3)  # sin^2 + cos^2 per pair


# --- bad requests: one line of JSON naming the field


def test_bad_requests_get_one_line_naming_the_field(live):
    c = live.client
    post = c.post
    assert one_line_error(post("/v1/translate", content=b"{not json", headers={"content-type": "application/json"}),
                          400, "body")
    one_line_error(post("/v1/translate", json=[1, 2]), 400, "body")
    one_line_error(post("/v1/translate", json={"sentences": "a sentence"}), 422, "sentences")
    one_line_error(post("/v1/translate", json={"sentences": [1]}), 422, "sentences[0]")
    one_line_error(post("/v1/translate", json={"sentences": ["x"], "beam": "5"}), 422, "beam")
    one_line_error(post("/v1/translate", json={"sentences": ["x"], "beam": 0}), 422, "beam")
    one_line_error(post("/v1/translate", json={"sentences": ["x"], "beem": 5}), 422, "beem")
    one_line_error(post("/v1/translate", json={}), 422, "sentences")
    one_line_error(post("/v1/translate", json={"sentences": ["x"], "n_best": 9}), 422, "n_best")
    one_line_error(post("/v1/translate", json={"sentences": ["x"], "model": "nope"}), 404, "model")
    one_line_error(post("/v1/generate", json={"model": "dates", "prompt": "x"}), 422, "model")  # dates cannot
    one_line_error(c.get("/v1/nothing"), 404, "path")
    one_line_error(c.get("/v1/translate"), 405, "method")
    one_line_error(post("/v1/translate", json={"sentences": ["1 May 2001 " * 40]}), 413, "sentences[0]")
    one_line_error(post("/v1/translate", json={"sentences": ["x"] * 65}), 413, "sentences")
    big = {"sentences": ["x" * (1 << 20)]}
    one_line_error(post("/v1/translate", json=big), 413, "body")

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        yield b'{"sentences": ["'
        for _ in range(20):
            yield b"y" * 65536
        yield b'"]}'

    one_line_error(post("/v1/translate", content=chunks(), headers={"content-type": "application/json"}), 413, "body")


def test_an_internal_error_is_one_line_500(live, monkeypatch):
    from attnkit.serve import compute

    def broken(job, settings):
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setitem(compute.RUNNERS, "score", broken)
    error = one_line_error(live.client.post("/v1/score", json={"sources": ["x"], "targets": ["y"]}), 500,
                           "internal")
    assert "a bug" not in error
    assert live.client.get("/health").json()["in_flight"] == 0


# --- the limits: 429 when the queue is full, a disconnect frees its slot, 504 past the time limit


def test_full_queue_429_and_a_client_leaving_a_stream_frees_its_slot(models):
    server = LiveServer(models, queue_size=1, max_new_tokens=10**6)
    try:
        c = server.client
        # minutes of sampling, unless it stops when its client leaves
        long = {"model": "lm", "prompt": "the", "max_tokens": 10**6, "temperature": 1.0, "seed": 1, "stream": True}
        with httpx.Client(base_url=server.url, timeout=30) as other:
            with other.stream("POST", "/v1/generate", json=long) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                assert any(line.startswith("data: ") for line in lines)  # decoding has begun
                full = c.post("/v1/translate", json={"sentences": ["1 May 2001"]})
                one_line_error(full, 429, "queue")
                assert int(full.headers["retry-after"]) >= 1
            # the stream's client left: its slot frees, its decoding stops
        deadline = time.monotonic() + 10
        while c.get("/health").json()["in_flight"]:
            assert time.monotonic() < deadline, "the slot of a client that left was not freed"
            time.sleep(0.05)
        assert c.post("/v1/translate", json={"sentences": ["1 May 2001"]}, timeout=10).status_code == 200
        text = c.get("/metrics").text
        assert 'status="429"' in text
    finally:
        server.close()


def test_a_request_past_its_time_limit_is_504(models):
    server = LiveServer(models, timeout=0.3, max_new_tokens=10**6)
    try:
        slow = {"model": "lm", "prompt": "the", "max_tokens": 10**6, "temperature": 1.0, "seed": 1}
        one_line_error(server.client.post("/v1/generate", json=slow), 504, "timeout")
        with server.client.stream("POST", "/v1/generate", json={**slow, "stream": True}) as r:
            events = sse(r)
        assert events[-1][0] == "error" and events[-1][1]["status"] == 504
        # the worker let both go: a short request is answered at once
        server.settings.timeout = 30.0
        assert server.client.post("/v1/translate", json={"sentences": ["1 May 2001"]}, timeout=10).status_code == 200
    finally:
        server.close()


# --- the command line: loopback unless there is an API key; the key enforced


def _attnkit(*args, **kwargs):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ATTNKIT_API_KEY", None)
    return subprocess.Popen([sys.executable, "-m", "attnkit", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_serve_command_refuses_public_binding_without_key_and_enforces_the_key(trained_checkpoint):
    proc = _attnkit("serve", str(trained_checkpoint), "--host", "0.0.0.0", "--threads", "1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.count("\n") == 1 and "API key" in err, err
    port = free_port()
    proc = _attnkit("serve", f"dates={trained_checkpoint}", "--port", str(port), "--api-key", "s3cret",
                    "--threads", "1")
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"{url}/health").json()["models"] == ["dates"]
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.1)
        body = {"sentences": ["1 May 2001"]}
        one_line_error(httpx.post(f"{url}/v1/translate", json=body), 401, "authorization")
        one_line_error(httpx.post(f"{url}/v1/translate", json=body, headers={"Authorization": "Bearer nope"}), 401)
        one_line_error(httpx.get(f"{url}/metrics"), 401)
        assert httpx.post(f"{url}/v1/translate", json=body, headers={"Authorization": "Bearer s3cret"}).status_code \
            == 200
        assert httpx.post(f"{url}/v1/translate", json=body, headers={"X-API-Key": "s3cret"}).status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def test_serve_compiles_translation_models_in_the_background_unless_told_not_to(trained_checkpoint, monkeypatch,
                                                                                   capsys):
    """``attnkit serve``'s start: by default (ATTNKIT_COMPILE=1) a Transformer translation model is compiled, and
    warmed up greedy and at its checkpoint's beam, in the background (``Model.compile(beams=..., background=True)``):
    nothing is decoded before uvicorn answers, and it says so; ``--no-compile`` (settings.compile False) and
    ATTNKIT_COMPILE=0 leave it eager; ``--compile`` compiles whatever the default."""
    import attnkit.serve.server as server
    from attnkit.api import Model
    from attnkit.checkpoint import read_config
    from attnkit.serve import Settings

    events = []
    monkeypatch.setattr(Model, "compile", lambda self, **kw: events.append(("compile", self.family, kw)) or self)
    monkeypatch.setattr(Model, "translate", lambda self, sentences, beam=None, **kw:
                        events.append(("translate", beam, tuple(sentences))) or ["" for _ in sentences])
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: events.append(("run", kw["host"])))
    beam = read_config(trained_checkpoint).decode.beam_size
    for switch, compile, compiled in (("1", None, True), ("1", False, False), ("0", None, False), ("0", True, True)):
        monkeypatch.setenv("ATTNKIT_COMPILE", switch)
        events.clear()
        assert server.serve([f"dates={trained_checkpoint}"], Settings(port=free_port(), compile=compile)) == 0
        expected = [("compile", "transformer", {"beams": (1, beam), "background": True})]
        assert events == [*(expected if compiled else []), ("run", "127.0.0.1")], (switch, compile)
        said = f"compiling for beam sizes {', '.join(map(str, sorted({1, beam})))} in the background"
        assert (said in capsys.readouterr().err) == compiled
