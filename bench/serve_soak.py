"""``attnkit serve`` soaked: many clients for many minutes on loopback, every kind of request mixed with every kind of
fault, counting the answers the server should never give (5xx, transport errors, answers that change) and watching
its resident memory, open files and request slots.

The server (``python -m attnkit serve`` in a subprocess, loopback, one torch thread, ``--queue-size`` 64) serves a
translator (default: the Multi30k run), the dates Transformer of ``make demo`` and a small character language model
(trained here for --lm-steps on Tiny Shakespeare when --lm names no run). --clients asyncio clients (default 32)
loop for --duration seconds (default 600), each drawing its next request from this mix (weights in MIX):

* good requests, checked: translate (one sentence, greedy or the checkpoint's beam; every answer for a sentence
  must equal the first), streamed translate read to the end, generate with a seed (non-streamed and streamed; equal
  seeds, equal texts), attention with a masked head, score;
* clients that leave: a stream closed after its first event, a request whose connection closes before its answer;
* a slow client sending its body in pieces over about a second (within the server's body timeout: answered 200);
* bad requests, each with the status it must get: malformed JSON (400), a wrong type (422), an unknown field
  (422), an unknown model (404), too many sentences (413), a sentence over --max-source-tokens (413), a declared
  body over the size limit (413), a path outside the explorer's files (404);
* bursts: 48 requests at once from one client, beyond what the queue admits alongside everyone else.

A request that reaches the queue while it is full is answered 429 (with Retry-After; the client waits 0.1 s), and
while a burst is queued that is everyone's answer: 429s are counted per kind in ``queue_full``, and every kind that
queues must also have been answered 200. Every other status than the one its kind expects is counted in
``unexpected``; 5xx and transport errors (a connection reset or an unreadable answer outside the deliberate
disconnects) are reported on their own.
Memory: the server's RSS every 5 s; "bounded" means the growth over the second half of the run stays within
--memory-bound-mib (the first half includes allocator warm-up for every batch shape). After the load stops the
server must return to zero requests in flight (every slot released, the deliberate disconnects included).

    python bench/serve_soak.py                         # -> bench/results/serve_soak.json (about 12 minutes)
    python bench/serve_soak.py --duration 30 --out /tmp/soak.json
"""

from __future__ import annotations

# the allocator the server runs on: the attnkit command line's (jemalloc where the system has it,
# attnkit.allocator), chosen as this process starts, before torch is imported; the commands it starts inherit it
if __name__ == "__main__":
    from attnkit.allocator import relaunch_under_jemalloc

    relaunch_under_jemalloc()

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import free_port, percentiles, rss_mib, start_server  # noqa: E402

# kind: (weight, expected statuses); QUEUED kinds may also be answered 429 (queue full)
MIX = {
    "translate": (30, {200}),
    "translate_beam": (8, {200}),
    "translate_stream": (6, {200}),
    "generate": (6, {200}),
    "generate_stream": (4, {200}),
    "attention": (4, {200}),
    "score": (4, {200}),
    "leave_stream": (4, {200}),
    "leave_before_answer": (3, {None}),
    "slow_body": (2, {200}),
    "malformed_json": (3, {400}),
    "wrong_type": (3, {422}),
    "unknown_field": (2, {422}),
    "unknown_model": (2, {404}),
    "too_many_sentences": (2, {413}),
    "too_long_sentence": (2, {413}),
    "declared_too_large": (2, {413}),
    "outside_path": (2, {404}),
    "burst": (1, {200}),
}
QUEUED = {"translate", "translate_beam", "translate_stream", "generate", "generate_stream", "attention", "score",
          "leave_stream", "slow_body", "burst"}
BURST = 48


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def raw(port: int, request: bytes, pieces: int = 1, gap: float = 0.0, read: bool = True) -> int | None:
    """Send ``request`` over a fresh connection (in ``pieces`` with ``gap`` seconds between), read the status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        step = max(1, -(-len(request) // pieces))
        for i in range(0, len(request), step):
            writer.write(request[i:i + step])
            await writer.drain()
            if gap and i + step < len(request):
                await asyncio.sleep(gap)
        if not read:
            await asyncio.sleep(0.2)  # the request is in and queued; then the client leaves
            return None
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        return int(head.split(b" ", 2)[1])
    finally:
        writer.close()


def post_bytes(path: str, body: bytes, length: int | None = None) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n").encode() + body


class Soak:
    def __init__(self, port: int, sentences: list[str], dates: list[str], prompts: list[str], args):
        import httpx

        self.port, self.args = port, args
        self.sentences, self.dates, self.prompts = sentences, dates, prompts
        limits = httpx.Limits(max_connections=args.clients + BURST, max_keepalive_connections=args.clients)
        self.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120, limits=limits)
        self.counts: dict[str, Counter] = {kind: Counter() for kind in MIX}
        self.unexpected: Counter = Counter()
        self.examples: dict[str, str] = {}
        self.transport_errors: Counter = Counter()
        self.first_answer: dict[tuple, str] = {}
        self.changed: Counter = Counter()
        self.latency: dict[str, list[float]] = {kind: [] for kind in MIX}

    def same_as_before(self, kind: str, key: tuple, text: str) -> None:
        if self.first_answer.setdefault(key, text) != text:
            self.changed[kind] += 1

    async def one(self, kind: str, rng: random.Random) -> list[int | None]:
        """Send one request of ``kind``; -> the statuses it got."""
        c, post = self.client, self.client.post
        if kind in ("translate", "translate_beam"):
            i = rng.randrange(len(self.sentences))
            beam = 1 if kind == "translate" else 4
            r = await post("/v1/translate", json={"sentences": [self.sentences[i]], "beam": beam})
            if r.status_code == 200:
                self.same_as_before(kind, (kind, i), r.json()["translations"][0])
            return [r.status_code]
        if kind == "translate_stream":
            i = rng.randrange(len(self.dates))
            async with c.stream("POST", "/v1/translate", json={"model": "dates", "sentences": [self.dates[i]],
                                                                "stream": True, "beam": 3}) as r:
                last = None
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        last = line[7:]
                    elif line.startswith("data: ") and last == "done":
                        self.same_as_before(kind, (kind, i), json.loads(line[6:])["translations"][0])
                if r.status_code == 200 and last != "done":
                    self.changed[kind + " (no done event)"] += 1
            return [r.status_code]
        if kind in ("generate", "generate_stream"):
            seed, prompt = rng.randrange(8), rng.choice(self.prompts)
            body = {"model": "lm", "prompt": prompt, "max_tokens": 40, "temperature": 0.8, "top_k": 20, "seed": seed}
            if kind == "generate":
                r = await post("/v1/generate", json=body)
                if r.status_code == 200:
                    self.same_as_before(kind, (prompt, seed), r.json()["text"])
                return [r.status_code]
            async with c.stream("POST", "/v1/generate", json={**body, "stream": True, "attention": True}) as r:
                text, last = None, None
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        last = line[7:]
                    elif line.startswith("data: ") and last == "done":
                        text = json.loads(line[6:])["text"]
                if r.status_code == 200:
                    self.same_as_before("generate", (prompt, seed), text)
            return [r.status_code]
        if kind == "attention":
            i = rng.randrange(len(self.sentences))
            heads = [["cross", 0, rng.randrange(2)]]
            r = await post("/v1/attention", json={"source": self.sentences[i], "mask_heads": heads})
            return [r.status_code]
        if kind == "score":
            i = rng.randrange(len(self.sentences))
            r = await post("/v1/score", json={"sources": [self.sentences[i]], "targets": ["Ein Hund ."]})
            return [r.status_code]
        if kind == "leave_stream":
            body = {"model": "lm", "prompt": rng.choice(self.prompts), "max_tokens": 400, "seed": 1, "stream": True}
            async with c.stream("POST", "/v1/generate", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        break  # decoding has begun: leave
            return [r.status_code]
        if kind == "leave_before_answer":
            body = json.dumps({"model": "lm", "prompt": rng.choice(self.prompts), "max_tokens": 400, "seed": 2})
            return [await raw(self.port, post_bytes("/v1/generate", body.encode()), read=False)]
        if kind == "slow_body":
            i = rng.randrange(len(self.dates))
            body = json.dumps({"model": "dates", "sentences": [self.dates[i]]}).encode()
            return [await raw(self.port, post_bytes("/v1/translate", body), pieces=6, gap=0.2)]
        if kind == "malformed_json":
            r = await post("/v1/translate", content=b'{"sentences": ["a dog",',
                           headers={"content-type": "application/json"})
            return [r.status_code]
        if kind == "wrong_type":
            r = await post("/v1/translate", json={"sentences": [rng.randrange(100)], "beam": "five"})
            return [r.status_code]
        if kind == "unknown_field":
            r = await post("/v1/generate", json={"model": "lm", "prompt": "a", "temprature": 0.5})
            return [r.status_code]
        if kind == "unknown_model":
            r = await post("/v1/translate", json={"model": "../../etc/passwd", "sentences": ["a"]})
            return [r.status_code]
        if kind == "too_many_sentences":
            r = await post("/v1/translate", json={"sentences": ["a dog ."] * 65})
            return [r.status_code]
        if kind == "too_long_sentence":
            r = await post("/v1/translate", json={"sentences": ["a dog runs " * 400]})
            return [r.status_code]
        if kind == "declared_too_large":
            return [await raw(self.port, post_bytes("/v1/translate", b'{"sentences": ["', length=50 << 20))]
        if kind == "outside_path":
            path = rng.choice(["/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/js/..%2f..%2f..%2fapp.py",
                               "/docs-assets/../../../etc/hostname", "/static/../serve/app.py"])
            return [await raw(self.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                              .encode())]
        if kind == "burst":
            async def single(j):
                r = await post("/v1/translate", json={"sentences": [self.sentences[j % len(self.sentences)]]})
                return r.status_code

            return list(await asyncio.gather(*(single(rng.randrange(10**6)) for _ in range(BURST))))
        raise ValueError(kind)

    async def client_loop(self, c: int, stop_at: float) -> None:
        import httpx

        rng = random.Random(c)
        kinds, weights = list(MIX), [w for w, _ in MIX.values()]
        while time.monotonic() < stop_at:
            kind = rng.choices(kinds, weights)[0]
            t = time.perf_counter()
            try:
                statuses = await self.one(kind, rng)
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
                self.transport_errors[kind] += 1
                self.examples.setdefault(f"transport {kind}", f"{type(e).__name__}: {e}"[:200])
                continue
            self.latency[kind].append(time.perf_counter() - t)
            for status in statuses:
                self.counts[kind][str(status)] += 1
                if status not in MIX[kind][1] and not (status == 429 and kind in QUEUED):
                    self.unexpected[f"{kind} {status}"] += 1
            if 429 in statuses:
                await asyncio.sleep(0.1)


async def sample(pid: int, stop_at: float, memory: list, every: float = 5.0) -> None:
    start = time.monotonic()
    while time.monotonic() < stop_at:
        memory.append([round(time.monotonic() - start, 1), rss_mib(pid), open_files(pid), threads_of(pid)])
        await asyncio.sleep(every)
    memory.append([round(time.monotonic() - start, 1), rss_mib(pid), open_files(pid), threads_of(pid)])


def ensure_lm(path: Path, steps: int, data_dir: str | None) -> Path:
    """A small character LM: ``path`` if it holds a run, else trained there for ``steps`` on Tiny Shakespeare."""
    if (path / "checkpoints").is_dir():
        return path
    cmd = [sys.executable, "-m", "attnkit", "train", str(ROOT / "configs/tinyshakespeare_char.toml"), "--run-dir",
           str(path), "--threads", "1", "--set", f"train.max_steps={steps}", "--set", "train.eval_every=0",
           "--set", f"train.save_every={steps}", "--set", "train.max_minutes=0", "--set", "train.fit_schedule=false",
           "--set", "train.warmup_steps=10"]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    print("serve_soak: training the language model:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--translator", default=None, help="run or checkpoint (default: runs/multi30k_en_de's "
                                                      "averaged checkpoint if present, else runs/multi30k_small)")
    p.add_argument("--dates", default="runs/demo", help="the dates Transformer (make demo)")
    p.add_argument("--lm", default="runs/soak_lm", help="a language model run; trained here if it has none")
    p.add_argument("--lm-steps", type=int, default=300)
    p.add_argument("--data-dir", default=None, help="default: $ATTNKIT_DATA")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--queue-size", type=int, default=64)
    p.add_argument("--memory-bound-mib", type=float, default=20.0,
                   help="allowed RSS growth of the server over the second half of the run")
    p.add_argument("--out", default=str(ROOT / "bench/results/serve_soak.json"))
    args = p.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import attnkit
    from attnkit.data import generate_dates, load_split
    from attnkit.evaluate.results import write_results

    translator = args.translator
    if translator is None:
        translator = next((c for c in ("runs/multi30k_en_de/checkpoints/averaged", "runs/multi30k_small")
                           if (ROOT / c).exists()), "runs/multi30k_small")
    lm = ensure_lm(ROOT / args.lm, args.lm_steps, args.data_dir)
    model = attnkit.load(ROOT / translator)
    sentences = load_split(model.config.data, "test").src[:200]
    dates = generate_dates(100, seed=7).src  # dates in the demo's formats
    prompts = ["ROMEO:", "First Citizen:\n", "KING", "", "O, "]
    del model

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnkit", "serve", f"translator={translator}", f"dates={args.dates}",
           f"lm={lm}", "--port", str(port), "--threads", "1", "--queue-size", str(args.queue_size),
           "--timeout", "60", "--max-wait-ms", "20"]
    server = start_server(cmd, env, "serve_soak")
    memory: list = []
    try:
        rss_started, files_started = rss_mib(server.pid), open_files(server.pid)

        async def soak():
            s = Soak(port, sentences, dates, prompts, args)
            stop_at = time.monotonic() + args.duration
            await asyncio.gather(sample(server.pid, stop_at, memory),
                                 *(s.client_loop(c, stop_at) for c in range(args.clients)))
            # afterwards: every slot released, the server still answers
            settle = time.monotonic() + 60
            while True:
                health = (await s.client.get("/health")).json()
                if health["in_flight"] == 0 or time.monotonic() > settle:
                    break
                await asyncio.sleep(0.5)
            after = await s.client.post("/v1/translate", json={"sentences": [sentences[0]], "beam": 1})
            metrics_text = (await s.client.get("/metrics")).text
            await s.client.aclose()
            return s, health, after.status_code, metrics_text

        t0 = time.monotonic()
        s, health, after_status, metrics_text = asyncio.run(soak())
        wall = time.monotonic() - t0
        rss_end, files_end = rss_mib(server.pid), open_files(server.pid)
    finally:
        server.terminate()
        try:
            _, stderr = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            _, stderr = server.communicate()
    tracebacks = stderr.count("Traceback")

    server_5xx = {}
    for line in metrics_text.splitlines():
        if line.startswith("attnkit_requests_total{") and 'status="5' in line:
            server_5xx[line.split()[0]] = float(line.split()[1])
    answers = sum(sum(c.values()) for c in s.counts.values())
    client_5xx = sum(n for c in s.counts.values() for status, n in c.items() if status.startswith("5"))
    half = [m for m in memory if m[0] >= args.duration / 2]
    growth_second_half = round(half[-1][1] - half[0][1], 1) if len(half) > 1 else None
    queue_full = {kind: c["429"] for kind, c in s.counts.items() if c.get("429")}
    never_served = sorted(kind for kind in QUEUED if not s.counts[kind].get("200"))
    metrics = {
        "answers": answers,
        "answers_per_s": round(answers / wall, 2),
        "answers_200": sum(c.get("200", 0) for c in s.counts.values()),
        "queue_full": {"total": sum(queue_full.values()), "by_kind": queue_full},
        "kinds_never_served": never_served,
        "status_5xx": {"seen_by_clients": client_5xx, "server_metrics": server_5xx},
        "unexpected": dict(s.unexpected),
        "unexpected_examples": s.examples,
        "transport_errors": dict(s.transport_errors),
        "answers_that_changed": dict(s.changed),
        "server_tracebacks_logged": tracebacks,
        "after_load": {"in_flight": health["in_flight"], "queue": health["queue"], "translate_status": after_status},
        "server_rss_mib": {"started": rss_started, "end": rss_end, "max": max(m[1] for m in memory),
                           "growth_second_half": growth_second_half, "bound_second_half": args.memory_bound_mib},
        "server_open_files": {"started": files_started, "end": files_end, "max": max(m[2] for m in memory)},
        "server_threads_max": max(m[3] for m in memory),
        "met": {"zero_5xx": client_5xx == 0 and not any(server_5xx.values()),
                "no_unexpected_status": not s.unexpected, "no_transport_errors": not s.transport_errors,
                "every_kind_served": not never_served,
                "answers_stable": not s.changed, "slots_released": health["in_flight"] == 0,
                "memory_bounded": growth_second_half is not None and growth_second_half <= args.memory_bound_mib},
        "by_kind": {kind: {"statuses": dict(sorted(c.items())), "latency_ms": percentiles(s.latency[kind])}
                    for kind, c in s.counts.items()},
        "memory_samples": {"columns": ["seconds", "rss_mib", "open_files", "threads"], "rows": memory},
    }
    setup = {"server": " ".join(["python -m attnkit serve", *cmd[4:]]), "translator": translator,
             "dates": args.dates, "lm": str(lm.relative_to(ROOT)) if lm.is_relative_to(ROOT) else str(lm),
             "clients": args.clients, "duration_s": args.duration, "queue_size": args.queue_size,
             "mix": {kind: {"weight": w, "expected": sorted(x if x is not None else 0 for x in e)
                            + ([429] if kind in QUEUED else [])} for kind, (w, e) in MIX.items()},
             "burst": BURST, "wall_s": round(wall, 1)}
    command = "python bench/serve_soak.py " + " ".join(sys.argv[1:])
    out = write_results(args.out, "serve_soak", command.strip(), metrics, setup=setup)
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("memory_samples", "by_kind")}, indent=1))
    print(out, file=sys.stderr)
    return 0 if all(metrics["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
