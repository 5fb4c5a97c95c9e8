"""The command line end to end: train on a Multi30k slice for 200 steps, translate, compile (and load the compiled
steps in the background through the Python API, as a server does), evaluate.

About a minute on one CPU thread; deselect with ``-m 'not slow'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnkit.data import read_lines, read_multi30k, write_lines
from attnkit.evaluate import bleu

pytestmark = pytest.mark.slow

CONFIG = """name = "e2e"
[model]
d_model = 64
n_heads = 4
d_ff = 256
n_encoder_layers = 2
n_decoder_layers = 2
dropout = 0.1
max_positions = 256

[data]
format = "multi30k"
src_lang = "en"
tgt_lang = "de"
vocab_size = 2000
max_len = 64

[train]
seed = 1
max_tokens = 1500
lr = 3e-3
warmup_steps = 100
max_steps = 200
max_minutes = 2.5  # a bound for a busy machine: the run is meant to end at max_steps
eval_every = 100000
save_every = 0
eval_bleu = false
progress = false
threads = 1
log_every = 50

[decode]
beam_size = 4
"""


def _attnkit(*args, cwd, **env_changes):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **env_changes}
    proc = subprocess.run([sys.executable, "-m", "attnkit", *map(str, args)], capture_output=True, text=True,
                          check=False, cwd=cwd, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_train_translate_evaluate(tmp_path, data_dir):
    if not (data_dir / "multi30k" / "task1" / "raw" / "train.en.gz").exists():
        pytest.skip("multi30k missing")
    config = tmp_path / "e2e.toml"
    config.write_text(CONFIG, encoding="utf-8")
    run = tmp_path / "run"

    train = _attnkit("train", config, "--run-dir", run, "--data-dir", data_dir,
                     "--set", "data.max_train_pairs=8000", "--set", "data.max_valid_pairs=100", cwd=tmp_path)
    result = json.loads(train.stdout.strip().splitlines()[-1])
    assert 50 <= result["step"] <= 200
    assert result["valid_loss"] < 5.5  # log(2000) = 7.6 is a uniform guess
    assert (run / "checkpoints" / "last" / "model.safetensors").exists()
    assert (run / "checkpoints" / "best" / "model.safetensors").exists()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_nll = [r["train_nll"] for r in records if "train_nll" in r]
    assert train_nll and train_nll[-1] < train_nll[0]

    val = read_multi30k(data_dir, "val")
    src, ref = tmp_path / "val.en", tmp_path / "val.de"
    write_lines(src, val.src[:100])
    write_lines(ref, val.tgt[:100])

    # translate a few sentences
    few = tmp_path / "few.en"
    write_lines(few, val.src[:5])
    out = tmp_path / "few.de"
    _attnkit("translate", "--checkpoint", run, "--input", few, "--output", out, cwd=tmp_path)
    translations = read_lines(out)
    assert len(translations) == 5
    assert all(t.strip() for t in translations)
    assert translations != val.src[:5]
    # attnkit compile fills the user's cache with the search steps compiled ahead of time, saying so in one line; a
    # compiled decoder loaded from it translates as eager decoding does; translate --compile loads the cached steps
    # (silently) while it decodes, and writes what eager decoding writes
    cache = tmp_path / "cache"  # the user's cache, as ATTNKIT_CACHE names it
    said = _attnkit("compile", run, "--beam", "1", cwd=tmp_path, ATTNKIT_CACHE=str(cache)).stderr
    assert "attnkit: compiling the greedy_step ahead of time" in said
    assert f"compiled for beam sizes 1 in fp32 (the cache: {cache})" in said.splitlines()[-1], said
    packages = list((cache / "compiled").rglob("*.pt2"))
    assert packages and all(p.with_suffix(".json").is_file() for p in packages), packages
    eager, compiled = tmp_path / "eager.de", tmp_path / "compiled.de"
    runs = {}
    for out_file in (eager, compiled):
        extra = [] if out_file == eager else ["--compile"]
        runs[out_file] = _attnkit("translate", "--checkpoint", run, "--input", few, "--output", out_file, "--beam",
                                  "1", *extra, cwd=tmp_path, ATTNKIT_COMPILE="1", ATTNKIT_CACHE=str(cache)).stderr
    assert read_lines(compiled) == read_lines(eager)
    assert "attnkit: compiling" not in runs[compiled] + runs[eager]
    # attnkit.load(...).compile(background=True), as a server starts: translation goes on with the eager decoder
    # while a thread loads (here) or compiles the steps, then the compiled decoder, sealed, takes over
    script = """import sys, attnkit
m = attnkit.load(sys.argv[1])
first = m.decoder
m.compile(beams=(1,), background=True)
assert m.compiling is not None
sentences = open(sys.argv[2], encoding="utf-8").read().splitlines()
meanwhile = m.translate(sentences, beam=1)  # eager or compiled, whichever holds the model now
m.compiling.join(timeout=200)
assert not m.compiling.is_alive() and m.compile_error is None and m.decoder is not first
print(type(m.decoder).__name__)
print("\\n".join(meanwhile))
print("\\n".join(m.translate(sentences, beam=1)))
"""
    out = subprocess.run([sys.executable, "-c", script, str(run), str(few)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "ATTNKIT_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr[-3000:]
    kind, *lines = out.stdout.splitlines()
    assert kind == "CompiledDecoder" and lines == read_lines(eager) * 2
    assert "attnkit: compiling" not in out.stderr  # loaded from the cache attnkit compile filled

    # evaluate 100 validation sentences
    hyps_file, scores_file = tmp_path / "hyps.de", tmp_path / "scores.json"
    _attnkit("evaluate", "--checkpoint", run, "--src", src, "--ref", ref, "--output", hyps_file,
             "--json", scores_file, "--by-length", cwd=tmp_path)
    scores = json.loads(scores_file.read_text())
    hyps = read_lines(hyps_file)
    assert len(hyps) == 100
    # the same sentences translate the same alone or in a batch of 100
    assert hyps[:5] == translations
    # the reported score is sacreBLEU of the written translations
    assert abs(scores["bleu"] - bleu(hyps, val.tgt[:100]).score) < 1e-9
    assert sum(row["n"] for row in scores["by_length"]) == 100

    baseline = bleu(val.src[:100], val.tgt[:100]).score  # copying the English source
    print(f"step {result['step']}, valid loss {result['valid_loss']:.3f}, BLEU {scores['bleu']:.2f}, "
          f"copy-the-source baseline {baseline:.2f}")
    assert scores["bleu"] > baseline + 1.0, (scores["bleu"], baseline)
