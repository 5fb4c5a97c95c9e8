"""The fast runtime's 16-bit CPU dropout (``attnkit.fast.dropout``): the statistics and gradient of nn.Dropout,
reproducible from the seed, its compiled kernel equal to its formula; and the allocator setting that keeps freed
memory for reuse (``attnkit.fast.memory``)."""

import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attnkit.fast import dropout as fast_dropout
from attnkit.fast.dropout import Dropout16, dropout16, dropout_mask, uniforms

HAS_COMPILER = shutil.which("cc") is not None or shutil.which("gcc") is not None


def _splitmix64_uniforms(n: int, key: int) -> list[int]:
    """The module's formula in Python's own integers: an oracle apart from NumPy's vector arithmetic."""
    out = []
    for j in range((n + 3) // 4):
        z = (key + (j + 1) * 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        z ^= z >> 31
        out += [(z >> (16 * k)) & 0xFFFF for k in range(4)]
    return out[:n]


def test_the_uniforms_are_the_formula():
    for key in (0, 1, 2**63 + 12345, 2**64 - 1):
        assert uniforms(4099, key).tolist() == _splitmix64_uniforms(4099, key)


@pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler: the masks come from NumPy")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_compiled_kernel_makes_the_formulas_masks_bit_for_bit(dtype):
    """Over sizes that end inside a 64-bit hash and on both sides of the kernel's 1024-element chunks."""
    assert fast_dropout.kernels() is not None
    torch.manual_seed(6)
    for n in (1, 3, 4, 5, 1023, 1024, 1025, 2048 + 7, 100_003):
        x = torch.randn(n).to(dtype)
        key = fast_dropout.draw_key()
        y, mask = dropout_mask(x, 19661, key)
        y_ref, mask_ref = dropout_mask(x, 19661, key, native=False)
        assert torch.equal(mask, mask_ref) and torch.equal(y, y_ref), n
        kept = torch.tensor(uniforms(n, key).astype("int64")) >= 19661
        assert torch.equal(mask.ne(0), kept)
        assert torch.equal(y, x * mask)


def test_each_call_takes_one_key_from_torchs_generator():
    torch.manual_seed(7)
    y = dropout16(torch.ones(1000), 0.3)
    after = fast_dropout.draw_key()
    torch.manual_seed(7)
    assert torch.equal(y, dropout_mask(torch.ones(1000), round(0.3 * 65536), fast_dropout.draw_key())[0])
    assert fast_dropout.draw_key() == after  # the generator's stream goes on as after one key, nothing more


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
    # each 64-bit hash feeds four elements: neighbours must still be dropped independently, and so must the same
    # element in two calls (two keys)
    torch.manual_seed(1)
    kept = dropout16(torch.ones(4_000_000), 0.5).ne(0).view(-1, 4).float()
    assert (kept.mean(0) - 0.5).abs().max() < 2e-3
    assert abs(float((kept[:, 0] * kept[:, 1]).mean()) - 0.25) < 2e-3  # within one hash
    assert abs(float((kept[:-1, 3] * kept[1:, 0]).mean()) - 0.25) < 2e-3  # across two hashes
    again = dropout16(torch.ones(4_000_000), 0.5).ne(0).view(-1, 4).float()
    assert abs(float((kept * again).mean()) - 0.25) < 2e-3  # across two calls


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
