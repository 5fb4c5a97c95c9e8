"""Where a compiled decoding step's time goes: attnkit's default decoding (the search steps and the encoder
compiled ahead of time, the weights frozen) of Multi30k test2016 at each precision, greedy and beam 5, batches of
1 and 64, under ``torch.profiler`` with Inductor's kernels named (``cpp.enable_kernel_profile``), one thread.

Every profiled event's own time (self CPU) falls in one group, by its name. The compiled step's events (AOTInductor's
calls into the library, ``aoti_torch_*``, and Inductor's generated kernels, ``graph_*``):

* **step: matrix products**: the library's products (``mm``, ``_int_mm``, oneDNN's ``qlinear``);
* **step: log-softmax and ranking**: generated kernels that compute a log-softmax (the vocabulary's: the step's
  output, with the search's masks and scores fused in), and ``topk``;
* **step: attention**: generated kernels with a softmax (the attention weights, with whatever Inductor fused into
  them: the self-attention cache's reordering and growth, and at int8 the next product's quantization);
* **step: other kernels**: the step's other kernels (layer norms, residual adds, gathers, copies).

The encoder's package (once a batch) is compiled the same way, so its kernels fall in the same four groups.

And outside the compiled step:

* **eager operators**: PyTorch operators run eagerly: the search loop's own tensor work between steps (and the
  encoder and initial state, where their package does not apply);
* **outside the operators**: the profiled wall time no event accounts for: Python (the search loop, the compiled
  step's wrapper), the runtime between operators, and the profiler's own cost, a few microseconds an event. So
  each cell also times the same decoding without the profiler, just before: the difference is the profiler's.

A generated kernel does what Inductor fused into it, so a group is where the time went by kernel, not by formula.
Each cell reports microseconds per output token (and each group's share of the profiled time), and the three
most costly events.

    python bench/profile_decoding.py --checkpoint runs/multi30k_en_de   # -> bench/results/decode_profile.json

Its timings are one pass each, for proportions; ``bench/decode_precision.py`` measures speed.
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import re
import time
from collections import defaultdict

import torch
import torch._inductor.config as inductor_config
from translate_throughput import attnkit_decoder, length_sorted_batches, test_set

from attnkit import fast
from attnkit.checkpoint import resolve_checkpoint
from attnkit.evaluate.results import write_results
from attnkit.fast.memory import keep_freed_memory
from attnkit.fast.precision import NEEDS, PRECISIONS, cpu_flags

GROUPS = ("step: matrix products", "step: log-softmax and ranking", "step: attention", "step: other kernels",
          "eager operators", "outside the operators")
PRODUCTS = re.compile(r"(^|_)(mm|addmm|bmm|baddbmm|matmul)(_out)?$|int_mm|linear_pointwise")


def group(name: str) -> str:
    """The group of a profiled event's name (see the module's docstring)."""
    if not name.startswith(("aoti_torch_", "graph_")):
        return "eager operators"
    short = name.removeprefix("aoti_torch_cpu_")
    if PRODUCTS.search(short):
        return "step: matrix products"
    if "log_softmax" in short or short.startswith("topk"):
        return "step: log-softmax and ranking"
    if "softmax" in short:
        return "step: attention"
    return "step: other kernels"


def leaf_events(profile) -> list:
    """The profiled events totalled by name, those with time of their own (self CPU time: their time less that of
    the events inside them)."""
    return [e for e in profile.key_averages() if e.self_cpu_time_total > 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--data-dir")
    ap.add_argument("--precision", nargs="+", default=None,
                    help="precisions to profile (default: those this CPU has the instructions for)")
    ap.add_argument("--batch1-sentences", type=int, default=60)
    ap.add_argument("--batch64-sentences", type=int, default=320)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/decode_profile.json")
    args = ap.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)

    (model, cfg, toks, path), refs, ids, order = test_set(resolve_checkpoint(args.checkpoint), args.data_dir, 0)
    flags = cpu_flags()
    precisions = args.precision or [p for p in PRECISIONS if p == "fp32" or any(f in flags for f in NEEDS[p])]
    cells: dict[str, dict] = {}
    # packages of their own (cache=False: not the user's cached ones), which name their kernels to the profiler
    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        for precision in precisions:
            decoder = fast.decoder(model, precision=precision, compile=True, freeze=True,
                                   cache=False)
            decode = attnkit_decoder(decoder)
            for beam in (1, 5):
                for size, count in ((1, args.batch1_sentences), (64, args.batch64_sentences)):
                    batches = length_sorted_batches(ids, [i for i in order if i < count], size, cfg.decode)
                    with torch.no_grad():
                        for src, lens in batches[:2]:  # compiles (once per kind of step), then warm
                            decode(src, lens, beam, cfg.decode.len_penalty)
                        start = time.perf_counter()  # once as a user decodes, for the profiler's own cost
                        for src, lens in batches:
                            decode(src, lens, beam, cfg.decode.len_penalty)
                        plain = time.perf_counter() - start
                        tokens = 0
                        start = time.perf_counter()
                        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                            for src, lens in batches:
                                tokens += sum(len(o) for o in decode(src, lens, beam, cfg.decode.len_penalty))
                        wall = time.perf_counter() - start
                    us = defaultdict(float)
                    events = []
                    for e in leaf_events(prof):
                        us[group(e.key)] += e.self_cpu_time_total
                        events.append((e.self_cpu_time_total, e.key, e.count))
                    us["outside the operators"] = max(0.0, wall * 1e6 - sum(us.values()))
                    label = f"{precision}/{'greedy' if beam == 1 else f'beam{beam}'}/batch{size}"
                    cells[label] = {
                        "tokens": tokens, "wall_s": round(wall, 3), "unprofiled_wall_s": round(plain, 3),
                        "us_per_token": {g: round(us[g] / tokens, 1) for g in GROUPS},
                        "share": {g: round(us[g] / (wall * 1e6), 3) for g in GROUPS},
                        "top": [{"name": name[:90], "group": group(name), "us_per_token": round(t / tokens, 1),
                                 "calls": n} for t, name, n in sorted(events, reverse=True)[:3]],
                    }
                    print(label, f"{wall * 1e6 / tokens:.0f} us/token ({plain * 1e6 / tokens:.0f} unprofiled)",
                          {g: cells[label]["us_per_token"][g] for g in GROUPS}, flush=True)
    metrics = {"groups": list(GROUPS), "cells": cells, "cpu_flags": sorted(flags & {
        "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})}
    command = "python bench/profile_decoding.py --checkpoint " + args.checkpoint
    out = write_results(args.out, "decode_profile", command, metrics, checkpoint=str(path), threads=args.threads,
                        batch1_sentences=args.batch1_sentences, batch64_sentences=args.batch64_sentences)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
