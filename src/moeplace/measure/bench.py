"""Stage 'bench': real llama-bench runs of one model and context at each n_cpu_moe, recorded whatever happens.

The n values share llama-bench processes and so one depth fill (a failed load ends a process: the values
after it get a new one). A run that cannot allocate, crashes or hangs becomes records with status
oom/crash/timeout and the stderr tail, never a lost sweep. The device is a GPU, or the emulated
one (runtime/device.py).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.config import BenchSettings
from ..core.stats import (
    delta_interval,
    fewest_for_median_interval,
    median_halfwidth,
    median_interval,
    outlying,
    repetitions_for,
)
from ..runtime.cpus import split_cpus, wait_for_quiet
from ..runtime.device import PROGRESS, DeviceSetup, HostSide, attached, bound_rules, host_side
from ..runtime.llama_log import is_host, read_log
from ..runtime.llamacpp import Placement, bench_command
from ..runtime.llamacpp_args import UNSUPPORTED, refusal
from ..runtime.process import classify, run, tail
from ..runtime.provenance import build_facts, host_facts, pipeline_revision
from ..runtime.tool_output import bench_records, garbled_records

log = logging.getLogger("moeplace")

TESTS = ("pp", "tg")


def parse_log(stderr: str) -> dict[str, Any]:
    """llama.cpp's own accounting from a -v log: each context's size and KV bytes, each overridden tensor's
    destination buffer (CPU, CPU_REPACK: host RAM; CUDA0, RPC0[...]: a device) and, for the memory check, the
    buffers of its largest context by name (llama-bench loads once per test; CUDA0, CUDA_Host, CPU_Mapped ...)."""
    report = read_log(stderr)
    contexts = [context for load in report.loads for context in load.each_context() if context.n_ctx]
    kv = [{"n_ctx": c.n_ctx, "kv_mib": sum(k.get("kv", 0) for k in c.sizes.values()) / 2**20} for c in contexts]
    largest = max(contexts, key=lambda c: (c.n_ctx, sum(k.get("kv", 0) for k in c.sizes.values())), default=None)
    return {"contexts": kv, "tensor_buffers": dict(sorted(report.overridden.items())),
            "buffers": largest.sizes if largest else None}  # fmt: skip


@dataclass
class Arm:
    """One placement being measured: its samples per test, and its first batch's output."""

    n_cpu_moe: int
    overrides: str | None
    samples: dict[str, list[float]] = field(default_factory=dict)
    first: dict[str, dict[str, Any]] = field(default_factory=dict)  # llama-bench's JSON per test
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


def _precise_enough(samples: dict[str, list[float]], baseline: dict[str, list[float]] | None, precision: float) -> bool:
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


def _test_of(row: dict[str, Any]) -> str:
    return "pp" if row["n_gen"] == 0 else "tg"


def _samples_of(row: dict[str, Any]) -> list[float]:
    """A llama-bench row's tok/s per repetition (its mean alone where it printed no samples)."""
    return row.get("samples_ts") or [row["avg_ts"]]


def _rows_per_arm(arms: list[Arm], rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each arm's rows of one process (arms sharing a process have distinct n values)."""
    if len(arms) == 1:
        return [rows]
    return [[r for r in rows if r.get("n_cpu_moe") == a.n_cpu_moe] for a in arms]


def _fewest(settings: BenchSettings) -> int:
    """The fewest repetitions an arm gets before adaptive settings may stop: as many as a median's interval needs
    (at least `settings.repetitions`), unless fewer are allowed."""
    return min(settings.max_repetitions, max(settings.repetitions, fewest_for_median_interval()))


def _enough(arms: list[Arm], tests: tuple[str, ...], settings: BenchSettings, t0: float) -> Callable[[str], bool]:
    """When to stop an open-ended process, after a whole pass over its arms: every arm with the fewest repetitions
    a median's interval needs and precise enough, or the most repetitions allowed, or the next pass would run
    past the time budget (`time_budget_s` per arm since `t0`), or past twice the process's start, loads, warm-ups
    and depth fill where that is more (the fill paid for is worth as much time in repetitions). A later pass pays
    its repetitions, loads and warm-ups, not the fill: after the first pass its pace is that pass's repetitions
    (llama-bench's samples_ns) and one more, after that the last pass's."""
    pass_ends = [time.monotonic()]
    once = []  # the first pass's wall time less its repetitions: what no later pass pays
    fewest = _fewest(settings)

    def enough(stdout: str) -> bool:
        rows = bench_records(stdout)
        if len(rows) // (len(arms) * len(tests)) < len(pass_ends):
            return False  # no new whole pass
        pass_ends.append(time.monotonic())
        samples = [{t: [*a.samples.get(t, [])] for t in tests} for a in arms]
        for arm_samples, mine in zip(samples, _rows_per_arm(arms, rows)):
            for r in mine:
                arm_samples[_test_of(r)].extend(_samples_of(r))
        counts = [len(v) for arm_samples in samples for v in arm_samples.values()]
        pace = pass_ends[-1] - pass_ends[-2]
        if not once:
            timed = sum(sum(r.get("samples_ns") or []) for r in rows) / 1e9
            once.append(pace - timed if timed else 0.0)
            pace = timed * (settings.repetitions + 1) / settings.repetitions if timed else pace
        if min(counts) >= settings.max_repetitions:
            return True
        return min(counts) >= fewest and (
            all(_precise_enough(arm_samples, None, settings.precision) for arm_samples in samples)
            or pass_ends[-1] + pace - t0 > max(settings.time_budget_s * len(arms), pass_ends[0] - t0 + 2 * once[0])
        )

    return enough


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


@dataclass(frozen=True)
class BenchJob:
    """One configuration to measure: the model, the context (at `depth`, default `settings.depth(ctx)`, so the
    largest test holds exactly `ctx` cells), the placement, and the -ncmoe run it is paired with, if any."""

    model_name: str
    model_path: str
    model_files: list[dict[str, Any]]
    ctx: int
    n_cpu_moe: int
    variant: str = "ncmoe"
    overrides: str | None = None
    depth: int | None = None
    paired_n_cpu_moe: int | None = None
    tensor_split: str | None = None  # several devices: -ts (the paired run too); None: llama.cpp's own split
    n_gpu_layers: int = 99


@dataclass(frozen=True)
class Rig:
    """Where and how configurations are measured: the settings, the device, the llama.cpp build, the log and
    the pipeline's folder (for its revision)."""

    settings: BenchSettings
    device: DeviceSetup
    manifest: dict[str, Any]
    log_path: Path
    workdir: Path


@dataclass
class _Session:
    """One configuration's, or one sweep's, measuring: its arms, the CPUs, the quiet checks before each batch,
    the start."""

    job: BenchJob
    rig: Rig
    depth: int
    tests: tuple[str, ...]
    cpus: Any
    threads: int
    arms: list[Arm]  # the placements measured, in the order llama-bench runs them
    baseline: Arm | None
    host: HostSide  # how llama-bench runs (runtime.device.host_side)
    t0: float  # the start: the time budget counts the device's start too
    quiet: list[dict[str, Any]] = field(default_factory=list)


def run_bench(job: BenchJob, rig: Rig) -> list[dict[str, Any]]:
    """Run one configuration; one record per test, successful or not.

    Repetitions come in one llama-bench process (its own warm-up and one fill of the depth first):
    `settings.repetitions` of them; or with adaptive settings passes of `settings.repetitions` each, stopped
    once the median is precise enough (the fewest for its interval always), so a 32K configuration pays its
    depth fill once. With `paired_n_cpu_moe` the configuration is compared with that
    `-ncmoe` run, measured interleaved with it batch by batch (A B A B ...), so drift falls on both alike; the
    records carry both.
    """
    return run_sweep(job, [job.n_cpu_moe], rig)


def run_sweep(job: BenchJob, n_values: list[int], rig: Rig) -> list[dict[str, Any]]:
    """Run `job` at each of `n_values` (its own n_cpu_moe aside), one record per value and test, successful or not.

    The values share llama-bench processes, so a 32K sweep pays one depth fill (llama-bench restores the KV
    cache it saved for every later load at the same depth) rather than one per value. A value that fails
    to load ends its process (llama-bench stops at the first failed load): it is recorded as failed and the
    values after it get a process of their own; the value below the budget's minimum, expected to run out of
    memory, comes first and costs a load. With adaptive settings the values take turns, pass after pass, until
    all are precise enough or their time is spent (_measure_shared).
    """
    settings = rig.settings
    rig.log_path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    facts = host_facts()
    cpus = split_cpus(rig.device.kind == "emulated")
    baseline = Arm(job.paired_n_cpu_moe, None) if job.paired_n_cpu_moe is not None else None
    depth = settings.depth(job.ctx) if job.depth is None else job.depth
    tests = TESTS if settings.prompt else ("tg",)  # -p 0: a decode-only probe
    threads = min(settings.threads, len(cpus.bench))
    refused, t0 = refusal(settings.flash_attn, settings.type_v), time.monotonic()  # refused: recorded, never run
    arms = [Arm(n, job.overrides, failure=refused and (UNSUPPORTED, refused, "")) for n in sorted(n_values)]
    with (
        attached(rig.device, rig.manifest, cpus, rig.log_path) as rpc,
        host_side(rig.device, cpus.bench, rig.log_path) as host,
    ):
        session = _Session(job, rig, depth, tests, cpus, threads, arms, baseline, host, t0)
        if baseline:
            _measure_paired(session, rpc)
        else:
            _measure_shared(session, rpc)
    return _records(session, started, facts)


def _measure_shared(s: _Session, rpc: str | None) -> None:
    """The arms in one process. With adaptive settings it is open-ended, in passes of `settings.repetitions`
    of each arm in turn (so a slow spell of the host falls on them alike, not on one arm), stopped once all are
    precise enough or their time is spent: one depth fill, and no drift between processes within an arm. A
    failure ends the process: the arms it never reached, or left short of the fewest repetitions wanted, go on
    in the next."""
    settings = s.rig.settings
    todo = [a for a in s.arms if not a.failure]
    while todo:
        if settings.adaptive:
            done = min(a.repetitions(s.tests) for a in todo)
            passes = max(1, math.ceil((settings.max_repetitions - done) / settings.repetitions))
            _batch(s, todo, rpc, passes, _enough(todo, s.tests, settings, s.t0))
        else:
            _batch(s, todo, rpc, 1, None)
        if not any(a.failure for a in todo):
            return
        fewest = _fewest(settings) if settings.adaptive else 1
        todo = [a for a in todo if not a.failure and a.repetitions(s.tests) < fewest]


def _measure_paired(s: _Session, rpc: str | None) -> None:
    """Batches of the arm and its baseline, one process each, interleaved until the difference is precise."""
    reps, (arm,) = s.rig.settings.repetitions, s.arms
    while not arm.failure:
        for a in (s.baseline, arm):
            _batch(s, [a], rpc, 1, None, reps)
            if a.failure:
                break
        if arm.failure:
            return
        if s.baseline.failure:  # nothing to pair with: measure this placement alone
            log.warning("the -ncmoe %d baseline failed (%s); measuring unpaired", s.baseline.n_cpu_moe,
                        s.baseline.failure[1])  # fmt: skip
            s.baseline = None
            _measure_shared(s, rpc)
            return
        reps = _paired_repetitions(s)
        if reps < 1:
            return


def _arm_logs(stderr: str, arms: int, tests: int) -> list[str]:
    """Each arm's part of one process's -v log: what came before the first benchmark (the devices), then the
    lines of its own benchmarks (its model loads, its contexts), cut at llama-bench's --progress "starting".
    The benchmarks run `tests` per arm, arm after arm, pass after pass."""
    parts = [""]
    for line in stderr.splitlines(keepends=True):
        if (m := PROGRESS.match(line)) and m[1].startswith("starting"):
            parts.append("")
        parts[-1] += line
    head, instances = parts[0], parts[1:]
    return [head + "".join(part for i, part in enumerate(instances) if i // tests % arms == arm) for arm in range(arms)]


def _batch(
    s: _Session, arms: list[Arm], rpc: str | None, passes: int, stop_when: Callable[[str], bool] | None,
    reps: int | None = None,
) -> None:  # fmt: skip
    """One llama-bench process for `arms`: `passes` of their n values one after another, `reps` repetitions
    (default `settings.repetitions`) of each test each time, unless `stop_when` ends it sooner; their rows added
    to each. An arm that failed (or the one the process died in), printed no result for a test, or ran on the CPU
    instead of the device gets its failure."""
    settings, manifest, tests = s.rig.settings, s.rig.manifest, s.tests
    s.quiet.append(wait_for_quiet(settings.quiet_wait_s))
    placement = Placement(bound_rules(arms[0].overrides, rpc), s.job.tensor_split, s.job.n_gpu_layers)
    cmd = bench_command(manifest, s.job.model_path, s.depth, [a.n_cpu_moe for a in arms] * passes, settings, rpc,
                        placement, reps, s.threads)  # fmt: skip
    result = run(cmd, timeout_s=settings.timeout_s * len(arms), log_path=s.rig.log_path, before_exec=s.host.enter,
                 on_stderr_line=s.host.on_line, stop_when=stop_when)  # fmt: skip
    rows = bench_records(result.stdout)
    if garbled := garbled_records(result.stdout):
        log.warning("llama-bench printed %d line(s) that start like a record but are not JSON (output of another "
                    "process interleaved?); left out of %s", garbled, s.job.model_name)  # fmt: skip
    logs = _arm_logs(result.stderr, len(arms), len(tests))
    printed = _rows_per_arm(arms, rows)
    whole = [mine[: len(mine) - len(mine) % len(tests)] for mine in printed]  # passes a failed run finished too
    measured = [sum(sum(r.get("samples_ns") or []) for r in done) / 1e9 for done in whole]
    for a, arm_log, own_rows, own_s in zip(arms, logs, whole, measured):
        a.batches += 1
        # The process's fixed part (start, loads, the fill) counts for each arm, its repetitions for their own.
        a.wall_s += result.wall_s - (sum(measured) - own_s)
        a.measured_s += own_s
        if not a.first:  # its log: that of the process that measured it first (or failed it)
            a.stderr = arm_log
        for r in own_rows:
            a.first.setdefault(_test_of(r), r)
            a.samples.setdefault(_test_of(r), []).extend(_samples_of(r))
    if rpc and result.ok and f"RPC0[{rpc.split(',')[0]}]" not in result.stderr:
        # llama-bench runs on the CPU when it cannot reach the RPC server: not the device measured
        for a in arms:
            a.failure = ("crash", "the RPC device went away before llama-bench used it", tail(result.stderr))
        return
    if result.ok:
        for a, mine in zip(arms, printed):
            if missing := set(tests) - {_test_of(r) for r in mine}:
                a.failure = ("error", f"llama-bench printed no {'/'.join(sorted(missing))} result", tail(a.stderr))
        return
    # The process ended early, in the benchmark after the last one it printed (in the last, if it printed all).
    running = min(len(rows), len(arms) * len(tests) * passes - 1)
    failed = running // len(tests) % len(arms)
    status, reason = classify(result)
    if status == "ok":
        status, reason = "error", "llama-bench stopped early"
    arms[failed].failure = (status, reason, tail(logs[failed]))


def _paired_repetitions(s: _Session) -> int:
    """How many repetitions the next batch of the arm and its baseline gets each (0: stop): none once the
    difference is precise enough."""
    settings, (arm,) = s.rig.settings, s.arms
    if not settings.adaptive or _precise_enough(arm.samples, s.baseline.samples, settings.precision):
        return 0
    n = len(arm.samples["tg"])
    # A difference of two means is as precise as each mean is to precision / sqrt(2).
    pair = (s.baseline, arm)
    wanted = max(repetitions_for(a.samples[t], settings.precision / math.sqrt(2)) for a in pair for t in s.tests) - n
    fixed_s, repetition_s = (max(c) for c in zip(*(a.costs() for a in pair)))
    left_s = settings.time_budget_s * 2 - (time.monotonic() - s.t0)
    return next_batch(wanted, settings.max_repetitions - n, fixed_s, repetition_s, left_s / 2)


def _records(s: _Session, started: str, facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's records, one per arm and test, with everything that ties them to their inputs."""
    seen = [q["contended"] for q in s.quiet]
    contended = True if any(seen) else None if seen and all(c is None for c in seen) else False
    records = []
    for arm in s.arms:
        base = _base(s, arm, started, facts, contended)
        arm_records = [_record(base, test, arm, s.baseline, s.rig.settings, contended) for test in s.tests]
        statuses = ", ".join(f"{r['test']} {r['status']}" for r in arm_records)
        log.info("n_cpu_moe=%d ctx=%d: %s", arm.n_cpu_moe, s.job.ctx, statuses)
        records += arm_records
    return records


def _base(s: _Session, arm: Arm, started: str, facts: dict[str, Any], contended: bool | None) -> dict[str, Any]:
    """What every record of `arm` carries: the configuration, the device, the build, the host, the revision."""
    job, rig, settings = s.job, s.rig, s.rig.settings
    parsed = parse_log(arm.stderr)
    return {
        "model": job.model_name,
        "ctx": job.ctx,
        "n_cpu_moe": arm.n_cpu_moe,
        "variant": job.variant,
        "overrides": job.overrides or "",
        "tensor_split": job.tensor_split or "",
        "n_gpu_layers": job.n_gpu_layers,
        "n_prompt": settings.prompt,
        "n_gen": settings.gen,
        "n_depth": s.depth,
        "threads": s.threads,
        "bench_cpus": list(s.cpus.bench),
        "device_cpus": list(s.cpus.device) if s.cpus.device else None,
        "type_k": settings.type_k,
        "type_v": settings.type_v,
        "device_kind": rig.device.kind,
        "device": rig.device.label,
        "device_cap_bytes": rig.device.cap_bytes,
        "device_caps_bytes": list(rig.device.caps),
        "host_slowdown": rig.device.host_slowdown,
        **build_facts(rig.manifest),
        "model_files": job.model_files,
        "started": started,
        **facts,
        "others_running": max((q["others_running"] for q in s.quiet if q["others_running"] is not None), default=None),
        "contended": contended,
        **pipeline_revision(rig.workdir),
        "kv_contexts": parsed["contexts"],
        "buffers": parsed["buffers"],
        "ubatch": settings.ubatch,
        "flash_attn": settings.flash_attn,
        "tensor_buffers": parsed["tensor_buffers"],
        "cpu_tensors": [name for name, buffer in parsed["tensor_buffers"].items() if is_host(buffer)],
        "batches": arm.batches,
        "precision_target": settings.precision if settings.adaptive else None,
        "paired_n_cpu_moe": job.paired_n_cpu_moe,
    }


def _record(
    base: dict[str, Any], test: str, arm: Arm, baseline: Arm | None, settings: BenchSettings, contended: bool
) -> dict[str, Any]:
    samples = arm.samples.get(test) or []
    if not samples:
        status, reason, stderr_tail = arm.failure or ("error", "no result", "")
        return {**base, "test": test, "status": status, "median_ts": None, "ci95_low_ts": None, "ci95_high_ts": None,
                "outlying_ts": [], "avg_ts": None, "stddev_ts": None, "samples_ts": [],
                "repetitions": 0, "cv": None, "ci95_halfwidth_pct": None, "target_reached": None, "noisy": None,
                "backends": None, "gpu_info": None, "error": f"{reason}: {stderr_tail}"}  # fmt: skip
    mean = statistics.fmean(samples)
    cv = statistics.stdev(samples) / mean if len(samples) > 1 and mean else 0.0
    median, low, high = median_interval(samples)
    halfwidth = median_halfwidth(samples)
    paired = baseline.samples.get(test) if baseline else None
    first = arm.first[test]
    record = {
        **base,
        "test": test,
        # a run that failed after some repetitions keeps them, under its failure's status (partial)
        "status": arm.failure[0] if arm.failure else "ok",
        "partial": bool(arm.failure),
        # The configuration's value is the median; llama-bench's mean and sd are kept beside it.
        "median_ts": median,
        "ci95_low_ts": None if math.isnan(low) else low,
        "ci95_high_ts": None if math.isnan(high) else high,
        "interval": "order statistics of the median (95%); none below 6 repetitions",
        "outlying_ts": outlying(samples, settings.precision),
        "avg_ts": mean,
        "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "samples_ts": samples,
        "repetitions": len(samples),
        "cv": cv,
        "ci95_halfwidth_pct": 100 * halfwidth if math.isfinite(halfwidth) else None,
        "target_reached": _precise_enough({test: samples}, {test: paired} if paired else None, settings.precision)
        if settings.adaptive
        else None,
        "noisy": cv > settings.noisy_cv or bool(contended),
        "backends": first.get("backends"),
        "gpu_info": first.get("gpu_info"),
        # llama-bench's own row of the first batch (its per-sample arrays aside), for the published SQLite.
        "llama_bench": {k: v for k, v in first.items() if not k.startswith("samples_")},
        "error": "" if not arm.failure else f"stopped after {len(samples)} repetitions: {arm.failure[1]}",
    }
    if baseline is not None:
        record["baseline_samples_ts"] = paired or []
    return record


def auto_sweep(n_min: int | None, n_layer: int, points_above: int = 3, step: int = 0) -> list[int]:
    """The value below the budget's minimum (expected to run out of memory: the budget's proof), the minimum and
    its next neighbour (where the card's speed is decided), and up to all layers: `points_above` spread evenly
    from the minimum, or every `step`-th n."""
    if n_min is None:  # the context does not fit at all: one run records how it fails
        return [n_layer]
    below = [n_min - 1] if n_min > 0 else []
    if step:
        return below + sorted({*range(n_min, n_layer + 1, step), n_layer})
    spread = {n_min + round(i * (n_layer - n_min) / (points_above - 1)) for i in range(points_above)}
    return below + sorted({n_min, min(n_min + 1, n_layer), *spread})
