"""Which CPUs a measurement gets, whether anything else is using them, and how some are made slower.

On the emulated device the RPC server (the "device") and llama-bench (the host side) would otherwise
compete for the same cores, and every contended run is a noisy one: each gets its own half of the
CPUs this job may use. Before each run, other runnable tasks on the machine are counted from
/proc/stat (procs_running, sampled), and the run waits for a quiet machine or is flagged contended.
The host side's CPUs can be made a declared factor slower (native/slowcore.c), as a real card's host is.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..core.errors import MoeplaceError
from .native import build_native
from .process import run, spawn

log = logging.getLogger("moeplace")

PROC_STAT = Path("/proc/stat")
# Other runnable tasks, on average, above which a machine is busy: one core half taken.
BUSY = 0.5


@dataclass(frozen=True)
class CpuSplit:
    bench: tuple[int, ...]  # llama-bench's CPUs
    device: tuple[int, ...] | None  # the emulated device's, or None (a GPU, or a single CPU shared)


def split_cpus(emulated: bool, cpus: tuple[int, ...] | None = None) -> CpuSplit:
    """Disjoint halves for llama-bench and the emulated device (the device gets the odd one out)."""
    cpus = tuple(sorted(os.sched_getaffinity(0))) if cpus is None else cpus
    if not emulated or len(cpus) < 2:
        return CpuSplit(cpus, None)
    half = len(cpus) // 2
    return CpuSplit(cpus[:half], cpus[half:])


def pin(cpus: tuple[int, ...]) -> None:
    """In a child before exec: run only on these CPUs (its threads inherit them)."""
    os.sched_setaffinity(0, cpus)


def others_running(seconds: float = 1.0, interval: float = 0.1) -> float | None:
    """Runnable tasks other than this one, averaged over `seconds` (None where /proc/stat is unreadable)."""
    samples = []
    deadline = time.monotonic() + seconds
    while True:
        try:
            line = next(ln for ln in PROC_STAT.read_text().splitlines() if ln.startswith("procs_running"))
        except (OSError, StopIteration):
            return None
        samples.append(max(0, int(line.split()[1]) - 1))
        if time.monotonic() >= deadline:
            return sum(samples) / len(samples)
        time.sleep(interval)


class Quiet(TypedDict):
    """What wait_for_quiet saw: the other runnable tasks (None: unknown), how long it waited, whether the run is
    contended (None: unknown)."""

    others_running: float | None
    quiet_wait_s: float
    contended: bool | None


def wait_for_quiet(max_wait_s: float) -> Quiet:
    """Wait up to `max_wait_s` for the other runnable tasks to fall below BUSY; what was seen, for the record
    (contended None: this machine does not say, /proc/stat being unreadable)."""
    start = time.monotonic()
    while True:
        busy = others_running()
        if busy is None:
            log.warning("%s is unreadable: whether other tasks share the CPUs is unknown for this run", PROC_STAT)
            return {"others_running": None, "quiet_wait_s": 0.0, "contended": None}
        waited = time.monotonic() - start
        if busy < BUSY or waited >= max_wait_s:
            if busy >= BUSY:
                log.warning("%.1f other tasks still running after %.0f s: this run is contended", busy, waited)
            return {"others_running": round(busy, 2), "quiet_wait_s": round(waited, 1), "contended": busy >= BUSY}


def realtime_refusal() -> str | None:
    """None where this user may run real-time (SCHED_FIFO) threads, which slowing a CPU needs; else why not."""
    probe = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    if run([sys.executable, "-c", probe], timeout_s=30).ok:
        return None
    return "real-time scheduling refused: run as root, or raise this user's RLIMIT_RTPRIO"


@contextmanager
def slowed(cpus: tuple[int, ...], factor: float, log_path: Path) -> Iterator[Callable[[bool], None]]:
    """A switch that makes `cpus` `factor` times slower for everything else on them while on (native/slowcore.c:
    a real-time thread on each holds it for the rest of every millisecond); off at first, and ended after."""
    tool = build_native("slowcore", log_path, shared=False)
    proc = spawn([str(tool), f"{factor:g}", *map(str, cpus)], env=None, log_path=log_path)
    try:
        time.sleep(0.2)
        if proc.poll() is not None:  # a refusal ends it at once
            raise MoeplaceError(
                f"the host side cannot be slowed (slowcore exited with {proc.returncode}); "
                f"see {log_path}, or set device.host_slowdown: 1."
            )
        os.kill(proc.pid, signal.SIGSTOP)
        yield lambda on: os.kill(proc.pid, signal.SIGCONT if on else signal.SIGSTOP)
    finally:
        proc.kill()
        proc.wait()
