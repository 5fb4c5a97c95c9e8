"""The OpenAPI document of ``attnkit serve`` describes the server that answers, checked by clients nobody here
wrote: Schemathesis generates requests from the document alone and runs all its checks against a live server on
127.0.0.1 (a translation, a language-model and a captioning checkpoint, and a fine-tuned classifier and pair
regressor where tests/conftest.py can build them); openapi-core validates requests built from the document and the
answers they get; every 405 names the methods the path allows."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import LiveServer, answerers, classifiers, png, schemathesis, tiny_speech_checkpoint, wav  # noqa: E402

POSTS = ("/v1/translate", "/v1/generate", "/v1/caption", "/v1/attention", "/v1/score", "/v1/positional",
         "/v1/transcribe")
ERRORS = {"400", "404", "408", "413", "422", "429", "500", "504"}


@pytest.fixture(scope="module")
def live(served_models, request, tmp_path_factory):
    import attnkit

    speech = {"las": attnkit.load(tiny_speech_checkpoint(tmp_path_factory.mktemp("las")))}
    server = LiveServer({**served_models, **classifiers(request), **answerers(tmp_path_factory), **speech})
    yield server
    server.close()


def posts(live) -> tuple[str, ...]:
    """The POST endpoints of the server: those some served model answers (attnkit.serve.compute.serves), each
    endpoint of POSTS among them (/v1/classify where it serves a classifier, /v1/answer a VQA model)."""
    from attnkit.serve.compute import endpoints, serves

    served = live.app.state.models.values()
    found = tuple(path for path in endpoints() if any(serves(m, path) for m in served))
    assert set(POSTS) <= set(found)
    return found


@pytest.fixture(scope="module")
def document(live) -> dict:
    return live.client.get("/openapi.json").json()


def test_the_document_declares_every_status_with_the_one_line_error(document, live):
    paths = document["paths"]
    assert set(paths) == {"/health", "/v1/models", "/metrics", *posts(live)}
    for path in posts(live):
        responses = paths[path]["post"]["responses"]
        assert ERRORS | {"200"} == set(responses), path
        for status in ERRORS:
            assert responses[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
        assert "Retry-After" in responses["429"]["headers"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    for path in ("/v1/translate", "/v1/generate"):
        assert set(paths[path]["post"]["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    form = paths["/v1/caption"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"]["required"] == ["image"] and form["schema"]["properties"]["image"]["format"] == "binary"
    assert "security" not in paths["/v1/translate"]["post"]  # this server has no API key


def test_required_fields_are_required_and_ranges_are_the_servers(document, live):
    """``{}`` is valid for an endpoint exactly when the server answers it 200; the limits are the server's."""
    import jsonschema

    for path in posts(live):
        content = document["paths"][path]["post"]["requestBody"]["content"]
        if "application/json" not in content:  # an upload (an image to caption or ask about, audio to transcribe)
            continue
        schema = content["application/json"]["schema"]
        valid = jsonschema.Draft202012Validator(schema).is_valid({})
        r = live.client.post(path, json={})
        assert valid == (r.status_code == 200), (path, r.status_code, r.text)
    translate = document["paths"]["/v1/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert translate["properties"]["sentences"]["maxItems"] == live.settings.max_sentences
    assert translate["properties"]["beam"]["anyOf"][0]["maximum"] == live.settings.max_beam
    assert translate["properties"]["sentences"]["items"]["x-max-tokens"] > 0
    if "/v1/classify" in document["paths"]:
        schema = document["paths"]["/v1/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        for branch in schema["oneOf"]:
            assert branch["properties"]["sentences"]["maxItems"] == live.settings.max_sentences
            assert 0 < branch["properties"]["sentences"]["items"]["x-max-tokens"] <= live.settings.max_source_tokens


@pytest.mark.parametrize("method,path,allowed", [
    ("DELETE", "/v1/translate", "POST"), ("GET", "/v1/caption", "POST"), ("POST", "/health", "GET"),
    ("TRACE", "/metrics", "GET"), ("PUT", "/v1/models", "GET"), ("PATCH", "/openapi.json", "GET, HEAD")])
def test_every_405_names_the_allowed_methods(live, method, path, allowed):
    r = live.client.request(method, path)
    assert r.status_code == 405 and r.json()["error"].startswith("method: ")
    assert set(r.headers["allow"].split(", ")) == set(allowed.split(", "))


# --- a client built from the document alone


def example(schema: dict, doc: dict, image: bytes):
    """A value the schema admits, read off it: defaults, the first of an enum, minimums, minItems; an image file
    where the document asks for one."""
    if "$ref" in schema:
        return example(doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], doc, image)
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return next(v for v in schema["enum"] if v not in (None, ""))
    if "anyOf" in schema:
        return example(next(s for s in schema["anyOf"] if s.get("type") != "null"), doc, image)
    kind = schema.get("type")
    if kind == "object":
        return {key: example(schema["properties"][key], doc, image) for key in schema.get("required", [])}
    if kind == "array":
        if "prefixItems" in schema:
            return [example(s, doc, image) for s in schema["prefixItems"]]
        return [example(schema["items"], doc, image) for _ in range(schema.get("minItems", 0))]
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "number":
        return schema.get("minimum", 1.0)
    if kind == "string":
        if schema.get("format") == "byte":
            return base64.b64encode(image).decode()
        return "a dog runs"
    if kind == "boolean":
        return False
    return None


def test_a_client_built_from_the_document_gets_the_documented_answers(live, document):
    """For every operation and every model it documents: a request made from the schema alone (required fields
    and each model's own branch) is valid by openapi-core, answered 200, and the answer validates against the
    document; a body that is not an object gets the documented 400."""
    from openapi_core import OpenAPI
    from openapi_core.testing import MockRequest, MockResponse

    api = OpenAPI.from_dict(document)
    image = png()
    answered = Counter()

    def check(method: str, path: str, response, body: bytes = b"", content_type: str = "application/json",
              validate_request: bool = True):
        request = MockRequest(live.url, method, path, data=body, content_type=content_type)
        if validate_request:
            api.validate_request(request)
        kind = response.headers["content-type"].split(";")[0]
        api.validate_response(request, MockResponse(response.content, response.status_code,
                                                    dict(response.headers), kind))
        answered[(path, response.status_code)] += 1

    for path, item in document["paths"].items():
        for method, operation in item.items():
            if "requestBody" not in operation:
                r = live.client.request(method.upper(), path)
                assert r.status_code == 200, (path, r.text)
                check(method, path, r)
                continue
            content = operation["requestBody"]["content"]
            if "multipart/form-data" in content:
                schema = content["multipart/form-data"]["schema"]
                uploads = {"image": ("x.png", image, "image/png"), "audio": ("x.wav", wav(), "audio/wav")}
                files = {key: upload for key, upload in uploads.items() if key in schema["properties"]}
                fields = {key: example(schema["properties"][key], document, image)
                          for key in schema.get("required", []) if key not in uploads}
                for name in filter(None, schema["properties"]["model"]["enum"]):
                    r = live.client.post(path, files=files, data={**fields, "model": name})
                    assert r.status_code == 200, r.text
                    check(method, path, r, validate_request=False)  # multipart bodies: the answer is checked
                continue
            schema = content["application/json"]["schema"]
            for branch in schema.get("oneOf", [schema]):
                body = example(branch, document, image)
                body["model"] = next(v for v in branch["properties"]["model"]["enum"] if v)
                data = json.dumps(body).encode()
                r = live.client.post(path, content=data, headers={"content-type": "application/json"})
                assert r.status_code == 200, (path, body.get("model"), r.text)
                check(method, path, r, data)
            r = live.client.post(path, content=b"[1, 2]", headers={"content-type": "application/json"})
            assert r.status_code == 400
            check(method, path, r, validate_request=False)  # a wrong body on purpose: only the answer is checked
    assert {path for path, status in answered if status == 200} == set(document["paths"])


# --- Schemathesis, all checks


@pytest.mark.slow
def test_schemathesis_finds_nothing_with_all_its_checks(live, tmp_path):
    """``st run --checks all``: server errors, status codes, content types and response headers conforming to the
    document, response bodies conforming to their schemas, schema-valid requests accepted, schema-violating ones
    rejected, undeclared methods answered 405 with Allow; its coverage and fuzzing phases, a bounded number of
    examples per operation, a fixed seed. 413 counts as a rejection (a request over a size limit); the hooks in
    tests/fuzz_hooks.py draw real images and keep the rules the document states outside JSON Schema."""
    st, config = schemathesis(tmp_path)
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_hooks", "ATTNKIT_FUZZ_URL": live.url,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
           "ATTNKIT_FUZZ_MODELS": json.dumps({name: str(m.path) for name, m in live.models.items()})}
    har = tmp_path / "requests.har"
    cmd = [str(st), "--config-file", str(config), "run", f"{live.url}/openapi.json", "--checks", "all",
           "--max-examples", os.environ.get("ATTNKIT_FUZZ_EXAMPLES", "40"), "--seed", "1", "--workers", "1",
           "--phases", "examples,coverage,fuzzing,stateful", "--report", "har", "--report-har-path", str(har),
           "--no-color"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)  # its cache too
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert "No issues found" in out.stdout, out.stdout[-3000:]
    sent = Counter((e["request"]["method"], urlsplit(e["request"]["url"]).path)
                   for e in json.loads(har.read_text())["log"]["entries"])
    print("schemathesis requests per operation:", dict(sorted(sent.items())))
    for path in posts(live):
        assert sent[("POST", path)] >= 20, sent
    for path in ("/health", "/v1/models", "/metrics"):
        assert sent[("GET", path)] >= 1, sent
