"""The ceilings stage's attention probe: what one token's attention costs on the device, per GB of KV cache.

Each MoE model runs llama-bench on the device at the benchmarks' depths with every routed expert on the host,
the depths taking turns over several processes; the slope of seconds per token over the KV cache's GB is the
speed model's prior for the depth term. At the first depth the probe also runs with no routed expert on the
host where that fits; the two placements' times anchor the prior's fixed time and host term
(speed_fit.anchored).
"""

from __future__ import annotations

import itertools
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.config import BenchSettings
from ..core.errors import MoeplaceError
from ..core.records import LlamaBenchRow, Row
from ..model.meta import ModelMeta
from ..plan.measured_prior import probe_run
from ..plan.speed import TESTS, features
from ..runtime.build import Build
from ..runtime.cpus import split_cpus
from ..runtime.device import DeviceSetup, HostSide, attached, host_side
from ..runtime.llamacpp import bench_command
from ..runtime.process import run_checked
from ..runtime.tool_output import bench_records

log = logging.getLogger("moeplace")

ATTENTION_ROUNDS = 3  # processes per depth when timing attention


def _placement_rows(
    name: str,
    test: str,
    timed_runs: dict[tuple[int, int, int], list[float]],
    at: tuple[int, int],
    threads: int,
    device: str,
) -> list[Row]:
    """The probe's seconds per token at its first depth, with every routed expert on the host and, where that
    fits, with none: the median over rounds, and the spread of each round's own median."""
    depth, n_layer = at
    rows: list[Row] = []
    for n in (0, n_layer):
        per_round = [s for (_, d, k), s in sorted(timed_runs.items()) if (d, k) == (depth, n) and s]
        if not per_round:
            continue
        rounds = [statistics.median(s) for s in per_round]
        where = "every routed expert on the host" if n else "every routed expert on the device"
        rows.append(
            {
                "ceiling": f"time_{test}",
                "subject": name,
                "threads": threads,
                "value": statistics.median(x for s in per_round for x in s),
                "value_sd": statistics.stdev(rounds) if len(rounds) >= 2 else None,
                "unit": "s/token",
                "n_cpu_moe": n,
                "depths": str(depth),
                "detail": f"llama-bench {test} on {device} at this depth, {where}, {len(rounds)} processes, median; "
                "the prior's fixed time and host cost come from these (speed_fit.anchored); value_sd: the spread of "
                "each round's median",
            }
        )
    return rows


def attention_rows(
    manifest: Build,
    name: str,
    model: Path,
    meta: ModelMeta,
    device: DeviceSetup,
    bench: BenchSettings,
    depths: tuple[int, ...],
    log_file: Path,
) -> list[Row]:
    """Seconds per GB of KV cache one token's attention reads (its bytes and its compute), decode and prefill:
    llama-bench as the benchmarks run it (their prompt, generated tokens, ubatch, KV types, flash attention,
    CPU split) on the device at each of `depths`, every routed expert on the host so the cache fits; the slope
    of time per token over those depths. At the benchmarks' own depths, not from 0: the first cached tokens
    cost more per token, a step the fixed time of a fit takes up. One depth alone gets an eighth of it too.
    The depths take turns, one process each, ATTENTION_ROUNDS times: a shared host's speed drifts by tens of
    percent between processes minutes apart, and taking turns puts the drift on every depth alike. The spread
    of each round's own slope (value_sd) says how far one process's depth cost lands from another's: what a
    prediction carrying this cost to another depth inherits.
    At the first depth a run with every routed expert on the device takes its turn too, where it fits: with the
    host placement's time there (rows time_tg, time_pp) it gives the prior its fixed time and the cost of
    placing experts on the host (speed_fit.anchored)."""
    n_layer = meta.n_layer
    depths = tuple(sorted(set(depths) | ({depths[0] // 8} if len(depths) == 1 else set())))
    if len(depths) < 2 or not any(layer.has_kv for layer in meta.layers):
        return []
    cpus = split_cpus(device.kind == "emulated")
    threads = min(bench.threads, len(cpus.bench))
    placements = [(depth, n_layer) for depth in depths] + [(depths[0], 0)]
    with attached(device, manifest, cpus, log_file) as rpc, host_side(device, cpus.bench, log_file) as host:
        runs = _DeviceBench(manifest, name, model, bench, rpc, host, threads, log_file)
        samples = _timed_rounds(runs, placements)
    rows = []
    for test, timed_runs in samples.items():
        rows += _placement_rows(name, test, timed_runs, (depths[0], n_layer), threads, device.label)
        rows += _attention_cost(name, test, timed_runs, meta, bench, threads, device.label)
    return rows


@dataclass(frozen=True)
class _DeviceBench:
    """One model's llama-bench processes on the attached device (`rpc`), as the benchmarks run them: their
    settings, `threads` on the host side `host` watches, each logged to `log_file`."""

    manifest: Build
    name: str
    model: Path
    bench: BenchSettings
    rpc: str | None
    host: HostSide
    threads: int
    log_file: Path

    def records(self, depth: int, n: int) -> list[LlamaBenchRow]:
        """llama-bench's records at `depth` with `n` layers' routed experts on the host; MoeplaceError where it
        fails."""
        cmd = bench_command(self.manifest, str(self.model), depth, n, self.bench, self.rpc, threads=self.threads)
        out = run_checked(
            cmd,
            f"timing {self.name} at depth {depth} with -ncmoe {n}",
            self.log_file,
            timeout_s=self.bench.timeout_s,
            before_exec=self.host.enter,
            on_stderr_line=self.host.on_line,
        )
        return bench_records(out.stdout)


def _timed_rounds(
    runs: _DeviceBench, placements: list[tuple[int, int]]
) -> dict[str, dict[tuple[int, int, int], list[float]]]:
    """Per test, the seconds per token of each repetition by (round, depth, n_cpu_moe): the placements take
    turns, ATTENTION_ROUNDS times, one llama-bench process each; one that fails is not tried again."""
    samples: dict[str, dict[tuple[int, int, int], list[float]]] = {test: {} for test in TESTS}
    failed: set[tuple[int, int]] = set()  # e.g. every expert on the device does not fit
    for round_, (depth, n) in itertools.product(range(ATTENTION_ROUNDS), placements):
        if (depth, n) in failed:
            continue
        try:
            records = runs.records(depth, n)
        except MoeplaceError as e:  # e.g. this depth does not fit even with every expert on the host
            log.warning("%s", e)
            failed.add((depth, n))
            continue
        for r in records:
            test = "tg" if r["n_gen"] else "pp"
            times = samples[test].setdefault((round_, depth, n), [])
            times.extend(1 / v for v in r.get("samples_ts") or [] if v)
    return samples


def _attention_cost(
    name: str,
    test: str,
    timed_runs: dict[tuple[int, int, int], list[float]],
    meta: ModelMeta,
    bench: BenchSettings,
    threads: int,
    label: str,
) -> list[Row]:
    """The attention row of one test: the slope of median seconds per token over the KV cache's GB, with every
    expert on the host, and the spread of each round's own slope (none where fewer than two depths ran)."""
    n_layer = meta.n_layer
    by_run = {(round_, depth): s for (round_, depth, n), s in timed_runs.items() if n == n_layer}
    timed = sorted({d for _, d in by_run})
    if len(timed) < 2:
        return []
    kv = {d: features(meta, probe_run(bench, n_layer, d, test))["kv_gb"] for d in timed}

    def slope(seconds: dict[int, float]) -> float:
        return float(np.polyfit([kv[d] for d in seconds], list(seconds.values()), 1)[0])

    seconds = {d: statistics.median(x for (_, dd), s in by_run.items() if dd == d for x in s) for d in timed}
    rounds = [
        {d: statistics.median(by_run[r, d]) for d in timed}
        for r in range(ATTENTION_ROUNDS)
        if all((r, d) in by_run for d in timed)
    ]
    cost, per_round = slope(seconds), [slope(r) for r in rounds]
    log.info(
        "%s %s on the device, median ms per token by depth: %s; each round's s/GB: %s",
        name,
        test,
        {d: round(t * 1e3, 3) for d, t in seconds.items()},
        [round(x, 4) for x in per_round],
    )
    return [
        {
            "ceiling": f"attention_{test}",
            "subject": name,
            "threads": threads,
            "value": cost,
            "value_sd": statistics.stdev(per_round) if len(per_round) >= 2 else None,
            "unit": "s/GB",
            "effective_gbps": 1 / cost if cost > 0 else None,
            "n_cpu_moe": n_layer,
            "depths": " ".join(map(str, seconds)),
            "detail": f"llama-bench {test} on {label} at these depths, every routed expert on the host, "
            f"{ATTENTION_ROUNDS} processes each, medians: the extra seconds per GB of KV cache a token's "
            "attention reads, its bytes and its compute; value_sd: the spread of each round's own slope",
        }
    ]
