"""MKL's kernels chosen by the CPU's instructions (attnkit.mkl): when the library is loaded, that MKL then runs
AVX-512 kernels on an AMD CPU that has them, that its products are right, and that a misspelt choice is refused."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnkit import mkl

AMD_AVX512 = "vendor_id\t: AuthenticAMD\ncpu family\t: 26\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16\n"
AMD_AVX2 = "vendor_id\t: AuthenticAMD\ncpu family\t: 23\nflags\t\t: fpu avx avx2 fma\n"
INTEL_AVX512 = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nflags\t\t: fpu avx2 avx512f amx_bf16\n"
PLAIN = {k: v for k, v in os.environ.items() if k != "ATTNKIT_MKL"}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


THIS_CPU_AMD_AVX512 = mkl.amd_with_avx512(_cpuinfo())
HAS_COMPILER = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))


def test_only_an_amd_cpu_with_avx512_is_named():
    assert mkl.amd_with_avx512(AMD_AVX512)
    assert not mkl.amd_with_avx512(AMD_AVX2)  # its AVX2 code is what MKL runs there already
    assert not mkl.amd_with_avx512(INTEL_AVX512)  # MKL picks by features there already
    assert not mkl.amd_with_avx512("")


@pytest.mark.parametrize("environ, cpuinfo, torch_imported, expected", [
    ({}, AMD_AVX512, False, True),
    ({"ATTNKIT_MKL": "features"}, AMD_AVX512, False, True),
    ({"ATTNKIT_MKL": "vendor"}, AMD_AVX512, False, False),  # MKL's own choice asked for
    ({}, AMD_AVX512, True, False),  # libtorch's calls are bound already
    ({}, AMD_AVX2, False, False),
    ({}, INTEL_AVX512, False, False),
])
def test_the_library_is_loaded_only_where_it_applies(environ, cpuinfo, torch_imported, expected):
    assert mkl.applies(environ, cpuinfo, torch_imported) is expected


def test_a_misspelt_choice_is_refused():
    with pytest.raises(mkl.MklChoiceError, match="ATTNKIT_MKL='avx512': expected one of features, vendor"):
        mkl.choice({"ATTNKIT_MKL": "avx512"})


def test_the_command_line_refuses_a_misspelt_choice_in_one_line():
    out = subprocess.run([sys.executable, "-m", "attnkit", "demo", "--help"], capture_output=True, text=True,
                         env={**PLAIN, "ATTNKIT_MKL": "avx512"})
    assert out.returncode == 2
    assert out.stderr == "attnkit: error: ATTNKIT_MKL='avx512': expected one of features, vendor\n"


def test_load_refuses_a_misspelt_choice(tmp_path):
    script = "import attnkit\ntry:\n    attnkit.load('nowhere')\nexcept ValueError as e:\n    print(e)\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**PLAIN, "ATTNKIT_MKL": "avx512"}, check=True)
    assert out.stdout == "ATTNKIT_MKL='avx512': expected one of features, vendor\n"


@pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler: the library cannot be built")
def test_the_built_library_answers_yes_and_is_built_once(tmp_path):
    path = mkl.build_library(tmp_path)
    assert path is not None and path.parent == tmp_path
    library = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    assert library.mkl_serv_intel_cpu_true() == 1
    built = path.stat().st_mtime_ns
    assert mkl.build_library(tmp_path) == path and path.stat().st_mtime_ns == built
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing left of the build


def _kernels(environ: dict, torch_first: bool = False) -> list[str]:
    """[the library loaded or "None", MKL's kernels] in a fresh interpreter that asks for MKL's feature kernels
    (after importing torch where ``torch_first``)."""
    script = ("import torch\n" if torch_first else "") + (
        "import attnkit.mkl as m\nm.use_feature_kernels()\nprint(m._loaded)\nprint(m.kernels())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, check=True)
    return out.stdout.splitlines()


@pytest.mark.skipif(not (THIS_CPU_AMD_AVX512 and HAS_COMPILER), reason="needs an AMD CPU with AVX-512 and a C compiler")
def test_on_an_amd_cpu_with_avx512_mkl_runs_its_avx512_kernels(tmp_path):
    environ = {**PLAIN, "ATTNKIT_CACHE": str(tmp_path)}
    loaded, kernels = _kernels(environ)
    assert Path(loaded).parent == tmp_path / "mkl"
    assert kernels.startswith("AVX-512")
    # MKL's own choice, asked for or left because torch came first: not its AVX-512 kernels
    for asked, torch_first in (({"ATTNKIT_MKL": "vendor"}, False), ({}, True)):
        loaded, kernels = _kernels({**environ, **asked}, torch_first)
        assert loaded == "None"
        assert not kernels.startswith("AVX-512")


@pytest.mark.skipif(not (THIS_CPU_AMD_AVX512 and HAS_COMPILER), reason="needs an AMD CPU with AVX-512 and a C compiler")
def test_mkl_avx512_products_are_right(tmp_path):
    # transposed operands included: MKL reads them in place, with no copy, where oneDNN's products need one
    script = """
import attnkit.mkl as m
m.use_feature_kernels()
import torch
assert m.kernels().startswith("AVX-512"), m.kernels()
g = torch.Generator().manual_seed(0)
worst = 0.0
for (rows, inner, cols) in [(1496, 128, 384), (256, 6000, 128), (37, 32, 13)]:
    a, b = torch.randn(rows, inner, generator=g), torch.randn(inner, cols, generator=g)
    exact = a.double() @ b.double()
    for got in (a @ b, torch.mm(a.t().contiguous().t(), b), torch.bmm(a[None], b[None])[0]):
        worst = max(worst, float((got.double() - exact).abs().max() / exact.abs().max()))
print(worst)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**PLAIN, "ATTNKIT_CACHE": str(tmp_path)})
    assert float(out.stdout) < 1e-5


def test_importing_attnkit_builds_and_loads_nothing(tmp_path):
    """Importing attnkit changes nothing process-wide: no library is built or loaded until asked for."""
    script = "import attnkit, attnkit.mkl as m\nimport torch\nprint(m._loaded)\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**PLAIN, "ATTNKIT_CACHE": str(tmp_path)})
    assert out.stdout == "None\n" and not (tmp_path / "mkl").exists()
    maps = subprocess.run([sys.executable, "-c", "import attnkit, attnkit.api\nprint(open('/proc/self/maps').read())"],
                          capture_output=True, text=True, check=True, env={**PLAIN, "ATTNKIT_CACHE": str(tmp_path)})
    assert "mkl_features" not in maps.stdout


def test_the_command_line_can_still_ask_when_its_module_is_imported():
    """``attnkit.cli.main`` asks for MKL's kernels as the process starts, which only works before torch is loaded:
    importing the command line's module (the console script's first step) loads no torch, so the command runs the
    kernels that :func:`attnkit.load` runs (and the packages it compiles are found under the same key)."""
    script = "import sys, attnkit.cli\nassert 'torch' not in sys.modules, 'attnkit.cli imported torch'\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=PLAIN)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_results_json_records_mkl_s_kernels_and_the_setting_that_chose_them(tmp_path, monkeypatch):
    from attnkit.evaluate.results import write_results

    monkeypatch.setenv("ATTNKIT_MKL", "vendor")
    record = json.loads(write_results(tmp_path / "r.json", "r", "python bench/r.py", {}).read_text())
    assert record["command"] == "ATTNKIT_MKL=vendor python bench/r.py"  # what the reader must set to measure it again
    assert record["mkl_kernels"] == mkl.kernels()
    monkeypatch.delenv("ATTNKIT_MKL")
    record = json.loads(write_results(tmp_path / "r.json", "r", "python bench/r.py", {}).read_text())
    assert record["command"] == "python bench/r.py"
