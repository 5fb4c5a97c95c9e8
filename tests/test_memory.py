"""A process that meets new product shapes keeps a bounded number of compiled kernels (attnkit.fast.memory)."""

import os
import subprocess
import sys

import pytest

from attnkit.fast.memory import KERNEL_CACHE_CAPACITY, bound_kernel_caches
from attnkit.fast.precision import NEEDS, cpu_flags

# bf16 products of as many shapes as a few hundred training batches meet (the number of tokens varies), forward
# and backward under autocast, as a training step runs them; prints the growth of the resident set, in MiB,
# between the 50th shape and the last
_SHAPES = """
import random, sys, torch
from attnkit.fast.memory import bound_kernel_caches, keep_freed_memory
keep_freed_memory()  # as the command line
if sys.argv[1] == "bounded":
    bound_kernel_caches()
torch.set_num_threads(1)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
w1 = torch.randn(512, 128, requires_grad=True)
w2 = torch.randn(128, 512, requires_grad=True)
for i, m in enumerate(random.Random(0).sample(range(64, 2048), 250)):
    if i == 50:
        start = rss()
    x = torch.randn(m, 128, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(torch.nn.functional.linear(x, w1).relu(), w2)
    y.float().sum().backward()
print(rss() - start)
"""


def test_bound_kernel_caches_leaves_what_the_environment_sets(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert bound_kernel_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE_CAPACITY),
                                     "LRU_CACHE_CAPACITY": "7"}
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(KERNEL_CACHE_CAPACITY)


@pytest.mark.internals  # measures the resident set: oneDNN's and ideep's caches
@pytest.mark.skipif(not sys.platform.startswith("linux") or not set(NEEDS["bf16"]) & cpu_flags(),
                    reason="bf16 products through oneDNN, measured in /proc")
def test_bounded_kernel_caches_keep_a_process_flat_over_new_product_shapes():
    env = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
                                                             "LD_PRELOAD")}
    growth = {mode: float(subprocess.run([sys.executable, "-c", _SHAPES, mode], capture_output=True, text=True,
                                         check=True, env=env).stdout)
              for mode in ("default", "bounded")}
    assert growth["default"] > 150, growth  # a kernel kept for every shape met
    assert growth["bounded"] < 40, growth
