"""One inference thread, fed by a bounded queue, that gathers concurrent requests into batches.

Torch on a few cores is fastest with one caller: every model runs in this one thread, so requests never compete
for the cores, and a module changed for an intervention (:meth:`attnkit.api.Model.intervene`) is never seen by
another request. Requests that can share a batch carry the same ``key`` (translation: the model and every decoding
option; classification: the model, without an explanation). The worker takes the oldest request and gathers the
others of its key until one of:

* the batch holds ``max_batch_tokens`` source tokens;
* as many requests are queued as were in flight (admitted) at the peak of the last ``PEAK_SECONDS``: everyone who
  has been sending is here (a lone client's request goes at once);
* ``max_wait_ms`` have passed since that request arrived or the worker finished its last batch, whichever is later.

Then it runs them as one batch. Others run one at a time, in arrival order. Why wait for the recent peak: under steady
load the clients of one batch send their next requests while the next batch already runs; a worker that went on
with whoever is queued would split the clients into groups that take turns and never merge again (each group's
requests arrive while the other's batch decodes), and small batches decode each sentence at a higher cost.

Admission is bounded: at most ``queue_size`` requests are admitted (waiting or running) at once; one more is
answered 429. A request leaves when its answer is complete, its time is up, or its client disconnects; a batch
whose requests have all left stops at its next decoding step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from attnkit.errors import AttnkitError
from attnkit.serve.errors import ApiError

log = logging.getLogger("attnkit.serve")

PEAK_SECONDS = 2.0  # how far back the peak of requests in flight is remembered


class Abandoned(Exception):
    """Raised inside a decoding step when every request of the batch has left."""


@dataclass(eq=False)
class Job:
    kind: str  # translate, generate, attention, score, positional, classify, upload
    served: object  # the ServedModel
    payload: object
    key: tuple | None = None  # requests with the same key share batches; None: alone
    tokens: int = 0  # source tokens, for the batch budget
    deadline: float = 0.0  # time.monotonic() when it times out
    streaming: bool = False
    enqueued: float = 0.0
    cancelled: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future | None = None
    events: asyncio.Queue | None = None

    def bind(self) -> None:
        """Attach to the running event loop (the request's)."""
        self.loop = asyncio.get_running_loop()
        self.future = self.loop.create_future()
        self.events = asyncio.Queue() if self.streaming else None

    # called from the worker thread

    def emit(self, name: str, data) -> None:
        """A server-sent event for a streaming request."""
        if not self.cancelled and self.events is not None:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (name, data))

    def finish(self, result=None, error: BaseException | None = None) -> None:
        if self.streaming:  # the answer goes as events; nobody awaits the future
            if error is None:
                self.emit("done", result)
            else:
                status, message = describe_error(error)
                self.emit("error", {"error": message, "status": status})
            result, error = None, None
        self.loop.call_soon_threadsafe(self._settle, result, error)

    def _settle(self, result, error) -> None:
        if self.future.done():
            return
        if error is None:
            self.future.set_result(result)
        else:
            self.future.set_exception(error)


def describe_error(error: BaseException) -> tuple[int, str]:
    if isinstance(error, ApiError):
        return error.status, error.message
    if isinstance(error, AttnkitError):
        return getattr(error, "status", 422), str(error)
    return 500, "internal: the server failed on this request (see its log)"


class Worker:
    def __init__(self, settings, metrics, run_batch=None):
        from attnkit.serve import compute

        self.settings, self.metrics = settings, metrics
        self.run_batch = run_batch or compute.run_batch
        self.cond = threading.Condition()
        self.queue: deque[Job] = deque()
        self.admitted = 0
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.finished_at = 0.0  # when the worker finished its last batch
        self.peaks: deque[tuple[float, int]] = deque()  # (time, requests in flight) at each admission

    # --- the event loop's side

    def admit(self, job: Job) -> None:
        """Take a slot for ``job`` (and bind it to the running loop), or answer 429."""
        with self.cond:
            if self.admitted >= self.settings.queue_size:
                retry = max(1, round(self.settings.max_wait_ms / 1000 + 0.5))
                raise ApiError(429, f"queue: full ({self.settings.queue_size} requests waiting or running); "
                                    f"retry after {retry} s", {"Retry-After": str(retry)})
            self.admitted += 1
            now = time.monotonic()
            self.peaks.append((now, self.admitted))
            while self.peaks and self.peaks[0][0] < now - PEAK_SECONDS:
                self.peaks.popleft()
        job.bind()

    def recent_peak(self) -> int:
        """The most requests in flight at once in the last PEAK_SECONDS (at least 1)."""
        now = time.monotonic()
        return max([n for t, n in self.peaks if t >= now - PEAK_SECONDS], default=1)

    def release(self, job: Job) -> None:
        with self.cond:
            if job.loop is not None and not getattr(job, "_released", False):
                job._released = True
                self.admitted -= 1


    def submit(self, job: Job) -> None:
        job.enqueued = time.monotonic()
        with self.cond:
            self.queue.append(job)
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        """The request left (answered, timed out, disconnected): drop it if still waiting."""
        job.cancelled = True
        with self.cond:
            try:
                self.queue.remove(job)
            except ValueError:
                pass

    def depth(self) -> int:
        return len(self.queue)

    def in_flight(self) -> int:
        return self.admitted

    # --- the thread

    def start(self) -> None:
        if self.thread is None:
            self.stopping = False
            self.thread = threading.Thread(target=self._loop, name="attnkit-serve-worker", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=10)
            self.thread = None

    def _gather(self) -> list[Job] | None:
        """Wait for work; -> the next batch (one job, or jobs of one key within the token budget)."""
        with self.cond:
            while True:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return None
                now = time.monotonic()
                first = self.queue[0]
                if first.cancelled or first.deadline <= now:
                    self.queue.popleft()
                    if not first.cancelled:
                        first.finish(error=ApiError(504, f"timeout: no answer within {self.settings.timeout:g} s "
                                                         "(the server is busy)"))
                    continue
                if first.key is None:
                    return [self.queue.popleft()]
                # wait for more of its kind: a full batch, everyone recently in flight, or max_wait
                until = max(first.enqueued, self.finished_at) + self.settings.max_wait_ms / 1000
                while True:
                    same = [j for j in self.queue if j.key == first.key and not j.cancelled]
                    if not same or sum(j.tokens for j in same) >= self.settings.max_batch_tokens or \
                            len(same) >= self.recent_peak():
                        break
                    left = until - time.monotonic()
                    if left <= 0 or self.stopping:
                        break
                    self.cond.wait(left)
                batch, budget = [], self.settings.max_batch_tokens
                for j in [j for j in self.queue if j.key == first.key and not j.cancelled]:
                    if batch and j.tokens > budget:
                        break
                    batch.append(j)
                    budget -= j.tokens
                for j in batch:
                    self.queue.remove(j)
                if batch:
                    return batch

    def _loop(self) -> None:
        import torch

        torch.set_grad_enabled(False)
        while True:
            batch = self._gather()
            if batch is None:
                return
            start = time.perf_counter()
            try:
                results = self.run_batch(batch, self.settings)
            except Abandoned:
                continue
            except Exception as e:  # noqa: BLE001 - each request gets one line, the log the traceback
                if not isinstance(e, (ApiError, AttnkitError)):
                    log.exception("the worker failed on a %s batch", batch[0].kind)
                for j in batch:
                    j.finish(error=e)
                continue
            self.metrics.batch(sum(_sentences(j) for j in batch), time.perf_counter() - start)
            self.finished_at = time.monotonic()
            for j, r in zip(batch, results):
                if isinstance(r, BaseException):
                    j.finish(error=r)
                else:
                    j.finish(r)


def _sentences(job: Job) -> int:
    sentences = getattr(job.payload, "sentences", None)
    return len(sentences) if sentences is not None else 1


__all__ = ["Abandoned", "Job", "Worker"]
