"""Which CPUs a measurement gets, and whether anything else is using them.

On the emulated device the RPC server (the "device") and llama-bench (the host side) would otherwise
compete for the same cores, and every contended run is a noisy one: each gets its own half of the
CPUs this job may use. Before each run, other runnable tasks on the machine are counted from
/proc/stat (procs_running, sampled), and the run waits for a quiet machine or is flagged contended.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

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


def wait_for_quiet(max_wait_s: float) -> dict[str, float | bool | None]:
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
