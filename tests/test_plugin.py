"""A model family from outside the package (tests/plugins/toy_luong.py, registered with attnkit.register_family) is
trained by ``attnkit train``, decoded through ``attnkit.load`` and served by ``attnkit serve`` (its OpenAPI
document describing it, Schemathesis finding nothing) with no other change to attnkit. Every step runs in its own
process, as a user's would: the test process's registry never sees the plug-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import made_once
from serving import free_port, schemathesis

PLUGIN = Path(__file__).parent / "plugins" / "toy_luong.py"
ATTNKIT = [sys.executable, "-m", "attnkit"]
CONFIG = """
name = "toy"
[model]
family = "toy_luong"
d_model = 64
[data]
format = "dates"
n_synthetic = 3000
spm_model_type = "char"
vocab_size = 80
[train]
max_tokens = 2048
lr = 3e-3
warmup_steps = 50
schedule = "inverse_sqrt"
max_steps = 240
eval_every = 0
save_every = 0
eval_bleu = false
label_smoothing = 0.0
log_every = 40
max_epochs = 0
keep_last = 1
"""

pytestmark = pytest.mark.slow


def _env(**more) -> dict:
    return {**os.environ, "ATTNKIT_DATA": "", **more}


def _train(base: Path) -> None:
    config = base / "toy.toml"
    config.write_text(CONFIG)
    out = subprocess.run([*ATTNKIT, "--plugin", str(PLUGIN), "train", str(config), "--run-dir", str(base / "run"),
                          "--threads", "1"], capture_output=True, text=True, timeout=600, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def run() -> Path:
    """A toy_luong run trained by the command line with --plugin (once a test run: the tests only read it)."""
    return made_once("plugin", _train) / "run"


def test_without_the_plugin_the_family_is_refused_in_one_line(tmp_path):
    config = tmp_path / "toy.toml"
    config.write_text(CONFIG)
    out = subprocess.run([*ATTNKIT, "train", str(config), "--run-dir", str(tmp_path / "run")], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert out.returncode == 2 and not (tmp_path / "run").exists()
    [line] = out.stderr.strip().splitlines()
    assert "model.family = 'toy_luong' is not one of" in line and "--plugin" in line, line


def test_a_missing_plugin_file_is_refused_in_one_line(tmp_path):
    out = subprocess.run([*ATTNKIT, "--plugin", str(tmp_path / "nope.py"), "train", "x.toml"], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert "--plugin" in line and "nope.py" in line, line


def test_the_plugin_family_trains(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["valid_loss"] for r in records if "valid_loss" in r]
    assert len(losses) >= 2 and losses[-1] < 0.5 * losses[0], losses  # it learns: held-out loss halves at least
    config = (run / "config.toml").read_text()
    assert 'family = "toy_luong"' in config


LOAD = """
import json, sys
import torch
import attnkit
from attnkit.tokens import BOS, EOS

m = attnkit.load(sys.argv[1])
sources = ["July 20, 1969", "3.4.1997", "Tuesday, March 4th 1997"]
greedy = m.translate(sources, beam=1)
# the reference: a greedy loop over the plug-in's own encode / init_state / step, written here
module, toks = m.module, m.tokenizers
reference = []
with torch.no_grad():
    for s in sources:
        src = torch.tensor([toks.src.encode([s])[0] + [EOS]])
        state = module.init_state(module.encode(src))
        token, out = torch.tensor([BOS]), []
        for _ in range(int(1.2 * src.size(1)) + 10):
            log_probs, state, _ = module.step(token, state)
            token = log_probs.argmax(-1)
            if int(token) == EOS:
                break
            out.append(int(token))
        reference.append(toks.tgt.decode(out))
a = m.attention(sources[0])
print(json.dumps({"family": m.family, "kind": m.kind.name, "greedy": greedy, "reference": reference,
                  "beam": m.translate(sources, beam=4), "source": a.source, "cross": [list(w.shape) for w in a.cross],
                  "row_sums": a.cross[0].sum(-1).flatten().tolist(), "text": a.text,
                  "score": m.score([sources[0]], [a.text])[0], "attention_score": a.score}))
"""


def test_the_plugin_family_decodes_through_attnkit_load(run):
    out = subprocess.run([sys.executable, "-c", LOAD, str(run)], capture_output=True, text=True, timeout=300,
                         env=_env(ATTNKIT_PLUGINS=str(PLUGIN)))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["family"] == "toy_luong" and r["kind"] == "text"
    assert r["greedy"] == r["reference"]  # attnkit's search over the plug-in's steps is the plain greedy loop
    assert all(isinstance(t, str) and t for t in r["beam"])
    assert r["source"][-1] == "</s>" and len(r["cross"]) == 1  # one layer of one head: Luong's alignment
    assert r["cross"][0][0] == 1 and r["cross"][0][2] == len(r["source"])
    assert all(abs(s - 1.0) < 1e-5 for s in r["row_sums"])  # each step's attention is a distribution
    assert abs(r["score"] - r["attention_score"]) < 1e-4  # the same log-probability, two ways


def test_the_plugin_family_is_served_and_described(run, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*ATTNKIT, "--plugin", str(PLUGIN), "serve", f"toy={run}", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        [model] = httpx.get(f"{url}/v1/models").json()["models"]
        assert model["family"] == "toy_luong" and model["attention"]["cross"] == {"layers": 1, "heads": 1}
        document = httpx.get(f"{url}/openapi.json").json()
        for path in ("/v1/translate", "/v1/attention", "/v1/score"):
            schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert schema["title"] == "toy (toy_luong)", (path, schema.get("title"))
        answer = httpx.post(f"{url}/v1/translate", json={"sentences": ["July 20, 1969"], "beam": 1,
                                                            "attention": True}).json()
        assert answer["attention"][0]["source"][-1] == "</s>"
        st, config = schemathesis(tmp_path)
        env = _env(SCHEMATHESIS_HOOKS="fuzz_hooks", ATTNKIT_FUZZ_URL=url, ATTNKIT_PLUGINS=str(PLUGIN),
                   ATTNKIT_FUZZ_MODELS=json.dumps({"toy": str(run)}),
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
        cmd = [str(st), "--config-file", str(config), "run", f"{url}/openapi.json", "--checks", "all",
               "--max-examples", "15", "--seed", "1", "--workers", "1", "--phases", "examples,coverage,fuzzing",
               "--no-color"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert out.returncode == 0 and "No issues found" in out.stdout, out.stdout[-6000:] + out.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
