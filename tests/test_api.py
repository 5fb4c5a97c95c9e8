"""``attnkit.load``: a trained model in one line, with what its family can do, equal to the core's functions."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnkit
from attnkit.checkpoint import load_checkpoint, record_files
from attnkit.data import generate_dates
from attnkit.decode import Alignment, translate
from attnkit.errors import AttnkitError
from attnkit.tokens import BOS, EOS

SENTENCES = generate_dates(6, seed=11).src


@pytest.fixture(scope="module")
def loaded(trained_checkpoint):
    return attnkit.load(trained_checkpoint)


@pytest.fixture(scope="module")
def core(trained_checkpoint):
    """The same checkpoint as the core model: no fast-runtime trick, decoded by attnkit.decode."""
    return load_checkpoint(trained_checkpoint)


def test_load_gives_the_checkpoint_in_eval_mode(loaded, core, trained_checkpoint):
    model, cfg, _, path = core
    assert loaded.path == path == trained_checkpoint
    assert loaded.family == "transformer" and loaded.capabilities == model.capabilities
    assert {"translate", "score", "attention", "align"} <= loaded.capabilities
    assert not loaded.module.training and loaded.config == cfg
    for (name, a), (_, b) in zip(loaded.module.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name
    assert "transformer" in repr(loaded)


def test_translate_str_and_list_equal_the_core(loaded, core):
    model, cfg, toks, _ = core
    d = cfg.decode
    for beam in (None, 1):
        expected = [t.text[0] for t in translate(model, toks, SENTENCES, beam_size=beam or d.beam_size,
                                                 len_penalty=d.len_penalty, max_len_a=d.max_len_a,
                                                 max_len_b=d.max_len_b)]
        got = loaded.translate(SENTENCES, beam=beam)
        assert isinstance(got, list) and got == expected
        one = loaded.translate(SENTENCES[0], beam=beam)
        assert isinstance(one, str) and one == expected[0]


def _pair_ids(toks, source: str, target: str):
    src = torch.tensor([toks.src.encode([source])[0] + [EOS]])
    ids = toks.tgt.encode([target])[0]
    return src, torch.tensor([[BOS] + ids]), torch.tensor([ids + [EOS]])


def test_score_is_the_models_log_probability(loaded, core):
    model, _, toks, _ = core
    targets = generate_dates(len(SENTENCES), seed=11).tgt
    targets[-1] = targets[0]  # a wrong translation scores too
    scores = loaded.score(SENTENCES, targets)
    assert isinstance(scores, list) and len(scores) == len(SENTENCES)
    for source, target, score in zip(SENTENCES, targets, scores):
        assert math.isfinite(score) and score < 0
        src, tgt_in, tgt_out = _pair_ids(toks, source, target)
        with torch.no_grad():
            out = model(src, tgt_in, targets=tgt_out)
            # and the same sum, token by token, from the decoding steps
            state, total = model.init_state(model.encode(src)), 0.0
            for t in range(tgt_in.size(1)):
                log_probs, state, _ = model.step(tgt_in[:, t], state)
                total += float(log_probs[0, tgt_out[0, t]])
        assert score == pytest.approx(-float(out.nll), rel=1e-6, abs=1e-5)
        assert score == pytest.approx(total, rel=1e-6, abs=1e-5)
    with pytest.raises(AttnkitError, match="sources but"):
        loaded.score(SENTENCES, targets[:2])


def test_attention_maps(loaded, core):
    model, cfg, toks, _ = core
    source = SENTENCES[1]
    att = loaded.attention(source)
    translation = loaded.translate(source)
    S = len(toks.src.encode([source])[0]) + 1  # EOS
    T = len(toks.tgt.encode([translation])[0]) + 1  # BOS
    H = cfg.model.n_heads
    assert att.source == toks.src.pieces(source) + ["</s>"] and len(att.source) == S
    assert att.target[0] == "<s>" and len(att.target) == T
    assert len(att.encoder) == cfg.model.n_encoder_layers and len(att.decoder) == len(att.cross) == \
        cfg.model.n_decoder_layers
    for w in att.cross:
        assert w.shape == (H, T, S)
        torch.testing.assert_close(w.sum(-1), torch.ones(H, T))
        assert (w >= 0).all()
    for w in att.encoder:
        assert w.shape == (H, S, S)
        torch.testing.assert_close(w.sum(-1), torch.ones(H, S))
    for w in att.decoder:
        assert w.shape == (H, T, T)
        torch.testing.assert_close(w.sum(-1), torch.ones(H, T))
        assert torch.equal(w.triu(1), torch.zeros_like(w))  # nothing above the diagonal: no look at the future
    # the maps are the core model's, of the given target
    src, tgt_in, _ = _pair_ids(toks, source, translation)
    with torch.no_grad():
        maps = model(src, tgt_in, need_weights=True).attention
    for ours, theirs in ((att.encoder, maps.encoder), (att.decoder, maps.decoder), (att.cross, maps.cross)):
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b[0])


def test_attention_never_leaks_the_future(loaded):
    """The rows of a target prefix do not change with what follows it (nor does the source side)."""
    source = SENTENCES[2]
    short, long = loaded.attention(source, "2001-02-03"), loaded.attention(source, "2001-02-03 1999-12-31")
    n = len(short.target)
    assert n >= 3 and len(long.target) > n and long.target[:n] == short.target
    for a, b in zip(short.decoder, long.decoder, strict=True):
        torch.testing.assert_close(a, b[:, :n, :n])
        assert torch.equal(b[:, :n, n:], torch.zeros_like(b[:, :n, n:]))
    for a, b in zip(short.cross, long.cross, strict=True):
        torch.testing.assert_close(a, b[:, :n])
    for a, b in zip(short.encoder, long.encoder, strict=True):
        torch.testing.assert_close(a, b)


def test_align_returns_an_alignment(loaded, core):
    model, _, toks, _ = core
    source = SENTENCES[3]
    alignment = loaded.align(source)
    assert isinstance(alignment, Alignment)
    [translation] = loaded.translate([source], details=True)
    assert alignment.translation == translation.text[0] == loaded.translate(source)
    tokens = translation.hypotheses[0].tokens
    assert alignment.source == toks.src.pieces(source) + ["</s>"]
    assert alignment.target == toks.tgt.id_to_piece(tokens) + ["</s>"]
    assert alignment.weights.shape == (len(tokens) + 1, len(alignment.source))
    torch.testing.assert_close(alignment.weights.sum(-1), torch.ones(len(alignment.target)))
    # the core model's cross-attention over the chosen translation, teacher-forced
    src = torch.tensor([toks.src.encode([source])[0] + [EOS]])
    with torch.no_grad():
        cross = model(src, torch.tensor([[BOS] + tokens]), need_weights=True).attention.cross
    torch.testing.assert_close(alignment.weights, torch.stack([w[0] for w in cross]).mean((0, 1)))
    one = loaded.align(source, layer=1, head=2)
    assert "layer 1, head 2" in one.description
    torch.testing.assert_close(one.weights, cross[0][0, 1])


def test_what_the_family_cannot_do_is_a_one_line_error(loaded):
    for call in (lambda: loaded.generate("1 May"), lambda: loaded.caption("x.jpg")):
        with pytest.raises(AttnkitError) as e:
            call()
        message = str(e.value)
        assert "transformer" in message and "\n" not in message


def _copy_with_weights(checkpoint: Path, to: Path, bias: float) -> Path:
    """A copy of the checkpoint whose first LayerNorm bias is ``bias`` (to tell copies apart by their weights)."""
    shutil.copytree(checkpoint, to)
    weights = load_file(str(to / "model.safetensors"))
    weights[NORM_BIAS] = torch.full_like(weights[NORM_BIAS], bias)
    save_file(weights, str(to / "model.safetensors"), metadata={"format": "pt"})
    record_files(to)  # edited on purpose: re-record its files' hashes, or loading refuses it as damaged
    return to


NORM_BIAS = "encoder.0.attn_res.norm.bias"


def test_run_directory_resolves_best_then_averaged_then_last(trained_checkpoint, tmp_path):
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"
    steps = {name: _copy_with_weights(trained_checkpoint, checkpoints / f"step-{i}", float(i))
             for i, name in enumerate(("last", "averaged", "best"), start=1)}

    def loaded_from():
        m = attnkit.load(run)
        bias = float(m.module.state_dict()[NORM_BIAS][0])
        return m.path, bias

    for i, name in enumerate(("last", "averaged", "best"), start=1):
        (checkpoints / name).symlink_to(steps[name].name)
        assert loaded_from() == (steps[name].resolve(), float(i))  # the best present wins
    (checkpoints / "best").unlink()
    assert loaded_from() == (steps["averaged"].resolve(), 2.0)
    (checkpoints / "averaged").unlink()
    assert loaded_from() == (steps["last"].resolve(), 1.0)
    # a checkpoint directory is itself
    m = attnkit.load(steps["best"])
    assert m.path == steps["best"] and float(m.module.state_dict()[NORM_BIAS][0]) == 3.0
    (checkpoints / "last").unlink()
    with pytest.raises(AttnkitError, match="not a checkpoint"):
        attnkit.load(run)
    with pytest.raises(AttnkitError, match="no such checkpoint"):
        attnkit.load(tmp_path / "nowhere")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def test_loading_imports_no_training_and_import_no_torch(trained_checkpoint):
    proc = _python(f"import attnkit, sys; attnkit.load({str(trained_checkpoint)!r}); "
                   "assert 'attnkit.train.trainer' not in sys.modules and 'attnkit.train' not in sys.modules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _python("import attnkit, sys; assert 'torch' not in sys.modules, 'torch imported'")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_translation_models_compile_by_default_at_their_first_large_job(trained_checkpoint, monkeypatch):
    """``attnkit.load``: a Transformer translation model compiles at its first ``translate`` of at least
    COMPILE_PAYS_AT sentences (never on loading, nor for its attention maps), once; ``compile=True`` compiles at the
    first decoding whatever its size, ``compile=False`` and ATTNKIT_COMPILE=0 never; a language model only when
    asked; a server (no job size) compiles; a bad ATTNKIT_COMPILE is one line naming it."""
    import attnkit.fast
    from attnkit.api import Model
    from attnkit.config import PRESETS
    from attnkit.fast import compiles_by_default
    from attnkit.models import build_model
    from attnkit.models.lm import LMConfig
    from conftest import make_model

    compiled = []
    monkeypatch.setattr(Model, "compile", lambda self, **kw: compiled.append(self) or setattr(self, "_compile", False)
                        or self)
    monkeypatch.setattr(attnkit.fast, "COMPILE_PAYS_AT", 3)
    monkeypatch.setenv("ATTNKIT_COMPILE", "1")
    model = attnkit.load(trained_checkpoint)
    model.attention("1 May 2001")
    model.translate(["1 May 2001", "2 May 2001"])
    assert compiled == []  # too few sentences to repay a compiled start
    model.translate(["1 May 2001", "2 May 2001", "3 May 2001"])
    model.translate(["1 May 2001", "2 May 2001", "3 May 2001"])
    assert compiled == [model]  # once
    attnkit.load(trained_checkpoint, compile=False).translate(["1 May 2001"] * 3)
    assert compiled == [model]
    attnkit.load(trained_checkpoint, compile=True).translate("1 May 2001")
    assert len(compiled) == 2
    monkeypatch.setenv("ATTNKIT_COMPILE", "0")
    attnkit.load(trained_checkpoint).translate(["1 May 2001"] * 3)
    assert len(compiled) == 2

    monkeypatch.setenv("ATTNKIT_COMPILE", "1")
    assert compiles_by_default(make_model()) and compiles_by_default(make_model(), 3)
    assert not compiles_by_default(make_model(), 2)
    assert not compiles_by_default(build_model(LMConfig(**PRESETS["lm_tiny"]), 0, 30))
    monkeypatch.setenv("ATTNKIT_COMPILE", "yes")
    with pytest.raises(AttnkitError, match=r"^ATTNKIT_COMPILE='yes': expected 0 .* or 1$"):
        compiles_by_default(make_model())


def test_a_background_compile_that_fails_leaves_the_model_decoding_eagerly(trained_checkpoint, monkeypatch, caplog):
    """A compiler's failure in the background thread is recorded and logged in one line; the eager decoder goes on
    translating (a server keeps answering)."""
    from attnkit import fast

    model = attnkit.load(trained_checkpoint, compile=False)
    expected, eager = model.translate(["1 May 2000"], beam=1), model.decoder
    real = fast.decoder

    def failing(module, compile=False, **options):
        if compile:
            raise RuntimeError("the C++ compiler is missing\nsecond line")
        return real(module, **options)

    monkeypatch.setattr(fast, "decoder", failing)
    model.compile(beams=(1,), background=True)
    model.compiling.join(timeout=60)
    assert isinstance(model.compile_error, RuntimeError) and model.decoder is eager
    [record] = [r for r in caplog.records if "compiling failed" in r.getMessage()]
    assert "\n" not in record.getMessage() and "the C++ compiler is missing second line" in record.getMessage()
    assert model.translate(["1 May 2000"], beam=1) == expected
