"""``attnkit serve`` under load: cross-request batching measured against one-at-a-time requests and offline decoding.

Every request translates ONE Multi30k test sentence (test_2016_flickr, in file order, cycling) with the checkpoint's
decoding options. Three measurements on the same sentences:

1. **offline**: ``attnkit translate``'s decoding in-process (:meth:`attnkit.api.Model.translate`, the same function,
   batches of --batch-tokens source tokens), before the server starts. Its outputs are the reference.
2. **sequential**: one client, one request at a time (each its own batch of one), for --sequential-seconds.
3. **concurrent**: --clients clients (asyncio, keep-alive HTTP/1.1 connections), each sending its next request as
   soon as its answer arrives, for --duration seconds; the server gathers concurrent requests into batches.

Every answer is checked against the offline output of its sentence. The server runs in a subprocess
(``python -m attnkit serve``) on loopback with the given --threads; the load generator is a lean asyncio client in
this process (on the same machine: its CPU time is part of the cost). Resident memory of the server is read from
/proc at start (after 3 s of the same load as a warm-up), during the run and at the end; CPU time per request of
the server and of the clients from /proc and os.times.

Threads: ``--threads 1`` by default for both the server and offline decoding (the primary ratio): on a 2-core
machine one torch thread decodes while the other core parses HTTP and runs the load generator. Offline decoding on
2 threads is measured too, for reference (``ratios.of_offline_2_threads``). ``--max-wait-ms 50``: a batch closes
as soon as every client recently in flight is queued (attnkit.serve.worker), so the wait is only the time the
clients just answered take to come back; 5 ms (the server's default, for single interactive users) is too short
for 64 clients on 2 busy cores and lets the clients split into groups that take turns with half-size batches.

    python bench/serve_load.py                       # -> bench/results/serve_load.json
    python bench/serve_load.py --duration 10 --sequential-seconds 5 --out /tmp/quick.json

Targets: concurrent >= 5x sequential (ratios.over_sequential) and >= 60% of offline (ratios.of_offline),
outputs identical to offline, no errors but designed 429s, memory growth bounded (--memory-bound-mib).
"""

from __future__ import annotations

# the allocator the server and offline decoding run on: the attnkit command line's (jemalloc where the system has it,
# attnkit.allocator), chosen as this process starts, before torch is imported; the commands it starts inherit it
if __name__ == "__main__":
    from attnkit.allocator import relaunch_under_jemalloc

    relaunch_under_jemalloc()

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_checkpoint() -> str:
    for candidate in ("runs/multi30k_en_de/checkpoints/averaged", "runs/multi30k_small", "runs/demo"):
        if (ROOT / candidate).exists():
            return candidate
    return "runs/multi30k_en_de/checkpoints/averaged"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list[str], env: dict, name: str) -> subprocess.Popen:
    """``cmd`` (an ``attnkit serve`` on 127.0.0.1 and ``--port``) started, once its port accepts connections."""
    port = int(cmd[cmd.index("--port") + 1])
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600  # a Transformer's first start on a machine compiles its steps (minutes)
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit(f"{name}: the server did not start:\n{server.communicate()[1]}") from None
            time.sleep(0.2)


def rss_mib(pid: int) -> float:
    from attnkit.serve.metrics import resident_memory_bytes

    return round(resident_memory_bytes(pid) / 2**20, 1)


class Connection:
    """One keep-alive HTTP/1.1 connection: POST JSON, read the answer (Content-Length bodies only)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: dict) -> tuple[int, dict]:
        if self.writer is None:
            await self.open()
        data = json.dumps(body).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        return status, json.loads(payload) if payload else {}

    def close(self):
        if self.writer is not None:
            self.writer.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat", encoding="ascii").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_counts(port: int) -> tuple[float, float]:
    """(batches, sentences in them) so far, from the server's /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    return value["attnkit_batch_sentences_count"], value["attnkit_batch_sentences_sum"]


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(q[49] * 1000, 1), "p95": round(q[94] * 1000, 1), "p99": round(q[98] * 1000, 1),
            "mean": round(statistics.fmean(values) * 1000, 1)}


async def sequential(port: int, sentences: list[str], expected: list[str], seconds: float) -> dict:
    conn = Connection("127.0.0.1", port)
    latencies, statuses, mismatches, i = [], {}, 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        s = i % len(sentences)
        t = time.perf_counter()
        status, answer = await conn.post("/v1/translate", {"sentences": [sentences[s]]})
        latencies.append(time.perf_counter() - t)
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200 and answer["translations"][0] != expected[s]:
            mismatches += 1
        i += 1
    wall = time.perf_counter() - start
    conn.close()
    ok = statuses.get(200, 0)
    return {"requests": i, "seconds": round(wall, 3), "sentences_per_s": round(ok / wall, 2),
            "latency_ms": percentiles(latencies), "status_counts": {str(k): v for k, v in sorted(statuses.items())},
            "mismatches_vs_offline": mismatches}


async def concurrent(port: int, sentences: list[str], expected: list[str], clients: int, seconds: float,
                     pid: int) -> dict:
    latencies, statuses, mismatches, done = [], {}, 0, 0
    errors: list[str] = []
    memory: list[float] = []
    start = time.perf_counter()
    stop_at = start + seconds

    async def client(c: int):
        nonlocal mismatches, done
        conn = Connection("127.0.0.1", port)
        i = c
        while time.perf_counter() < stop_at:
            s = i % len(sentences)
            t = time.perf_counter()
            try:
                status, answer = await conn.post("/v1/translate", {"sentences": [sentences[s]]})
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                conn.close()
                conn = Connection("127.0.0.1", port)
                continue
            latencies.append(time.perf_counter() - t)
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                done += 1
                if answer["translations"][0] != expected[s]:
                    mismatches += 1
            elif status == 429:
                await asyncio.sleep(0.05)
            i += clients
        conn.close()

    async def watch_memory():
        while time.perf_counter() < stop_at:
            memory.append(rss_mib(pid))
            await asyncio.sleep(1.0)

    await asyncio.gather(watch_memory(), *(client(c) for c in range(clients)))
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": sum(statuses.values()), "seconds": round(wall, 3),
            "sentences_per_s": round(done / wall, 2), "latency_ms": percentiles(latencies),
            "status_counts": {str(k): v for k, v in sorted(statuses.items())}, "transport_errors": len(errors),
            "transport_error_examples": errors[:3], "mismatches_vs_offline": mismatches,
            "server_rss_mib_max_during": max(memory) if memory else None}


def offline(model, sentences: list[str], batch_tokens: int, rounds: int) -> tuple[list[str], float]:
    """``attnkit translate``'s decoding of ``sentences`` (Model.translate): outputs and the best sentences/s."""
    model.translate(sentences[:64], batch_tokens=batch_tokens)  # warm-up
    best, outputs = float("inf"), None
    for _ in range(rounds):
        t = time.perf_counter()
        outputs = model.translate(sentences, batch_tokens=batch_tokens)
        best = min(best, time.perf_counter() - t)
    return outputs, len(sentences) / best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None, help="default: runs/multi30k_en_de/checkpoints/averaged if "
                                                      "present, else runs/multi30k_small, else runs/demo")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of concurrent load")
    p.add_argument("--sequential-seconds", type=float, default=30.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server and of offline decoding "
                   "(default 1: on 2 cores one decodes while the other serves HTTP and runs these clients)")
    p.add_argument("--max-wait-ms", type=float, default=50.0, help="the server's --max-wait-ms (default 50: the "
                   "time a batch may wait for the clients just answered to come back)")
    p.add_argument("--batch-tokens", type=int, default=4000, help="offline --batch-tokens and the server's "
                                                                  "--max-batch-tokens")
    p.add_argument("--sentences", type=int, default=0, help="use the first N test sentences (0: all)")
    p.add_argument("--offline-rounds", type=int, default=2)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="the server's --compile/--no-compile, and offline decoding the same way (default: as "
                        "attnkit serve decides, compiled for a Transformer)")
    p.add_argument("--memory-bound-mib", type=float, default=100.0,
                   help="allowed growth of the server's resident memory from start to end")
    p.add_argument("--out", default=str(ROOT / "bench/results/serve_load.json"))
    args = p.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    import attnkit
    from attnkit.data import load_split
    from attnkit.evaluate.results import write_results
    from attnkit.fast import compiles_by_default

    checkpoint = args.checkpoint or default_checkpoint()
    model = attnkit.load(ROOT / checkpoint if not Path(checkpoint).is_absolute() else checkpoint)
    # offline decodes as the server will: compiled where it is (its default for a server), so that the outputs
    # compared and the throughput ratio are of the same decoding
    compiled = args.compile if args.compile is not None else compiles_by_default(model.module, None)
    if compiled:
        model.compile()
    split = "test"
    sentences = load_split(model.config.data, split).src
    if args.sentences:
        sentences = sentences[:args.sentences]
    print(f"serve_load: {model.family} from {model.path}, {len(sentences)} {model.config.data.format} {split} "
          f"sentences, {args.threads} threads", file=sys.stderr)

    family, data = model.family, f"{model.config.data.format} {split} source (one sentence per request)"
    cpu0 = time.process_time()
    expected, offline_tput = offline(model, sentences, args.batch_tokens, args.offline_rounds)
    offline_cpu = (time.process_time() - cpu0) / (args.offline_rounds + 64 / len(sentences))
    offline_2 = None
    if args.threads != 2:  # attnkit translate's default on an idle 2-core machine, for reference
        torch.set_num_threads(2)
        outputs_2, offline_2 = offline(model, sentences, args.batch_tokens, args.offline_rounds)
        torch.set_num_threads(args.threads)
        print(f"  offline, 2 threads: {offline_2:.1f} sentences/s (same outputs: {outputs_2 == expected})",
              file=sys.stderr)
    print(f"  offline: {offline_tput:.1f} sentences/s", file=sys.stderr)
    del model

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-m", "attnkit", "serve", str(checkpoint), "--port", str(port), "--threads",
           str(args.threads), "--max-wait-ms", str(args.max_wait_ms), "--max-batch-tokens", str(args.batch_tokens),
           "--queue-size", "256", "--timeout", "60", "--compile" if compiled else "--no-compile"]
    server = start_server(cmd, env, "serve_load")
    try:
        rss_started = rss_mib(server.pid)

        async def warm():  # one request alone, then a batch of every size the load will see
            conn = Connection("127.0.0.1", port)
            await conn.post("/v1/translate", {"sentences": sentences[:1]})
            conn.close()
            await concurrent(port, sentences, expected, args.clients, 3.0, server.pid)

        asyncio.run(warm())
        rss_start = rss_mib(server.pid)
        cpu = (cpu_seconds(server.pid), time.process_time())
        seq = asyncio.run(sequential(port, sentences, expected, args.sequential_seconds))
        seq["cpu_ms_per_request"] = {"server": round((cpu_seconds(server.pid) - cpu[0]) * 1000 / seq["requests"], 2),
                                     "client": round((time.process_time() - cpu[1]) * 1000 / seq["requests"], 2)}
        print(f"  sequential: {seq['sentences_per_s']} sentences/s", file=sys.stderr)
        before, cpu = batch_counts(port), (cpu_seconds(server.pid), time.process_time())
        conc = asyncio.run(concurrent(port, sentences, expected, args.clients, args.duration, server.pid))
        n = max(conc["requests"], 1)
        conc["cpu_ms_per_request"] = {"server": round((cpu_seconds(server.pid) - cpu[0]) * 1000 / n, 2),
                                      "client": round((time.process_time() - cpu[1]) * 1000 / n, 2)}
        after = batch_counts(port)
        print(f"  concurrent ({args.clients} clients): {conc['sentences_per_s']} sentences/s, "
              f"latency {conc['latency_ms']}", file=sys.stderr)
        rss_end = rss_mib(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()

    mean_batch = (after[1] - before[1]) / max(after[0] - before[0], 1)  # of the concurrent phase
    unexpected = {k: v for k, v in conc["status_counts"].items() if k not in ("200", "429")}
    unexpected.update({k: v for k, v in seq["status_counts"].items() if k != "200"})
    growth = round(rss_end - rss_start, 1)
    ratios = {"over_sequential": round(conc["sentences_per_s"] / seq["sentences_per_s"], 2),
              "of_offline": round(conc["sentences_per_s"] / offline_tput, 3)}
    if offline_2 is not None:
        ratios["of_offline_2_threads"] = round(conc["sentences_per_s"] / offline_2, 3)
    metrics = {
        "ratios": ratios,
        "targets": {"over_sequential": 5.0, "of_offline": 0.6, "memory_growth_mib_max": args.memory_bound_mib},
        "met": {"over_sequential": ratios["over_sequential"] >= 5.0, "of_offline": ratios["of_offline"] >= 0.6,
                "identical_outputs": conc["mismatches_vs_offline"] == 0 and seq["mismatches_vs_offline"] == 0,
                "no_unexpected_errors": not unexpected and conc["transport_errors"] == 0,
                "memory_bounded": growth <= args.memory_bound_mib},
        "throughput_sentences_per_s": {"offline": round(offline_tput, 2), "sequential": seq["sentences_per_s"],
                                       "concurrent": conc["sentences_per_s"],
                                       "offline_2_threads": None if offline_2 is None else round(offline_2, 2)},
        "latency_ms": {"sequential": seq["latency_ms"], "concurrent": conc["latency_ms"]},
        "status_counts": {"sequential": seq["status_counts"], "concurrent": conc["status_counts"]},
        "unexpected_errors": unexpected,
        "transport_errors": conc["transport_errors"],
        "mismatches_vs_offline": {"sequential": seq["mismatches_vs_offline"],
                                  "concurrent": conc["mismatches_vs_offline"]},
        "requests": {"sequential": seq["requests"], "concurrent": conc["requests"]},
        "cpu_ms_per_request": {"sequential": seq["cpu_ms_per_request"], "concurrent": conc["cpu_ms_per_request"],
                               "offline_per_sentence": round(offline_cpu * 1000 / len(sentences), 2)},
        "mean_batch_sentences_concurrent": round(mean_batch, 2),
        "server_rss_mib": {"started": rss_started, "start": rss_start, "max_during_load": conc[
            "server_rss_mib_max_during"], "end": rss_end, "growth": growth},
    }
    setup = {"checkpoint": str(checkpoint), "family": family, "sentences": len(sentences), "data": data,
             "clients": args.clients, "duration_s": args.duration, "sequential_s": args.sequential_seconds,
             "threads": args.threads, "max_wait_ms": args.max_wait_ms, "batch_tokens": args.batch_tokens,
             "decoding": "the checkpoint's (beam, len_penalty, max_len_a/b)", "compiled": compiled,
             "notes": ("server = python -m attnkit serve in a subprocess; load = asyncio keep-alive HTTP/1.1 clients "
                       "in the bench process on the same machine; offline = Model.translate (attnkit translate's "
                       "decoding) in the bench process before the server starts, same threads. rss 'start' is after "
                       "warm-up (3 s of the same load), 'started' before any request.")}
    command = "python bench/serve_load.py " + " ".join(sys.argv[1:])
    out = write_results(args.out, "serve_load", command.strip(), metrics, setup=setup)
    print(json.dumps(metrics, indent=1))
    print(out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
