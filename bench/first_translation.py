"""Time to first translation: how long ``attnkit translate`` takes, start to exit, to translate one sentence of
Multi30k test2016, eagerly (``--no-compile``, the default for so few sentences) and compiled (``--compile``, the
default for a server or a large file), from a cold cache (nothing compiled yet: empty attnkit and Inductor
caches) and a warm one (the same caches, as the next run finds them), greedy and beam 5.

Each command runs as a user runs it, in its own process on ``--threads`` threads; the three of a search take
turns over ``--rounds`` rounds (a cold run's caches are emptied before it), and the median is reported.

    python bench/first_translation.py --checkpoint runs/multi30k_en_de   # -> bench/results/first_translation.json
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnkit.allocator import command_line_allocator, find_jemalloc
from attnkit.checkpoint import read_config, resolve_checkpoint
from attnkit.data import load_split
from attnkit.evaluate.results import write_results

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], source: str, env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, input=source + "\n", capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"first_translation: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return seconds, done.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--sentence", type=int, default=1, help="which test2016 sentence (from 0)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data-dir")
    ap.add_argument("--out", default="bench/results/first_translation.json")
    args = ap.parse_args()

    checkpoint = resolve_checkpoint(args.checkpoint)
    source = load_split(read_config(checkpoint).data, "test", args.data_dir).src[args.sentence]
    caches = Path(tempfile.mkdtemp(prefix="attnkit-first-"))
    env = {**{k: v for k, v in os.environ.items() if k != "ATTNKIT_COMPILE"}, "OMP_NUM_THREADS": str(args.threads),
           "ATTNKIT_CACHE": str(caches / "attnkit"), "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")}
    base = [sys.executable, "-m", "attnkit", "translate", "--checkpoint", str(checkpoint), "--threads",
            str(args.threads)]
    runs: dict[str, dict[str, list[float]]] = {}
    outputs: dict[str, set[str]] = {}
    try:
        for beam in (1, 5):
            search = "greedy" if beam == 1 else "beam5"
            compiled = base + ["--beam", str(beam), "--compile"]
            cells = {"eager": base + ["--beam", str(beam), "--no-compile"], "compiled_cold": compiled,
                     "compiled_warm": compiled}
            for _ in range(args.rounds):
                for cell, cmd in cells.items():
                    if cell == "compiled_cold":
                        shutil.rmtree(caches, ignore_errors=True)
                    seconds, out = timed(cmd, source, env)
                    runs.setdefault(search, {}).setdefault(cell, []).append(round(seconds, 2))
                    outputs.setdefault(search, set()).add(out)
                    print(f"{search} {cell}: {seconds:.1f} s", file=sys.stderr)
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    metrics = {search: {cell: statistics.median(times) for cell, times in cells.items()}
               for search, cells in runs.items()}
    for search, cells in metrics.items():
        cells["warm_over_cold"] = round(cells["compiled_warm"] / cells["compiled_cold"], 3)
        cells["same_translation"] = len(outputs[search]) == 1
    write_results(args.out, "first_translation",
                  command=f"python bench/first_translation.py --checkpoint {args.checkpoint} --rounds {args.rounds} "
                          f"--threads {args.threads}",
                  metrics=metrics, seconds=runs, source=source,
                  checkpoint=os.path.relpath(checkpoint, ROOT) if checkpoint.is_relative_to(ROOT) else str(checkpoint),
                  # the allocator of the timed commands, not of this process
                  threads=args.threads, allocator=command_line_allocator(env, find_jemalloc()))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
