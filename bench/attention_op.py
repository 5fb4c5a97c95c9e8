"""The attention op side by side: attnkit's MultiHeadAttention, torch.nn.MultiheadAttention, and the naive
``softmax(Q K^T / sqrt(d)) V`` that builds the n x n matrix — forward, and forward + backward, causal and not.

Batch 8, 8 heads of dimension 64 (d_model 512), sequence length n = 128 .. 4096. All three include the
same input and output projections. Each case runs in its own process, so its peak memory is its own:
the child reports its peak resident set (``VmHWM``) and the resident set before the op ran, whose
difference is the memory the op needed (``op_mb``; the ratios use it). Times are medians of repeats
after a warm-up, on ``--threads`` threads (default 1).

    python bench/attention_op.py            # n = 128 .. 4096 -> bench/results/attention_op.json
    python bench/attention_op.py --quick    # n = 128, 256 -> bench/results/attention_op_quick.json

Targets: >= 1.5x faster than torch.nn.MultiheadAttention at n = 1024 causal, and at n = 4096
a peak at most 1/10 of the naive one's. A naive case that would not fit in memory is skipped and says so.

What bounds the speed ratio is measured too. Every implementation must do the four projections (timed alone,
``projections``, with the same shapes) and the attention's own products: at least the causal triangle's
``2 n(n+1)/2 d_head`` multiply-adds per head for Q K^T and again for the weights times V (three times that
with the backward), which cannot run faster than this machine's matmul peak (measured here). torch's time over
that floor is the best ratio any implementation could reach (``ceiling_vs_torch_mha``). The attention's products
are not square, though: Q K^T has an inner dimension of d_head = 64. So the bench also times them as whole
batched products ([B H, n, 64] x [64, n] and [B H, n, n] x [n, 64], n = 1024) and gives the ceiling at that rate
(``ceiling_vs_torch_mha_at_attention_products_rate``), which no blocked or causal kernel beats by running smaller
products.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

BATCH, HEADS, D_HEAD = 8, 8, 64
IMPLS = ("attnkit", "torch_mha", "naive")
PROJECTIONS = "projections"  # only the four projections: the part of the op no implementation can skip
MODES = ("fwd", "fwd_bwd")


def status_mb(field: str) -> float:
    """VmRSS / VmHWM of this process in MiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def naive_bytes(n: int, mode: str) -> int:
    """What the naive op holds at its peak: the [B, H, n, n] scores, their softmax (and masked copy), and for
    backward the gradients of both."""
    return (3 if mode == "fwd" else 5) * BATCH * HEADS * n * n * 4


def run_case(impl: str, mode: str, causal: bool, n: int, threads: int, budget_s: float) -> dict:
    """In the child process: build the op, time it, report its peak memory."""
    import torch
    import torch.nn.functional as F

    from attnkit.nn import MultiHeadAttention

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    d = HEADS * D_HEAD
    if impl == "attnkit":
        from attnkit import fast

        mha = fast.use(MultiHeadAttention(d, HEADS), "fused_attention")  # as attnkit trains

        def op(x):
            return mha(x, causal=causal)[0]
    elif impl == "torch_mha":
        mha = torch.nn.MultiheadAttention(d, HEADS, batch_first=True)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n) if causal else None

        def op(x):
            return mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal)[0]
    elif impl == PROJECTIONS:
        mha = MultiHeadAttention(d, HEADS)

        def op(x):  # the input projection's [d, 3d] and the output's [d, d], nothing between them
            return mha.out_proj(mha.in_proj(x)[..., :d])
    else:
        mha = MultiHeadAttention(d, HEADS)  # only its projections: the attention is written out

        def op(x):
            q, k, v = (t.view(BATCH, n, HEADS, D_HEAD).transpose(1, 2) for t in mha.in_proj(x).chunk(3, -1))
            scores = q @ k.transpose(-1, -2) / math.sqrt(D_HEAD)
            if causal:
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            out = F.softmax(scores, dim=-1) @ v
            return mha.out_proj(out.transpose(1, 2).reshape(BATCH, n, d))

    x = torch.randn(BATCH, n, d, requires_grad=mode == "fwd_bwd")

    def once():
        if mode == "fwd":
            with torch.no_grad():
                op(x)
        else:
            op(x).sum().backward()
            x.grad = None
            mha.zero_grad(set_to_none=True)

    before = status_mb("VmRSS")
    once()  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < 5 and (len(times) < 2 or time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    peak = status_mb("VmHWM")
    times.sort()
    return {"ms": 1000 * times[len(times) // 2], "repeats": len(times), "peak_mb": round(peak, 1),
            "op_mb": round(peak - before, 1)}


def spawn(impl: str, mode: str, causal: bool, n: int, threads: int, budget_s: float) -> dict:
    cmd = [sys.executable, __file__, "--case", impl, mode, str(int(causal)), str(n), "--threads", str(threads),
           "--budget", str(budget_s)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def attention_flops(n: int, mode: str, causal: bool) -> float:
    """The fewest FLOPs of the attention itself (projections aside): Q K^T and weights @ V over the pairs a query
    may see, the triangle with its diagonal when causal; the backward's four products twice the forward's two."""
    pairs = n * (n + 1) / 2 if causal else n * n
    forward = 2 * (2 * BATCH * HEADS * pairs * D_HEAD)
    return forward if mode == "fwd" else 3 * forward


def attention_products_rate(n: int, repeats: int = 3) -> float:
    """GFLOP/s of the attention's two products for all B H heads at once, full (not causal) n x n: Q K^T, inner
    dimension d_head, and weights @ V, inner dimension n. The best of ``repeats`` after a warm-up."""
    import torch

    q, k, v = (torch.randn(BATCH * HEADS, n, D_HEAD) for _ in range(3))
    weights = torch.randn(BATCH * HEADS, n, n)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        torch.bmm(q, k.transpose(1, 2))
        torch.bmm(weights, v)
        best = min(best, time.perf_counter() - start)
    return 2 * (2 * BATCH * HEADS * n * n * D_HEAD) / best / 1e9


def key(mode: str, causal: bool, n: int) -> str:
    return f"{mode}/{'causal' if causal else 'full'}/n={n}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 128, 256 only (seconds)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of repeats per case (at least 2 repeats)")
    ap.add_argument("--out", help="default bench/results/attention_op.json (attention_op_quick.json with --quick)")
    ap.add_argument("--case", nargs=4, metavar=("IMPL", "MODE", "CAUSAL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        impl, mode, causal, n = args.case
        print(json.dumps(run_case(impl, mode, causal == "1", int(n), args.threads, args.budget)))
        return 0

    lengths = [128, 256] if args.quick else [128, 256, 512, 1024, 2048, 4096]
    systems: dict[str, dict] = {impl: {} for impl in IMPLS}
    for n in lengths:
        for mode in MODES:
            for causal in (False, True):
                for impl in IMPLS:
                    if impl == "naive" and naive_bytes(n, mode) > 0.7 * mem_available():
                        r = {"skipped": f"would need about {naive_bytes(n, mode) / 2**30:.1f} GiB"}
                    else:
                        r = spawn(impl, mode, causal, n, args.threads, args.budget)
                    systems[impl][key(mode, causal, n)] = r
                    shown = f"{r['ms']:9.1f} ms  peak {r['peak_mb']:7.0f} MB  op {r['op_mb']:7.0f} MB" \
                        if "ms" in r else r.get("skipped") or r.get("error")
                    print(f"{impl:>9} {key(mode, causal, n):<22} {shown}", flush=True)

    def ratio(a: dict, b: dict, field: str) -> float | None:
        return round(a[field] / b[field], 3) if field in a and field in b and b[field] > 0 else None

    # the ceiling of the speed ratio at the target's length: the projections as measured, the attention at peak
    from attnkit.evaluate.results import matmul_peak

    n_speed = 1024 if 1024 in lengths else lengths[-1]
    peak = max(matmul_peak(args.threads) for _ in range(2))
    products = attention_products_rate(n_speed)
    print(f"the attention's products as whole batched matmuls at n={n_speed}: {products:.0f} GFLOP/s", flush=True)
    ceiling = {}
    for mode in MODES:
        proj = spawn(PROJECTIONS, mode, True, n_speed, args.threads, args.budget)
        if "ms" not in proj:
            ceiling[mode] = {"error": proj.get("error")}
            continue
        flops = attention_flops(n_speed, mode, True)
        floor_ms = proj["ms"] + 1000 * flops / (peak * 1e9)
        at_products_ms = proj["ms"] + 1000 * flops / (products * 1e9)
        torch_ms = systems["torch_mha"][key(mode, True, n_speed)].get("ms")
        ours_ms = systems["attnkit"][key(mode, True, n_speed)].get("ms")
        ceiling[mode] = {
            "projections_ms": round(proj["ms"], 1), "floor_ms": round(floor_ms, 1),
            "ceiling_vs_torch_mha": round(torch_ms / floor_ms, 3) if torch_ms else None,
            "floor_at_attention_products_rate_ms": round(at_products_ms, 1),
            "ceiling_vs_torch_mha_at_attention_products_rate":
                round(torch_ms / at_products_ms, 3) if torch_ms else None,
            # the rate attnkit's attention (its time less the projections') runs the causal triangle's FLOPs at
            "attnkit_attention_gflop_per_s": round(flops / ((ours_ms - proj["ms"]) / 1000) / 1e9, 1)
            if ours_ms and ours_ms > proj["ms"] else None}
        print(f"{mode}: projections alone {proj['ms']:.1f} ms, + attention at the {peak:.0f} GFLOP/s peak = "
              f"{floor_ms:.1f} ms: no implementation can be more than {ceiling[mode]['ceiling_vs_torch_mha']}x "
              f"faster than torch.nn.MultiheadAttention at n={n_speed} causal; at the attention products' "
              f"{products:.0f} GFLOP/s, {ceiling[mode]['ceiling_vs_torch_mha_at_attention_products_rate']}x; "
              f"attnkit's attention ran at {ceiling[mode]['attnkit_attention_gflop_per_s']} GFLOP/s", flush=True)

    ours = systems["attnkit"]
    ratios = {"torch_mha_time_over_attnkit": {k: ratio(systems["torch_mha"][k], v, "ms") for k, v in ours.items()},
              "naive_time_over_attnkit": {k: ratio(systems["naive"][k], v, "ms") for k, v in ours.items()},
              "naive_op_memory_over_attnkit": {k: ratio(systems["naive"][k], v, "op_mb") for k, v in ours.items()}}
    n_mem = lengths[-1]
    speed = {m: ratios["torch_mha_time_over_attnkit"][key(m, True, n_speed)] for m in MODES}
    memory = {m: ratios["naive_op_memory_over_attnkit"][key(m, True, n_mem)] for m in MODES}
    metrics = {f"speedup_vs_torch_mha_causal_n{n_speed}": speed, f"naive_memory_over_attnkit_causal_n{n_mem}": memory,
               f"ceiling_vs_torch_mha_causal_n{n_speed}": {m: ceiling[m].get("ceiling_vs_torch_mha") for m in MODES},
               "ceiling": {"matmul_peak_gflop_per_s": round(peak, 1),
                           "attention_products_gflop_per_s": round(products, 1), **ceiling},
               "targets": {"speedup_vs_torch_mha_causal_n1024": 1.5, "naive_memory_over_attnkit_n4096": 10.0}}
    for m in MODES:
        print(f"{m}: torch.nn.MultiheadAttention / attnkit time at n={n_speed} causal: {speed[m]}; "
              f"naive / attnkit op memory at n={n_mem} causal: {memory[m]}")

    from attnkit.evaluate.results import write_results

    out = args.out or f"bench/results/attention_op{'_quick' if args.quick else ''}.json"
    command = "python bench/attention_op.py" + (" --quick" if args.quick else "") + f" --threads {args.threads}"
    write_results(out, "attention_op", command, metrics, systems=systems, ratios=ratios, quick=args.quick,
                  shape={"batch": BATCH, "heads": HEADS, "d_head": D_HEAD, "lengths": lengths},
                  threads=args.threads)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
