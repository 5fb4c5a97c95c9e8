"""The fast runtime's 16-bit CPU dropout (``attnkit.fast.dropout``): the statistics and gradient of nn.Dropout,
reproducible from the seed; and the allocator setting that keeps freed memory for reuse (``attnkit.fast.memory``)."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attnkit.fast.dropout import Dropout16, dropout16


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drops_a_fraction_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(2_000_000)
    y = dropout16(x, p)
    dropped = float(y.eq(0).float().mean())
    assert abs(dropped - p) < 5 * (p * (1 - p) / x.numel()) ** 0.5 + 1e-4  # 5 sigma, plus the 1/65536 rounding
    survivors = y[y.ne(0)]
    assert torch.allclose(survivors, torch.full_like(survivors, survivors[0].item()))
    assert abs(survivors[0].item() - 1 / (1 - p)) < 1e-4
    assert abs(float(y.double().mean()) - 1.0) < 5e-3


def test_masks_are_independent_of_position():
    # each 64-bit draw feeds four elements: neighbours must still be dropped independently
    torch.manual_seed(1)
    kept = dropout16(torch.ones(4_000_000), 0.5).ne(0).view(-1, 4).float()
    assert (kept.mean(0) - 0.5).abs().max() < 2e-3
    assert abs(float((kept[:, 0] * kept[:, 1]).mean()) - 0.25) < 2e-3  # within one draw
    assert abs(float((kept[:-1, 3] * kept[1:, 0]).mean()) - 0.25) < 2e-3  # across two draws


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout16(x, 0.25)
    g = torch.randn_like(y)
    y.backward(g)
    kept = y.detach().ne(0)
    assert torch.equal(x.grad.ne(0), kept)
    torch.testing.assert_close(x.grad, torch.where(kept, g / 0.75, torch.zeros_like(g)), rtol=1e-6, atol=0)
    x64 = torch.randn(5, 7, dtype=torch.double, requires_grad=True)
    torch.manual_seed(3)
    assert torch.autograd.gradcheck(lambda t: (torch.manual_seed(3), dropout16(t, 0.4))[1], (x64,))


def test_seeded_masks_repeat_and_eval_is_identity():
    layer = Dropout16(0.3)
    x = torch.randn(10, 100)
    torch.manual_seed(4)
    a = layer(x)
    torch.manual_seed(4)
    assert torch.equal(layer(x), a)
    assert not torch.equal(layer(x), a)
    layer.eval()
    assert layer(x) is x
    assert torch.equal(dropout16(x, 1.0), torch.zeros_like(x))
    assert dropout16(x, 0.0) is x
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout16(1.5)


def test_matches_torch_dropout_in_distribution_of_a_trained_statistic():
    # the same model output variance as PyTorch's dropout: Var = x^2 p / (1 - p) per element
    torch.manual_seed(5)
    x = torch.full((1_000_000,), 2.0)
    ours, theirs = dropout16(x, 0.3), F.dropout(x, 0.3, True)
    assert abs(float(ours.var()) - float(theirs.var())) < 0.05 * float(theirs.var())


_FAULTS = """
import resource, sys, torch
from attnkit.fast.memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def fill():
    torch.empty(16 << 20).fill_(1.0)  # 64 MiB, freed at once
for _ in range(20):  # glibc settles where it keeps the block
    fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.internals  # counts page faults: glibc's and torch's CPU allocator's behaviour
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_reuses_pages_instead_of_faulting_them_in_again():
    faults = {mode: int(subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True,
                                       check=True, env={"PATH": "/usr/bin:/bin"}).stdout)
              for mode in ("default", "keep")}
    assert faults["default"] > 5 * 16_000  # a fresh mmap each time: one fault per 4 KiB page
    assert faults["keep"] < 1_000  # the same pages again
