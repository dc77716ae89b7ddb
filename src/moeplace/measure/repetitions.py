"""How many repetitions a configuration gets: each arm's samples so far and what its batches cost, when an
open-ended llama-bench process has measured enough, how large an arm's next batch is, and when a median (or a
paired difference) is precise enough.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.config import BenchSettings
from ..core.records import LlamaBenchRow
from ..core.stats import delta_interval, fewest_for_median_interval, median_halfwidth
from ..runtime.tool_output import bench_records

# What a person watching a run should see as it goes (the pipeline's stages show it on the terminal).
progress = logging.getLogger("moeplace.progress")


@dataclass
class Arm:
    """One placement being measured: its samples per test, and its first batch's output."""

    n_cpu_moe: int
    overrides: str | None
    samples: dict[str, list[float]] = field(default_factory=dict)
    # beside each sample, what the machine did to that repetition (runtime/noise.py; None where unread)
    noise: dict[str, list[dict[str, float] | None]] = field(default_factory=dict)
    warmups: dict[str, list[float]] = field(default_factory=dict)  # repetitions left out as warm-ups (warmed_up)
    first: dict[str, LlamaBenchRow] = field(default_factory=dict)  # llama-bench's row per test
    stderr: str = ""
    batches: int = 0
    wall_s: float = 0.0  # its batches' processes, start to exit, less the other arms' repetitions in them
    measured_s: float = 0.0  # of which timed repetitions (llama-bench's samples_ns)
    failure: tuple[str, str, str] | None = None  # status, reason, stderr tail

    def repetitions(self, tests: tuple[str, ...]) -> int:
        """The fewest repetitions any of `tests` has so far."""
        return min(len(self.samples.get(t, [])) for t in tests)

    def costs(self) -> tuple[float, float]:
        """(seconds per batch outside the repetitions: start, load, warm-up, one depth fill; seconds per
        repetition of all tests), from the batches so far."""
        repetitions = len(next(iter(self.samples.values())))
        return (self.wall_s - self.measured_s) / self.batches, self.measured_s / repetitions


def precise_enough(samples: dict[str, list[float]], baseline: dict[str, list[float]] | None, precision: float) -> bool:
    """Every test's 95% CI half-width within `precision`: of the median (distribution-free, so a slow spell's
    repetitions widen it only when they are many, and a noisy configuration is measured again instead), or with
    a paired baseline, of the mean difference from it (relative to the baseline's mean)."""
    for test, values in samples.items():
        base = (baseline or {}).get(test)
        if base:
            _, low, high = delta_interval(values, base)
            if not (high - low) / 2 <= precision * statistics.fmean(base):
                return False
        elif median_halfwidth(values) > precision:
            return False
    return True


def test_of(row: LlamaBenchRow) -> str:
    return "pp" if row["n_gen"] == 0 else "tg"


def warmups(prompt: bool, depth: int, repetitions: int) -> int:
    """How many of a llama-bench test's first repetitions are a warm-up, left out: at a depth, llama-bench's first
    prompt run after each depth fill runs 5-20% slower than the two after it, every pass and every value (measured
    on the default sweep, docs/measurements.md, issue 65), where its own warm-up run comes before the fill."""
    return 1 if prompt and depth > 0 and repetitions > 1 else 0


def warmed_up(row: LlamaBenchRow) -> int:
    """The warm-ups of a row llama-bench printed (warmups)."""
    return warmups(row["n_gen"] == 0, row.get("n_depth") or 0, len(row.get("samples_ts") or []))


def samples_of(row: LlamaBenchRow) -> list[float]:
    """A llama-bench row's tok/s per repetition, its warm-up left out (its mean alone where it printed no
    samples)."""
    return (row.get("samples_ts") or [row["avg_ts"]])[warmed_up(row) :]


def rows_per_arm(arms: list[Arm], rows: list[LlamaBenchRow]) -> list[list[LlamaBenchRow]]:
    """Each arm's rows of one process (arms sharing a process have distinct n values)."""
    if len(arms) == 1:
        return [rows]
    return [[r for r in rows if r.get("n_cpu_moe") == a.n_cpu_moe] for a in arms]


def fewest_repetitions(settings: BenchSettings) -> int:
    """The fewest repetitions an arm gets before adaptive settings may stop (at least `settings.repetitions`,
    unless fewer are allowed): as many as a median's interval needs to leave out the slowest and the fastest
    repetition, 9, so that one slow repetition (a VM host's hiccup) cannot widen it. With the 6 an interval needs
    at all, it spans all six: of 40 medians of the default sweep, 82% were within 5% after 6 repetitions, 92%
    after 9 and 94% after 12 (docs/measurements.md, issue 65)."""
    return min(settings.max_repetitions, max(settings.repetitions, fewest_for_median_interval(spared=1)))


def stop_when_enough(
    arms: list[Arm], tests: tuple[str, ...], settings: BenchSettings, t0: float
) -> Callable[[str], bool]:
    """When to stop an open-ended process, after a whole pass over its arms: every arm with the fewest repetitions
    a median's interval needs and precise enough, or the most repetitions allowed, or the next pass would run
    past the time budget (`time_budget_s` per arm since `t0`), or past twice the process's start, loads, warm-ups
    and depth fill where that is more (the fill paid for is worth as much time in repetitions). A later pass pays
    its repetitions, loads and warm-ups, not the fill: after the first pass its pace is that pass's repetitions
    (llama-bench's samples_ns) and one more, after that the last pass's."""
    pass_ends = [time.monotonic()]
    once: list[float] = []  # the first pass's wall time less its repetitions: what no later pass pays
    fewest = fewest_repetitions(settings)

    def enough(stdout: str) -> bool:
        rows = bench_records(stdout)
        if len(rows) // (len(arms) * len(tests)) < len(pass_ends):
            return False  # no new whole pass
        pass_ends.append(time.monotonic())
        samples = [{t: [*a.samples.get(t, [])] for t in tests} for a in arms]
        for arm_samples, mine in zip(samples, rows_per_arm(arms, rows)):
            for r in mine:
                arm_samples[test_of(r)].extend(samples_of(r))
        counts = [len(v) for arm_samples in samples for v in arm_samples.values()]
        pace = pass_ends[-1] - pass_ends[-2]
        if not once:
            timed = sum(sum(r.get("samples_ns") or []) for r in rows) / 1e9
            once.append(pace - timed if timed else 0.0)
            each = len(rows[0].get("samples_ns") or []) or settings.repetitions  # a test's repetitions a pass
            pace = timed * (each + 1) / each if timed else pace
        limit_s = max(settings.time_budget_s * len(arms), pass_ends[0] - t0 + 2 * once[0])
        stop = min(counts) >= settings.max_repetitions or (
            min(counts) >= fewest
            and (
                all(precise_enough(arm_samples, None, settings.precision) for arm_samples in samples)
                or pass_ends[-1] + pace - t0 > limit_s
            )
        )
        left_s = 0.0 if stop else max(0.0, limit_s - (pass_ends[-1] - t0))
        progress.info("%s", pass_summary(arms, samples, settings.precision, len(pass_ends) - 1, left_s))
        return stop

    return enough


def imprecise(arms: list[Arm], precision: float) -> str | None:
    """The values that ran but missed the precision target, said in a line (None: every one reached it)."""
    short = [str(a.n_cpu_moe) for a in arms if not a.failure and not precise_enough(a.samples, None, precision)]
    if not short:
        return None
    return (
        f"n_cpu_moe {', '.join(short)} not within the {100 * precision:.0f}% target in the time allowed (see the "
        "precision table); more bench.time_budget_s or a quieter machine narrows them"
    )


def pass_summary(
    arms: list[Arm], samples: list[dict[str, list[float]]], precision: float, done: int, left_s: float
) -> str:
    """One line after a pass: each value's repetitions, decode median and its interval's half-width (* where it is
    not yet within `precision`), and at most how long the sweep has left."""
    parts = []
    for arm, arm_samples in zip(arms, samples):
        tg = arm_samples.get("tg") or next(iter(arm_samples.values()))
        width = median_halfwidth(tg)
        shown = "no interval yet" if math.isinf(width) else f"±{100 * width:.1f}%{'' if width <= precision else '*'}"
        parts.append(f"n={arm.n_cpu_moe} {len(tg)}x {statistics.median(tg):.1f} tok/s {shown}")
    left = "done" if left_s == 0 else f"at most {left_s / 60:.0f} min {left_s % 60:.0f} s left"
    return f"pass {done}: " + "; ".join(parts) + f" ({left})"


def next_batch(wanted: int, allowed: int, fixed_s: float, repetition_s: float, left_s: float) -> int:
    """Repetitions for an arm's next batch (0: stop): the `wanted` more, but at least as many as the batch's
    fixed part (start, load, warm-up, one depth fill: most of a batch at 32K) is worth, since another batch
    would pay it again; at most `allowed`, and no more than the `left_s` seconds of its time budget pay for.
    None where the budget pays for fewer than that fixed part is worth: such a batch would spend most of its
    time filling the depth again, for a few repetitions that barely narrow a median's interval."""
    affordable = int((left_s - fixed_s) // max(repetition_s, 1e-9))
    worth = math.ceil(fixed_s / max(repetition_s, 1e-9))
    batch = max(0, min(allowed, max(wanted, worth, 1), affordable))
    return batch if batch >= min(worth, allowed) else 0


def add_rows(arms: list[Arm], printed: list[list[LlamaBenchRow]], logs: list[str], wall_s: float, tests: int) -> None:
    """Each arm's rows of one process, its whole passes (those a failed run finished too), its log where it has
    none yet, and its share of the process's time."""
    whole = [mine[: len(mine) - len(mine) % tests] for mine in printed]
    measured = [sum(sum(r.get("samples_ns") or []) for r in done) / 1e9 for done in whole]
    for a, arm_log, own_rows, own_s in zip(arms, logs, whole, measured):
        a.batches += 1
        # The process's fixed part (start, loads, the fill) counts for each arm, its repetitions for their own.
        a.wall_s += wall_s - (sum(measured) - own_s)
        a.measured_s += own_s
        if not a.first:  # its log: that of the process that measured it first (or failed it)
            a.stderr = arm_log
        for r in own_rows:
            a.first.setdefault(test_of(r), r)
            a.samples.setdefault(test_of(r), []).extend(samples_of(r))
            a.warmups.setdefault(test_of(r), []).extend((r.get("samples_ts") or [])[: warmed_up(r)])


def add_noise(
    arms: list[Arm],
    printed: list[list[LlamaBenchRow]],
    rows: list[LlamaBenchRow],
    noise: list[tuple[int, dict[str, float]]],
    tests: int,
) -> None:
    """Beside each sample add_rows kept, what the machine did to its repetition: llama-bench prints its rows in
    the order it runs its benchmarks, so the j-th row's repetitions are those of benchmark j + 1."""
    benchmark = {id(r): j + 1 for j, r in enumerate(rows)}
    for a, mine in zip(arms, printed):
        for r in mine[: len(mine) - len(mine) % tests]:
            reps = [found for b, found in noise if b == benchmark[id(r)]][warmed_up(r) :]
            n = len(samples_of(r))
            a.noise.setdefault(test_of(r), []).extend(reps if len(reps) == n else [None] * n)
