"""What ``attnkit translate --compile`` buys at batch 1, and why it compiles ahead of time: greedy decoding of the
first N test_2016_flickr sentences one at a time, eager against the same fast decoder's search steps under
``torch.compile`` (Inductor's Python wrapper, and its C++ wrapper) and against ``attnkit.fast.compile_step`` (the
search steps and the encoder compiled ahead of time by AOTInductor), which ``--compile`` uses. Outputs are compared
with eager's.

    python bench/compile_step.py --sentences 100    # -> bench/results/compile_step.json
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import copy
import shlex
import sys
import time

import torch

from attnkit import fast
from attnkit.checkpoint import load_checkpoint
from attnkit.data import load_split
from attnkit.decode import generate, max_lengths
from attnkit.evaluate.results import write_results
from attnkit.fast import compile_step
from attnkit.fast.memory import keep_freed_memory
from attnkit.models import EOS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de/checkpoints/averaged")
    ap.add_argument("--sentences", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir")
    ap.add_argument("--out", default="bench/results/compile_step.json")
    args = ap.parse_args()
    keep_freed_memory()  # as the attnkit command line does
    torch.set_num_threads(args.threads)
    model, cfg, toks, _ = load_checkpoint(args.checkpoint)
    test = load_split(cfg.data, "test", args.data_dir)
    sources = [s + [EOS] for s in toks.src.encode(test.src[:args.sentences])]
    d = cfg.decode

    def decode(m, sentences) -> list[list[int]]:
        limit = [max_lengths(torch.tensor([len(s) - 1]), d.max_len_a, d.max_len_b) for s in sentences]
        return [generate(m, torch.tensor([s]), n)[0][0].tokens for s, n in zip(sentences, limit)]

    systems, eager = {}, None
    def under_torch_compile(cpp_wrapper: bool):
        """The fast decoder with its search steps under ``torch.compile``: the reference attnkit's packages beat."""
        decoder = fast.decoder(copy.deepcopy(model))
        steps = {name: torch.compile(step, dynamic=True, options={"cpp_wrapper": cpp_wrapper})
                 for name, step in decoder.search_steps().items()}
        decoder.search_steps = lambda: steps
        return decoder

    variants = {"eager": lambda: fast.decoder(copy.deepcopy(model)),
                "compiled_python_wrapper": lambda: under_torch_compile(False),
                "compiled_cpp_wrapper": lambda: under_torch_compile(True),
                "ahead_of_time": lambda: compile_step(model)}
    for name, make in variants.items():
        start = time.perf_counter()
        m = make()
        with torch.no_grad():
            decode(m, sources[:3])  # compiles on first use
            warm = time.perf_counter() - start
            start = time.perf_counter()
            out = decode(m, sources)
            seconds = time.perf_counter() - start
        eager = eager or out
        tokens = sum(map(len, out))
        systems[name] = {"tokens_per_s": round(tokens / seconds, 1), "tokens": tokens, "seconds": round(seconds, 3),
                         "compile_and_warmup_seconds": round(warm, 1), "same_as_eager": sum(a == b for a, b in
                                                                                           zip(out, eager))}
        print(f"{name:>22}: {systems[name]}", file=sys.stderr)
    ratio = {k: round(v["tokens_per_s"] / systems["eager"]["tokens_per_s"], 3) for k, v in systems.items()}
    write_results(args.out, "compile_step", "python " + shlex.join(sys.argv),
                  metrics={"speed_over_eager": ratio, "sentences": len(sources), "batch_size": 1, "search": "greedy"},
                  systems=systems, checkpoint=args.checkpoint, threads=args.threads)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
