"""How many CPU threads attnkit's torch work runs on: a default that does not collapse on a shared machine.

PyTorch's own default is one OpenMP thread per core. Every parallel op then ends at a barrier where the team
waits for its slowest thread, so when another process keeps one of the cores busy, the thread that shares
that core is descheduled for whole time slices and every op waits for it: on a 2-core machine with one core
held by a busy loop, ``attnkit demo`` ran at 0.33 steps/s or less with torch's two threads, against 13-15
steps/s with one thread (22.7 steps/s with two on a quiet machine).

The rule (:func:`default_threads`, a pure function of its measurements, and :func:`choose_threads`):

1. ``--threads N`` on the command line, then the config's ``train.threads`` when > 0 (``attnkit train``
   applies it through the config), then ``OMP_NUM_THREADS`` when it is set to a positive integer (torchrun
   sets it to 1 for several ranks, and the Makefile's recipes set it), win in that order. Otherwise:
2. usable cores = the cores this process may run on (``os.sched_getaffinity``), capped by a cgroup CPU
   quota (``cpu.max``) rounded down, divided among the local ranks of a torchrun job (``LOCAL_WORLD_SIZE``);
3. busy cores = the CPU time the other processes spent on those usable cores while this one slept for
   :data:`SAMPLE_SECONDS` (two reads of ``/proc/stat``, per core; user, nice, system, irq, softirq and steal
   count as busy, idle and iowait as free), in cores, rounded half up: a core held by a busy loop counts 1,
   background noise of a few percent counts 0. Without ``/proc/stat`` (not Linux) the 1-minute load average
   stands in; without either, nothing is busy;
4. threads = usable cores - busy cores, at least 1.

The measurement is taken once, when a command starts: a process that starts competing later is not seen.
Sampling costs :data:`SAMPLE_SECONDS` of wall time and is skipped where the answer cannot exceed 1.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping

SAMPLE_SECONDS = 0.15
# /proc/stat columns after the cpu name: user nice system idle iowait irq softirq steal guest guest_nice.
# guest time is already inside user (and guest_nice inside nice), so it is not added again.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
_IDLE_COLUMNS = (3, 4)

CpuTimes = Mapping[int, tuple[int, int]]  # cpu id -> (busy jiffies, total jiffies)


def parse_proc_stat(text: str) -> dict[int, tuple[int, int]]:
    """The per-core lines (``cpu0``, ``cpu1``, ...) of ``/proc/stat``: cpu id -> (busy, total) jiffies."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu = int(name[3:])
            values = [int(v) for v in rest.split()]
        except ValueError:
            continue
        values += [0] * (8 - len(values))  # old kernels have fewer columns
        busy = sum(values[i] for i in _BUSY_COLUMNS)
        out[cpu] = (busy, busy + sum(values[i] for i in _IDLE_COLUMNS))
    return out


def busy_cores(before: CpuTimes, after: CpuTimes, cpus: Iterable[int], own_jiffies: float = 0.0) -> float:
    """Cores' worth of CPU time the other processes used on ``cpus`` between two :func:`parse_proc_stat`
    samples; ``own_jiffies`` (this process's CPU time over the same interval) is taken out."""
    busy, spans = 0.0, []
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            continue
        d_busy, d_total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        if d_total > 0:
            busy += d_busy / d_total
            spans.append(d_total)
    if not spans:
        return 0.0
    span = sum(spans) / len(spans)  # the interval in jiffies, as one core's clock saw it
    return max(busy - own_jiffies / span, 0.0)


def choose_threads(usable: int, busy: float) -> int:
    """Threads for ``usable`` cores when other processes keep ``busy`` cores' worth of them busy: the cores
    left, with a busy fraction of a half or more counting as a whole core; at least 1."""
    return max(1, int(usable) - math.floor(busy + 0.5))


def cgroup_cpu_limit(cpu_max: str | None) -> int | None:
    """Whole cores allowed by a cgroup v2 ``cpu.max`` text (``"QUOTA PERIOD"`` or ``"max PERIOD"``), rounded
    down and at least 1; None for no limit or an unreadable text."""
    if not cpu_max:
        return None
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, quota // period)


def usable_cores(affinity: Iterable[int], cpu_max: str | None = None, local_world_size: int = 1) -> int:
    """The cores one process may use: its affinity set, capped by the cgroup quota, shared among the
    ``local_world_size`` ranks on this machine; at least 1."""
    n = len(set(affinity))
    limit = cgroup_cpu_limit(cpu_max)
    if limit is not None:
        n = min(n, limit)
    return max(1, n // max(1, local_world_size))


def default_threads(affinity: Iterable[int], before: CpuTimes | None, after: CpuTimes | None,
                    cpu_max: str | None = None, local_world_size: int = 1, own_jiffies: float = 0.0,
                    loadavg: float | None = None) -> int:
    """The rule of this module's docstring (steps 2-4) on given measurements: no files read, no clock."""
    affinity = sorted(set(affinity))
    usable = usable_cores(affinity, cpu_max, local_world_size)
    if before is not None and after is not None:
        busy = busy_cores(before, after, affinity, own_jiffies)
    elif loadavg is not None:
        busy = loadavg
    else:
        busy = 0.0
    return choose_threads(usable, busy)


# --- the measurements (this machine, now)

def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cpu_max() -> str | None:
    text = _read("/sys/fs/cgroup/cpu.max")  # cgroup v2 (the process's own cgroup is mounted there in a container)
    if text is not None:
        return text.strip()
    quota, period = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if quota is not None and period is not None:  # cgroup v1, as "QUOTA PERIOD" (quota -1: no limit)
        quota = quota.strip()
        return f"{'max' if quota.startswith('-') else quota} {period.strip()}"
    return None


def _env_int(name: str) -> int | None:
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def measure_default_threads(sample_seconds: float = SAMPLE_SECONDS) -> int:
    """:func:`default_threads` on this machine now (sleeps ``sample_seconds`` when there is a choice to make)."""
    affinity = _affinity()
    cpu_max = _cpu_max()
    local = _env_int("LOCAL_WORLD_SIZE") or 1
    if usable_cores(affinity, cpu_max, local) <= 1:
        return 1
    first = _read("/proc/stat")
    if first is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = None
        return default_threads(affinity, None, None, cpu_max, local, loadavg=load)
    own = os.times()
    time.sleep(sample_seconds)
    second = _read("/proc/stat")
    own_after = os.times()
    try:
        hz = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        hz = 100
    own_jiffies = ((own_after.user - own.user) + (own_after.system - own.system)) * hz
    before, after = parse_proc_stat(first), parse_proc_stat(second or "")
    return default_threads(affinity, before, after or None, cpu_max, local, own_jiffies)


def resolve_threads(requested: int | None = None) -> tuple[int, str]:
    """(threads, why): ``requested`` (``--threads``) when > 0, else ``OMP_NUM_THREADS`` when set, else
    :func:`measure_default_threads`. The config's ``train.threads`` is applied later by the trainer."""
    if requested is not None and requested > 0:
        return requested, "--threads"
    env = _env_int("OMP_NUM_THREADS")
    if env is not None:
        return env, "OMP_NUM_THREADS"
    return measure_default_threads(), "free cores"


def apply_threads(n: int) -> None:
    """Run torch's intra-op work on ``n`` threads, and its inter-op pool too while it has not started."""
    import torch

    torch.set_num_threads(n)
    try:
        if torch.get_num_interop_threads() != n:
            torch.set_num_interop_threads(n)
    except RuntimeError:  # only settable once, before any inter-op work: keep the pool there is
        pass


def configure(requested: int | None = None) -> int:
    """:func:`resolve_threads` then :func:`apply_threads`; returns the thread count."""
    n, _ = resolve_threads(requested)
    apply_threads(n)
    return n


__all__ = ["SAMPLE_SECONDS", "apply_threads", "busy_cores", "cgroup_cpu_limit", "choose_threads", "configure",
           "default_threads", "measure_default_threads", "parse_proc_stat", "resolve_threads", "usable_cores"]
