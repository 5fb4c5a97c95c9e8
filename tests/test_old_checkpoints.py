"""Checkpoints written by attnkit 0.1 (one per family, tests/fixtures/checkpoints_0_1, made by
runs/fixtures/make_old.py) load into today's models and compute what they computed then."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnkit
from attnkit import registry
from attnkit.checkpoint import load_checkpoint

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoints_0_1"
CHECKPOINTS = sorted(p for p in FIXTURES.iterdir() if p.is_dir())
FAMILIES = {name for name, f in registry.FAMILIES.items() if f.in_0_1}


def test_every_family_has_a_fixture():
    assert {p.name for p in CHECKPOINTS} == FAMILIES


def _reference(directory: Path) -> tuple[dict, dict]:
    ref = load_file(str(directory / "reference.safetensors"))
    inputs = {k.removeprefix("input."): v for k, v in ref.items() if k.startswith("input.")}
    outputs = {k.removeprefix("output."): v for k, v in ref.items() if k.startswith("output.")}
    return inputs, outputs


def _source(inputs: dict):
    """The recorded source: token ids, an image grid, or nothing (a language model)."""
    return inputs.get("src", inputs.get("features"))


def _check_forward(model, directory: Path) -> None:
    inputs, outputs = _reference(directory)
    with torch.no_grad():
        plain = model(_source(inputs), inputs["tgt_in"])
        weighted = model(_source(inputs), inputs["tgt_in"], need_weights=True)
    torch.testing.assert_close(plain.logits, outputs["logits"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weighted.logits, outputs["logits"], atol=1e-5, rtol=1e-5)
    if directory.name == "show_attend_tell":
        torch.testing.assert_close(weighted.attention.cross[0][:, 0], outputs["alphas"], atol=1e-5, rtol=1e-5)
    else:
        assert "alphas" not in outputs


@pytest.mark.parametrize("directory", CHECKPOINTS, ids=lambda p: p.name)
def test_load_checkpoint_reproduces_the_recorded_outputs(directory):
    model, cfg, _, path = load_checkpoint(directory)
    assert path == directory and model.family == cfg.model.family == directory.name
    assert not model.training
    _check_forward(model, directory)


@pytest.mark.parametrize("directory", CHECKPOINTS, ids=lambda p: p.name)
def test_attnkit_load_works(directory):
    m = attnkit.load(directory)
    assert m.family == directory.name and m.path == directory
    core, _, _, _ = load_checkpoint(directory)
    for (name, a), (_, b) in zip(m.module.state_dict().items(), core.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    _check_forward(m.module, directory)  # with the fast runtime's decoding kernels installed
    if "translate" in m.capabilities:
        out = m.translate(["1 May 2000", "12 December 1999"], beam=2)
        assert isinstance(out, list) and len(out) == 2 and all(isinstance(t, str) for t in out)
        [score] = m.score(["1 May 2000"], [out[0]])
        assert math.isfinite(score) and score <= 0
    elif "generate" in m.capabilities:
        text = m.generate("First", max_new_tokens=8, seed=0)
        assert isinstance(text, str) and text.startswith("First") and len(text) > len("First")
        [score] = m.score(["Before we"])
        assert math.isfinite(score) and score < 0
    else:
        assert "caption" in m.capabilities
