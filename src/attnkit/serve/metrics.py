"""Prometheus text metrics, kept by hand (no client library): requests by endpoint and status, latency
histograms, batch sizes and times, queue depth, resident memory."""

from __future__ import annotations

import threading
from bisect import bisect_left

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        braces = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braces} {self.sum:.6f}", f"{name}_count{braces} {self.count}"]
        return out


def resident_memory_bytes(pid: int | str = "self") -> int:
    """The resident set size of a process (Linux /proc), 0 where unknown."""
    try:
        for line in open(f"/proc/{pid}/status", encoding="ascii"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Thread-safe counters and histograms; :meth:`render` writes the Prometheus text format."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_sentences = Histogram(BATCH_BUCKETS)
        self.batch_seconds = Histogram(LATENCY_BUCKETS)
        self.batches = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1
            self.latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, sentences: int, seconds: float) -> None:
        with self.lock:
            self.batches += 1
            self.batch_sentences.observe(sentences)
            self.batch_seconds.observe(seconds)

    def render(self, queue_depth: int = 0, in_flight: int = 0) -> str:
        with self.lock:
            out = ["# HELP attnkit_requests_total Requests answered, by endpoint and HTTP status.",
                   "# TYPE attnkit_requests_total counter"]
            for (endpoint, status), n in sorted(self.requests.items()):
                out.append(f'attnkit_requests_total{{endpoint="{_escape(endpoint)}",status="{status}"}} {n}')
            out += ["# HELP attnkit_request_seconds Time from a request's arrival to the end of its answer.",
                    "# TYPE attnkit_request_seconds histogram"]
            for endpoint, h in sorted(self.latency.items()):
                out += h.lines("attnkit_request_seconds", f'endpoint="{_escape(endpoint)}"')
            out += ["# HELP attnkit_batch_sentences Sentences (or examples) decoded together in one batch.",
                    "# TYPE attnkit_batch_sentences histogram", *self.batch_sentences.lines("attnkit_batch_sentences"),
                    "# HELP attnkit_batch_seconds Time the worker spent on one batch.",
                    "# TYPE attnkit_batch_seconds histogram", *self.batch_seconds.lines("attnkit_batch_seconds"),
                    "# HELP attnkit_batches_total Batches the worker ran.", "# TYPE attnkit_batches_total counter",
                    f"attnkit_batches_total {self.batches}"]
        out += ["# HELP attnkit_queue_depth Requests waiting for the worker.", "# TYPE attnkit_queue_depth gauge",
                f"attnkit_queue_depth {queue_depth}",
                "# HELP attnkit_in_flight Requests admitted and not yet answered (waiting or decoding).",
                "# TYPE attnkit_in_flight gauge", f"attnkit_in_flight {in_flight}",
                "# HELP process_resident_memory_bytes Resident memory of the server process.",
                "# TYPE process_resident_memory_bytes gauge",
                f"process_resident_memory_bytes {resident_memory_bytes()}"]
        return "\n".join(out) + "\n"
