"""Stage 'bench': real llama-bench runs of one model and context at each n_cpu_moe, recorded whatever happens.

The n values share llama-bench processes and so one depth fill (a failed load ends a process: the values
after it get a new one). A run that cannot allocate, crashes or hangs becomes records with status
oom/crash/timeout and the stderr tail, never a lost sweep. The device is a GPU, or the emulated
one (runtime/device.py). A full disk or Ctrl-C loses nothing measured, and a rerun measures only what is missing
(sweep_records.py); one sweep at a time measures on a device (runtime/locks.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.config import BenchSettings
from ..core.records import BenchRecord, FileRecord, Provenance
from ..core.stats import repetitions_for
from ..runtime.build import Build
from ..runtime.cpus import Quiet, split_cpus, wait_for_quiet
from ..runtime.device import PROGRESS, DeviceSetup, HostSide, attached, bound_rules, host_side
from ..runtime.llama_names import is_host
from ..runtime.llamacpp import Placement, bench_command
from ..runtime.llamacpp_args import UNSUPPORTED, refusal
from ..runtime.locks import device_lock
from ..runtime.outputs import append_jsonl
from ..runtime.process import classify, run, tail
from ..runtime.provenance import build_facts, host_facts, pipeline_revision
from ..runtime.tool_output import bench_records, garbled_records
from .bench_record import measured_record, parse_log
from .repetitions import (
    Arm,
    add_noise,
    add_rows,
    fewest_repetitions,
    imprecise,
    next_batch,
    precise_enough,
    rows_per_arm,
    stop_when_enough,
    test_of,
    warmups,
)
from .sweep_records import measured_before, said_what_is_kept

log = logging.getLogger("moeplace")

TESTS = ("pp", "tg")


@dataclass(frozen=True)
class BenchJob:
    """One configuration to measure: the model, the context (at `depth`, default `settings.depth(ctx)`, so the
    largest test holds exactly `ctx` cells), the placement, and the -ncmoe run it is paired with, if any."""

    model_name: str
    model_path: str
    model_files: list[FileRecord]
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
    manifest: Build
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
    started: str
    facts: Provenance
    side: Path | None  # where each arm's records go once it is done (run_sweep)
    done: dict[int, list[BenchRecord]]  # each finished arm's records, by its n
    quiet: list[Quiet] = field(default_factory=list)  # cpus.wait_for_quiet's findings

    def finish(self, arms: list[Arm]) -> None:
        """Record the arms that are done (each once), to the side file at once: kept whatever happens next."""
        new = [arm for arm in arms if arm.n_cpu_moe not in self.done]
        for arm in new:
            self.done[arm.n_cpu_moe] = _arm_records(self, arm)
        if self.side and new:
            append_jsonl(self.side, [r for arm in new for r in self.done[arm.n_cpu_moe]])


def run_bench(job: BenchJob, rig: Rig) -> list[BenchRecord]:
    """Run one configuration; one record per test, successful or not.

    Repetitions come in one llama-bench process (its own warm-up and one fill of the depth first):
    `settings.repetitions` of them; or with adaptive settings passes of the fewest repetitions wanted
    (repetitions.fewest_repetitions), stopped once the median is precise enough, so a 32K configuration pays its
    depth fill once. With `paired_n_cpu_moe` the configuration is compared with that
    `-ncmoe` run, measured interleaved with it batch by batch (A B A B ...), so drift falls on both alike; the
    records carry both.
    """
    return run_sweep(job, [job.n_cpu_moe], rig)


def run_sweep(job: BenchJob, n_values: list[int], rig: Rig, side: Path | None = None) -> list[BenchRecord]:
    """Run `job` at each of `n_values` (its own n_cpu_moe aside), one record per value and test, successful or not.

    The values share llama-bench processes, so a 32K sweep pays one depth fill (llama-bench restores the KV
    cache it saved for every later load at the same depth) rather than one per value. A value that fails
    to load ends its process (llama-bench stops at the first failed load): it is recorded as failed and the
    values after it get a process of their own; the value below the budget's minimum, expected to run out of
    memory, comes first and costs a load. With adaptive settings the values take turns, pass after pass, until
    all are precise enough or their time is spent (_measure_shared).

    With a `side` file, each value's records reach it as soon as the value is done, and a value it holds measured
    in this very configuration is not run again (sweep_records.py). A second sweep on the device waits for this one.
    """
    settings = rig.settings
    rig.log_path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    facts = host_facts()
    depth = settings.depth(job.ctx) if job.depth is None else job.depth
    tests = TESTS if settings.prompt else ("tg",)  # -p 0: a decode-only probe
    cpus = split_cpus(rig.device.kind == "emulated")
    threads = min(settings.threads, len(cpus.bench))
    kept = measured_before(side, _configuration(job, rig, depth, threads, facts), n_values, tests)
    if kept:
        log.info("kept from %s: n_cpu_moe %s, measured before", side, ", ".join(map(str, sorted(kept))))
    todo = sorted(set(n_values) - set(kept))
    if not todo:
        return [r for n in sorted(kept) for r in kept[n]]
    baseline = Arm(job.paired_n_cpu_moe, None) if job.paired_n_cpu_moe is not None else None
    refused, t0 = refusal(settings.flash_attn, settings.type_v), time.monotonic()  # refused: recorded, never run
    arms = [Arm(n, job.overrides, failure=(UNSUPPORTED, refused, "") if refused else None) for n in todo]
    done: dict[int, list[BenchRecord]] = {}  # each finished arm's records (_Session.finish)
    with (
        said_what_is_kept(side, f"{job.model_name} at {job.ctx:,} tokens", len(set(n_values)), len(kept), done),
        # what a sweep occupies: the emulated device is this host's CPUs whatever its size; a GPU is itself
        device_lock("emulated" if rig.device.kind == "emulated" else rig.device.label, rig.log_path),
        attached(rig.device, rig.manifest, cpus, rig.log_path) as rpc,
        host_side(rig.device, cpus.bench, rig.log_path) as host,
    ):
        session = _Session(job, rig, depth, tests, cpus, threads, arms, baseline, host, t0, started, facts, side, done)
        session.finish([a for a in arms if a.failure])  # refused: nothing to wait for
        if baseline:
            _measure_paired(session, rpc)
        else:
            _measure_shared(session, rpc)
        session.finish(arms)
    if settings.adaptive and not baseline and (short := imprecise(arms, settings.precision)):
        log.warning("%s at %s tokens: %s", job.model_name, f"{job.ctx:,}", short)
    measured = [r for records in [*kept.values(), *done.values()] for r in records]
    return sorted(measured, key=lambda r: r["n_cpu_moe"])  # stable: each value's tests stay in their order


def _warmups(s: _Session, counted: int) -> int:
    """The repetitions a batch of this session runs beyond the `counted` ones, as warm-ups (repetitions.warmups)."""
    return warmups("pp" in s.tests, s.depth, counted)


def _measure_shared(s: _Session, rpc: str | None) -> None:
    """The arms in one process. With adaptive settings it is open-ended, in passes of the fewest repetitions a
    median's interval needs, of each arm in turn (so a slow spell of the host falls on them alike, not on one
    arm), stopped once all are precise enough or their time is spent: one depth fill, and no drift between
    processes within an arm. A failure ends the process: the arms it never reached, or left short of the fewest
    repetitions wanted, go on in the next."""
    settings = s.rig.settings
    todo = [a for a in s.arms if not a.failure]
    while todo:
        if settings.adaptive:
            # A pass counts the fewest repetitions wanted (9) of every test, so the first can be enough, and each
            # pays its loads, contexts and depth restores for as many: llama-bench runs as many more as are
            # warm-ups (decode, which has none, gets them counted too: one -r serves both tests). As many whole
            # passes as max_repetitions holds.
            counted = fewest_repetitions(settings)
            done = min(a.repetitions(s.tests) for a in todo)
            passes = max(1, (settings.max_repetitions - done) // counted)
            each = counted + _warmups(s, counted)
            _batch(s, todo, rpc, passes, stop_when_enough(todo, s.tests, settings, s.t0), each)
        else:
            _batch(s, todo, rpc, 1, None)
        if not any(a.failure for a in todo):
            return
        fewest = fewest_repetitions(settings) if settings.adaptive else 1
        left = [a for a in todo if not a.failure and a.repetitions(s.tests) < fewest]
        s.finish([a for a in todo if all(a is not b for b in left)])
        todo = left


def _measure_paired(s: _Session, rpc: str | None) -> None:
    """Batches of the arm and its baseline, one process each, interleaved until the difference is precise."""
    counted = s.rig.settings.repetitions  # the minimum
    reps, (arm,), base = counted + _warmups(s, counted), s.arms, s.baseline
    assert base is not None  # a paired session's
    while not arm.failure:
        for a in (base, arm):
            _batch(s, [a], rpc, 1, None, reps)
            if a.failure:
                break
        if arm.failure:
            return
        if base.failure:  # nothing to pair with: measure this placement alone
            log.warning("the -ncmoe %d baseline failed (%s); measuring unpaired", base.n_cpu_moe, base.failure[1])
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
    s: _Session,
    arms: list[Arm],
    rpc: str | None,
    passes: int,
    stop_when: Callable[[str], bool] | None,
    reps: int | None = None,
) -> None:
    """One llama-bench process for `arms`: `passes` of their n values one after another, `reps` repetitions
    (default `settings.repetitions`) of each test each time, unless `stop_when` ends it sooner; their rows added
    to each. An arm that failed (or the one the process died in), printed no result for a test, or ran on the CPU
    instead of the device gets its failure."""
    settings, manifest, tests = s.rig.settings, s.rig.manifest, s.tests
    s.quiet.append(wait_for_quiet(settings.quiet_wait_s))
    placement = Placement(bound_rules(arms[0].overrides, rpc), s.job.tensor_split, s.job.n_gpu_layers)
    each = replace(settings, repetitions=reps) if reps else settings
    cmd = bench_command(
        manifest, s.job.model_path, s.depth, [a.n_cpu_moe for a in arms] * passes, each, rpc, placement, s.threads
    )
    result = run(
        cmd,
        timeout_s=settings.timeout_s * len(arms),
        log_path=s.rig.log_path,
        before_exec=s.host.enter,
        on_stderr_line=s.host.on_line,
        stop_when=stop_when,
    )
    rows = bench_records(result.stdout)
    if garbled := garbled_records(result.stdout):
        log.warning(
            "llama-bench printed %d line(s) that start like a record but are not JSON (output of another "
            "process interleaved?); left out of %s",
            garbled,
            s.job.model_name,
        )
    logs = _arm_logs(result.stderr, len(arms), len(tests))
    printed = rows_per_arm(arms, rows)
    add_rows(arms, printed, logs, result.wall_s, len(tests))
    add_noise(arms, printed, rows, s.host.noise.take(), len(tests))
    if rpc and result.ok and f"RPC0[{rpc.split(',')[0]}]" not in result.stderr:
        # llama-bench runs on the CPU when it cannot reach the RPC server: not the device measured
        for a in arms:
            a.failure = ("crash", "the RPC device went away before llama-bench used it", tail(result.stderr))
        return
    if result.ok:
        for a, mine in zip(arms, printed):
            if missing := set(tests) - {test_of(r) for r in mine}:
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
    settings, (arm,), baseline = s.rig.settings, s.arms, s.baseline
    assert baseline is not None  # a paired session's
    if not settings.adaptive or precise_enough(arm.samples, baseline.samples, settings.precision):
        return 0
    n = len(arm.samples["tg"])
    # A difference of two means is as precise as each mean is to precision / sqrt(2).
    pair = (baseline, arm)
    wanted = max(repetitions_for(a.samples[t], settings.precision / math.sqrt(2)) for a in pair for t in s.tests) - n
    fixed_s, repetition_s = (max(c) for c in zip(*(a.costs() for a in pair)))
    left_s = settings.time_budget_s * 2 - (time.monotonic() - s.t0)
    return next_batch(wanted, settings.max_repetitions - n, fixed_s, repetition_s, left_s / 2)


def _arm_records(s: _Session, arm: Arm) -> list[BenchRecord]:
    """One finished arm's records, one per test, with everything that ties them to their inputs."""
    seen = [q["contended"] for q in s.quiet]
    contended = True if any(seen) else None if seen and all(c is None for c in seen) else False
    base = _base(s, arm, contended)
    records = [measured_record(base, test, arm, s.baseline, s.rig.settings, contended) for test in s.tests]
    statuses = ", ".join(f"{r['test']} {r['status']}" for r in records)
    log.info("n_cpu_moe=%d ctx=%d: %s", arm.n_cpu_moe, s.job.ctx, statuses)
    return records


def _configuration(job: BenchJob, rig: Rig, depth: int, threads: int, facts: Provenance) -> BenchRecord:
    """What a record's configuration is, its n_cpu_moe aside: a rerun keeps an earlier record only where all of
    this is the same (the same model file, settings, device, build and host)."""
    settings = rig.settings
    return {
        "model": job.model_name,
        "ctx": job.ctx,
        "variant": job.variant,
        "overrides": job.overrides or "",
        "tensor_split": job.tensor_split or "",
        "n_gpu_layers": job.n_gpu_layers,
        "n_prompt": settings.prompt,
        "n_gen": settings.gen,
        "n_depth": depth,
        "threads": threads,
        "type_k": settings.type_k,
        "type_v": settings.type_v,
        "device_kind": rig.device.kind,
        "device": rig.device.label,
        "device_cap_bytes": rig.device.cap_bytes,
        "device_caps_bytes": list(rig.device.caps),
        "host_slowdown": rig.device.host_slowdown,
        **build_facts(rig.manifest),
        "model_files": job.model_files,
        "host": facts["host"],
        "ubatch": settings.ubatch,
        "flash_attn": settings.flash_attn,
        "precision_target": settings.precision if settings.adaptive else None,
        "paired_n_cpu_moe": job.paired_n_cpu_moe,
    }


def _base(s: _Session, arm: Arm, contended: bool | None) -> BenchRecord:
    """What every record of `arm` carries: the configuration, the device, the build, the host, the revision."""
    parsed = parse_log(arm.stderr)
    return {
        **_configuration(s.job, s.rig, s.depth, s.threads, s.facts),
        "n_cpu_moe": arm.n_cpu_moe,
        "bench_cpus": list(s.cpus.bench),
        "device_cpus": list(s.cpus.device) if s.cpus.device else None,
        "started": s.started,
        **s.facts,
        "others_running": max((q["others_running"] for q in s.quiet if q["others_running"] is not None), default=None),
        "contended": contended,
        **pipeline_revision(s.rig.workdir),
        "kv_contexts": parsed["contexts"],
        "buffers": parsed["buffers"],
        "tensor_buffers": parsed["tensor_buffers"],
        "cpu_tensors": [name for name, buffer in parsed["tensor_buffers"].items() if is_host(buffer)],
        "batches": arm.batches,
    }


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
