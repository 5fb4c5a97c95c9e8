"""``POST /v1/classify`` as a client sees it: a real uvicorn server on 127.0.0.1 serving a translation model first,
then a fine-tuned BERT classifier (SST-2, single sentences) and regressor (STS-B, sentence pairs). Answers equal
:func:`attnkit.decode.classify` offline; a batch's answers equal each sentence's alone, however requests are grouped
and padded; concurrent requests share batches; an explanation has the shapes it promises; every fault is its
status and one line naming the field."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnkit.decode import classify, explain  # noqa: E402
from serving import LiveServer, one_line_error  # noqa: E402

SENTENCES = ["a gripping , beautifully acted film .", "dull and far too long", "the plot makes no sense at all , "
             "and the jokes fall flat again and again", "wonderful", "not bad", "an utterly tedious mess of a movie"]
FIRSTS = ["a man is playing a guitar .", "a woman slices an onion .", "two dogs run on the beach"]
SECONDS = ["a man plays the guitar .", "a cat sleeps on a sofa .", "dogs are running by the sea"]
WORDS = "the a film movie good bad great awful plot actors , . not very boring funny slow it is was".split()


@pytest.fixture(scope="module")
def models(trained_checkpoint, classifier_run, regressor_run):
    import attnkit

    return {"dates": attnkit.load(trained_checkpoint), "sst": attnkit.load(classifier_run),
            "sts": attnkit.load(regressor_run)}


@pytest.fixture(scope="module")
def live(models):
    server = LiveServer(models, max_wait_ms=50.0)
    yield server
    server.close()


def offline(model, texts, pairs=None):
    return classify(model.module, model.tokenizers, texts, pairs)


def same(answer: dict, expected) -> None:
    """One result equals an offline Classification within 1e-5 (the label too, unless two labels tie that closely)."""
    if expected.score is not None:
        assert answer["probabilities"] is None and answer["label"] == expected.label
        assert answer["score"] == pytest.approx(expected.score, abs=1e-5)
        return
    assert answer["score"] is None and list(answer["probabilities"]) == list(expected.probabilities)
    assert answer["probabilities"] == pytest.approx(expected.probabilities, abs=1e-5)
    top = sorted(expected.probabilities.values(), reverse=True)
    if top[0] - top[1] > 1e-5:
        assert answer["label"] == expected.label


def post(live, body: dict, status: int = 200) -> dict:
    r = live.client.post("/v1/classify", json=body)
    assert r.status_code == status, r.text
    return r.json()


# --- discovery


def test_models_lists_the_classifiers_and_the_document_routes_them_to_classify_alone(live):
    models = {m["name"]: m for m in live.client.get("/v1/models").json()["models"]}
    assert models["dates"]["default"] and not models["sst"]["default"]
    sst, sts = models["sst"], models["sts"]
    assert sst["family"] == sts["family"] == "bert_classifier"
    assert sst["capabilities"] == sts["capabilities"] == ["attention", "classify"]
    assert (sst["labels"], sst["problem"], sst["pairs"]) == (["0", "1"], "classification", False)
    assert (sts["labels"], sts["problem"], sts["pairs"]) == (["score"], "regression", True)
    assert sst["example"] and sst["example_pair"] is None and sts["example"] and sts["example_pair"]
    assert sst["attention"] == {"encoder": {"layers": 2, "heads": 2}} and sst["decode"] is None
    paths = live.client.get("/openapi.json").json()["paths"]
    body = paths["/v1/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert [b["properties"]["model"]["enum"] for b in body["oneOf"]] == [["sst", None], ["sts"]]
    assert body["oneOf"][1]["required"] == ["sentences", "pairs", "model"]
    for path in ("/v1/translate", "/v1/attention", "/v1/score", "/v1/positional"):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        names = {n for b in schema.get("oneOf", [schema]) for n in b["properties"]["model"]["enum"]}
        assert not names & {"sst", "sts"}, path


# --- answers: offline's, whatever the batch


def test_classify_equals_offline_and_goes_to_the_first_classifier_by_default(live, models):
    answer = post(live, {"sentences": SENTENCES})
    assert answer["model"] == "sst" and set(answer) == {"model", "results"}
    for a, e in zip(answer["results"], offline(models["sst"], SENTENCES), strict=True):
        same(a, e)
    answer = post(live, {"model": "sts", "sentences": FIRSTS, "pairs": SECONDS})
    for a, e in zip(answer["results"], offline(models["sts"], FIRSTS, SECONDS), strict=True):
        same(a, e)
    text = live.client.get("/metrics").text
    assert 'attnkit_requests_total{endpoint="/v1/classify",status="200"}' in text


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=30).map(" ".join), min_size=2,
                      max_size=6))
def test_a_batch_answers_as_each_sentence_alone(live, texts):
    """Padding to the batch's longest sentence never changes a sentence's answer (within 1e-5)."""
    batch = post(live, {"model": "sst", "sentences": texts})["results"]
    for text, result in zip(texts, batch, strict=True):
        alone = post(live, {"model": "sst", "sentences": [text]})["results"][0]
        assert alone["probabilities"] == pytest.approx(result["probabilities"], abs=1e-5)
    pairs = post(live, {"model": "sts", "sentences": texts, "pairs": texts[::-1]})["results"]
    for a, b, result in zip(texts, texts[::-1], pairs, strict=True):
        alone = post(live, {"model": "sts", "sentences": [a], "pairs": [b]})["results"][0]
        assert alone["score"] == pytest.approx(result["score"], abs=1e-5)


def _batch_stats(live) -> tuple[int, int]:
    lines = live.client.get("/metrics").text.splitlines()
    value = {line.split()[0]: float(line.split()[1]) for line in lines if line and not line.startswith("#")}
    return int(value["attnkit_batch_sentences_count"]), int(value["attnkit_batch_sentences_sum"])


def test_concurrent_requests_share_batches_and_answer_as_alone(live, models):
    clients = [httpx.Client(base_url=live.url, timeout=30) for _ in SENTENCES]
    try:
        for c in clients:  # connections open before the burst, so its requests arrive together
            assert c.get("/health").status_code == 200
        barrier = threading.Barrier(len(SENTENCES))

        def send(i):
            barrier.wait()
            return clients[i].post("/v1/classify", json={"model": "sst", "sentences": [SENTENCES[i]]})

        before = _batch_stats(live)
        with ThreadPoolExecutor(len(SENTENCES)) as pool:
            answers = list(pool.map(send, range(len(SENTENCES))))
        after = _batch_stats(live)
    finally:
        for c in clients:
            c.close()
    assert all(a.status_code == 200 for a in answers)
    for a, text in zip(answers, SENTENCES):
        same(a.json()["results"][0], offline(models["sst"], [text])[0])
    batches, sentences = after[0] - before[0], after[1] - before[1]
    assert sentences == len(SENTENCES) and batches < len(SENTENCES), (batches, sentences)  # some shared a batch


# --- explanations


@pytest.mark.parametrize("name", ["sst", "sts"])
def test_explain_gives_occlusion_attention_and_rollout_of_the_input(live, models, name):
    model = models[name]
    text, pair = (SENTENCES[2], None) if name == "sst" else (FIRSTS[0], SECONDS[0])
    body = {"model": name, "sentences": [text], "explain": True, **({"pairs": [pair]} if pair else {})}
    answer = post(live, body)
    e, result = answer["explanation"], answer["results"][0]
    tok = model.tokenizers
    pieces = ["[CLS]", *tok.pieces(text), "[SEP]", *((*tok.pieces(pair), "[SEP]") if pair else ())]
    n = len(pieces)
    assert e["pieces"] == pieces and len(e["token_types"]) == len(e["occlusion"]) == n
    assert e["token_types"] == [0] * (len(tok.pieces(text)) + 2) + [1] * (n - len(tok.pieces(text)) - 2)
    assert e["label"] == result["label"]
    value = result["score"] if pair else result["probabilities"][result["label"]]
    assert e["value"] == pytest.approx(value, abs=1e-5)
    assert all(e["occlusion"][i] == 0 for i, p in enumerate(pieces) if p in ("[CLS]", "[SEP]"))
    attention = torch.tensor(e["attention"])
    assert attention.shape == (2, 2, n, n)
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2, n), atol=2e-3, rtol=0)
    rollout = torch.tensor(e["rollout"])
    assert rollout.shape == (n, n)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(n, dtype=rollout.dtype), atol=1e-4, rtol=0)
    expected = explain(model.module, tok, text, pair)
    assert e["occlusion"] == pytest.approx(expected.occlusion, abs=1e-5)
    torch.testing.assert_close(rollout.float(), expected.rollout, atol=1e-5, rtol=0)


# --- faults: the status and one line naming the field

FAULTS = [  # (JSON body, status, field)
    ({"model": "sst", "sentences": []}, 422, "sentences"),
    ({"model": "sst"}, 422, "sentences"),
    ({"model": "sst", "sentences": "one sentence"}, 422, "sentences"),
    ({"model": "sst", "sentences": [3]}, 422, "sentences[0]"),
    ({"model": "sst", "sentences": ["good", "  "]}, 422, "sentences[1]"),
    ({"model": "sst", "sentences": ["good"] * 65}, 413, "sentences"),
    ({"model": "sst", "sentences": ["good " * 127]}, 413, "sentences[0]"),
    ({"model": "sst", "sentences": ["good"], "pairs": ["bad"]}, 422, "pairs"),
    ({"model": "sst", "sentences": ["good", "bad"], "explain": True}, 422, "explain"),
    ({"model": "sst", "sentences": ["good"], "explain": "yes"}, 422, "explain"),
    ({"model": "sst", "sentences": ["good"], "labels": ["0"]}, 422, "labels"),
    ({"model": "sts", "sentences": ["a man sings"]}, 422, "pairs"),
    ({"model": "sts", "sentences": ["a man sings", "a dog"], "pairs": ["a man sings"]}, 422, "pairs"),
    ({"model": "sts", "sentences": ["a man sings"], "pairs": [""]}, 422, "pairs[0]"),
    ({"model": "sts", "sentences": ["a man sings " * 40], "pairs": ["a man sings " * 3]}, 413, "sentences[0]"),
    ({"model": "nope", "sentences": ["good"]}, 404, "model"),
    ({"model": "dates", "sentences": ["good"]}, 422, "model"),
]


@pytest.mark.parametrize("body,status,field", FAULTS, ids=[f"{f}-{s}-{i}" for i, (_, s, f) in enumerate(FAULTS)])
def test_faults_are_their_status_and_one_line(live, body, status, field):
    error = one_line_error(live.client.post("/v1/classify", json=body), status, field)
    if body.get("model") == "dates":
        assert "cannot classify" in error


def test_a_classifier_answers_no_other_endpoint_and_other_faults(live):
    c = live.client
    for path, body in [("/v1/translate", {"sentences": ["good"]}), ("/v1/attention", {"source": "good"}),
                       ("/v1/score", {"sources": ["a"], "targets": ["b"]}), ("/v1/generate", {}),
                       ("/v1/positional", {})]:
        one_line_error(c.post(path, json={"model": "sst", **body}), 422, "model")
    r = c.get("/v1/classify")
    one_line_error(r, 405, "method")
    assert r.headers["allow"] == "POST"
    one_line_error(c.post("/v1/classify", json={"sentences": ["x" * (2 << 20)]}), 413, "body")
    one_line_error(c.post("/v1/classify", content=b"{not json", headers={"content-type": "application/json"}), 400,
                   "body")


def test_a_full_queue_is_429_and_a_slow_answer_504(models, monkeypatch):
    from attnkit.serve import compute

    real = compute.run_classify

    def slow(jobs, settings):
        time.sleep(1.5)
        return real(jobs, settings)

    monkeypatch.setattr(compute, "run_classify", slow)
    server = LiveServer(models, queue_size=1, timeout=0.8)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(server.client.post, "/v1/classify", json={"sentences": ["good"]})
            deadline = time.monotonic() + 5
            while server.client.get("/health").json()["in_flight"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            full = server.client.post("/v1/classify", json={"sentences": ["bad"]})
            one_line_error(full, 429, "queue")
            assert int(full.headers["retry-after"]) >= 1
            one_line_error(first.result(), 504, "timeout")
        monkeypatch.setattr(compute, "run_classify", real)
        server.settings.timeout = 30.0
        assert server.client.post("/v1/classify", json={"sentences": ["good"]}).status_code == 200
        text = server.client.get("/metrics").text
        for status in (429, 504, 200):
            assert f'attnkit_requests_total{{endpoint="/v1/classify",status="{status}"}}' in text
    finally:
        server.close()
