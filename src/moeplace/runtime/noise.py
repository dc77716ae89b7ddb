"""What the machine does to each timed repetition (issue 65): read from the kernel as llama-bench announces each
run, so a repetition's speed can be set beside what slowed it.

For every repetition llama-bench times (its --progress lines "prompt run k/R", "generation run k/R" open one; the
next progress line, or the process's end, closes it) we keep:

- `steal_ms`: the time the hypervisor ran something else on our CPUs (/proc/stat's steal, 10 ms ticks), on the
  host side's CPUs and on the emulated device's;
- for llama-bench (`host`), the emulated device (`device`, ggml-rpc-server) and the slowed core's real-time thread
  (`spinner`, native/slowcore.c): the milliseconds each spent on a CPU and waiting for one
  (/proc/PID/task/*/schedstat), and its involuntary context switches per second (/proc/PID/task/*/status).

The spinner's time on a CPU over the wall time is the slowed core's real duty cycle: 1 - 1/slowdown (0.875 at 8x).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
# The processes watched, by the name the kernel gives them (the first 15 characters of the program's file name:
# native.build_native's moeplace-slowcore-<digest> is "moeplace-slowco").
WATCHED = {"llama-bench": "host", "ggml-rpc-server": "device", "moeplace-slowco": "spinner"}
_TIMED = re.compile(r"llama-bench: benchmark (\d+)/\d+: (prompt|generation) run")
_STEAL = 7  # /proc/stat's cpuN columns: user nice system idle iowait irq softirq steal ...


@dataclass(frozen=True)
class Counters:
    """One reading: the monotonic time, each CPU's steal ticks, and per watched role each of its threads' time on a
    CPU and waiting for one (ns) and involuntary switches, by thread id."""

    t_ns: int
    steal: dict[int, int]
    threads: dict[str, dict[int, tuple[int, int, int]]]


def _steal_ticks(cpus: Iterable[int]) -> dict[int, int]:
    wanted = {f"cpu{c}": c for c in cpus}
    found: dict[int, int] = {}
    try:
        for line in (PROC / "stat").read_text().splitlines():
            name, _, rest = line.partition(" ")
            if name in wanted:
                found[wanted[name]] = int(rest.split()[_STEAL])
    except (OSError, ValueError, IndexError):
        pass
    return found


def _threads(pid: int) -> dict[int, tuple[int, int, int]]:
    """A process's threads' time on a CPU and waiting for one (ns), and their involuntary switches, by thread id
    (none once it has ended)."""
    found = {}
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            on_cpu, waiting, _ = (task / "schedstat").read_text().split()
            status = (task / "status").read_text()
        except (OSError, ValueError):
            continue
        m = re.search(r"^nonvoluntary_ctxt_switches:\s*(\d+)", status, re.M)
        found[int(task.name)] = (int(on_cpu), int(waiting), int(m[1]) if m else 0)
    return found


def watched_children(parent: int | None = None) -> dict[str, list[int]]:
    """The watched processes among `parent`'s children (default: this process's), by role."""
    parent = os.getpid() if parent is None else parent
    found: dict[str, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, after = stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2 :].split()
        if name in WATCHED and int(after[1]) == parent:
            found.setdefault(WATCHED[name], []).append(int(entry.name))
    return found


def read_counters(cpus: Iterable[int], roles: dict[str, list[int]]) -> Counters:
    threads = {role: {tid: v for pid in pids for tid, v in _threads(pid).items()} for role, pids in roles.items()}
    return Counters(time.monotonic_ns(), _steal_ticks(cpus), threads)


def between(a: Counters, b: Counters, host_cpus: tuple[int, ...]) -> dict[str, float]:
    """What happened from reading `a` to `b`: its wall ms, the steal ms on the host side's CPUs and the others',
    and per role its threads' ms on a CPU and waiting for one, and their involuntary switches per second (threads
    that came or went meanwhile left out; a role with none in both readings, as the process that ended before the
    last run was read again, left out)."""
    wall_ns = max(1, b.t_ns - a.t_ns)
    stolen = {c: (b.steal.get(c, 0) - a.steal.get(c, 0)) * TICK_MS for c in b.steal}
    found = {
        "wall_ms": wall_ns / 1e6,
        "steal_host_ms": sum(ms for c, ms in stolen.items() if c in host_cpus),
        "steal_device_ms": sum(ms for c, ms in stolen.items() if c not in host_cpus),
    }
    for role in b.threads.keys() & a.threads.keys():
        both = b.threads[role].keys() & a.threads[role].keys()
        if not both:
            continue
        delta = [sum(b.threads[role][t][i] - a.threads[role][t][i] for t in both) for i in range(3)]
        found[f"{role}_cpu_ms"] = delta[0] / 1e6
        found[f"{role}_waiting_ms"] = delta[1] / 1e6
        found[f"{role}_switches_per_s"] = delta[2] / (wall_ns / 1e9)
    return {k: round(v, 3) for k, v in found.items()}


@dataclass
class RepetitionNoise:
    """Fed llama-bench's stderr lines (on_line): what each timed repetition went through, with the number of the
    benchmark (1-based, as llama-bench counts them) it belongs to; `take` hands them over and starts afresh."""

    host_cpus: tuple[int, ...]
    all_cpus: tuple[int, ...]
    _roles: dict[str, list[int]] | None = None
    _open: tuple[int, Counters] | None = None
    _done: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def on_line(self, line: str) -> None:
        if not line.startswith("llama-bench: benchmark"):
            return
        self._close()
        if line.startswith("llama-bench: benchmark 1/"):  # a new process: its companions are found again
            self._roles = None
        if m := _TIMED.match(line):
            if self._roles is None:  # llama-bench is running by now: find it and its companions once
                self._roles = watched_children()
            self._open = (int(m[1]), read_counters(self.all_cpus, self._roles))

    def _close(self) -> None:
        if self._open is not None and self._roles is not None:
            benchmark, start = self._open
            self._done.append((benchmark, between(start, read_counters(self.all_cpus, self._roles), self.host_cpus)))
        self._open = None

    def take(self) -> list[tuple[int, dict[str, float]]]:
        """The repetitions since the last take (the process has ended: an open one ends now), in order."""
        self._close()
        done, self._done, self._roles = self._done, [], None
        return done
