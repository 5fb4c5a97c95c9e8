"""Training steps/s of the demo model while another process keeps one core busy: torch's default thread count
against attnkit's (``attnkit.threads``: the cores no other process keeps busy).

For each of the two, a fresh ``attnkit train`` process trains the ``attnkit demo`` config (dates -> ISO dates)
for ``--steps`` steps (or ``--max-minutes``, whichever comes first) while a busy loop (``while True: pass`` in
another Python process) holds one core. ``old``: ``--threads`` set to what a fresh ``import torch`` picks
(``torch.get_num_threads()``, one thread per core); ``new``: no ``--threads``, so attnkit's default applies.
Neither process sees OMP_NUM_THREADS. Steps/s is over training time, from the run's metrics.jsonl records
(logged every 10 steps; the first one, with the warm-up, is left out).

    python bench/threads_demo.py                 # -> bench/results/threads_demo.json (a few minutes)
    python bench/threads_demo.py --steps 20      # a smoke run

Run it on an otherwise quiet machine: the point is one known competitor, not whatever else is running.
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnkit.config import dump_toml
from attnkit.demo import demo_config
from attnkit.evaluate.results import write_results

LOG_EVERY = 10


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def torch_default_threads() -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=clean_env(),
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def lscpu_model_name() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        if line.strip().startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return None


def steps_per_second(metrics: Path) -> tuple[float, int]:
    """(steps/s over training time, steps) from a run's metrics.jsonl, leaving out the first logged window."""
    records = [r for r in map(json.loads, metrics.read_text(encoding="utf-8").splitlines()) if "train_nll" in r]
    if not records:
        raise SystemExit(f"{metrics}: no training records (the run took fewer than {LOG_EVERY} steps)")
    first, last = (records[0], records[-1]) if len(records) > 1 else ({"step": 0, "minutes": 0.0}, records[0])
    return (last["step"] - first["step"]) / max((last["minutes"] - first["minutes"]) * 60, 1e-9), last["step"]


def train(config: Path, run_dir: Path, steps: int, max_minutes: float, threads: int | None) -> dict:
    cmd = [sys.executable, "-m", "attnkit", "train", str(config), "--run-dir", str(run_dir),
           "--set", f"train.max_steps={steps}", "--set", f"train.max_minutes={max_minutes}",
           "--set", f"train.log_every={LOG_EVERY}", "--set", "train.progress=false"]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    started = time.monotonic()
    out = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    used = re.search(r"(\d+) threads?\b", out.stderr)
    rate, done = steps_per_second(run_dir / "metrics.jsonl")
    return {"threads": int(used.group(1)) if used else threads, "steps_per_s": round(rate, 3), "steps": done,
            "wall_s": round(time.monotonic() - started, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    ap.add_argument("--max-minutes", type=float, default=3.0,
                    help="training minutes per run at most (torch's default can crawl; default 3)")
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes holding a core each (default 1)")
    ap.add_argument("--out", default="bench/results/threads_demo.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="threads_demo_"))
    config = work / "demo.toml"
    config.write_text(dump_toml(demo_config(minutes=0)), encoding="utf-8")
    old_threads = torch_default_threads()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        time.sleep(1.0)  # the busy loops are running before either run looks at the machine
        runs = {"old_default": train(config, work / "old", args.steps, args.max_minutes, old_threads),
                "new_default": train(config, work / "new", args.steps, args.max_minutes, None)}
    finally:
        for p in busy:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    runs["speedup"] = round(runs["new_default"]["steps_per_s"] / max(runs["old_default"]["steps_per_s"], 1e-9), 2)
    command = f"python bench/threads_demo.py --steps {args.steps} --max-minutes {args.max_minutes} --busy {args.busy}"
    path = write_results(args.out, "threads_demo", command, runs, busy_processes=args.busy,
                         lscpu_model_name=lscpu_model_name(), torch_default_threads=old_threads,
                         train_command="attnkit train <attnkit demo's config> [--threads N]")
    print(json.dumps(runs, indent=1))
    print(path)


if __name__ == "__main__":
    main()
