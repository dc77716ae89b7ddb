"""Stage 'ceilings': what this host can do at most, measured (seed 004's hardware ceilings).

- RAM read bandwidth with 1..T threads (native/membw.c), the ceiling of every CPU-side read;
- the disk's sequential and random read throughput with O_DIRECT over the model file itself
  (its own size class, never the whole disk), the ceiling once weights are paged from disk;
- decode speed of a dense model (every weight read every token) and of each MoE model, all on
  the CPU: tok/s x bytes read per token = effective GB/s. Compared with the RAM ceiling and the
  1 -> T thread scaling it says whether decode is bandwidth- or compute-bound here;
- on a CUDA card, its links (native/gpulink.c): device memory bandwidth (a device-to-device copy),
  host-to-device copies from pinned and from pageable memory, device-to-host, and the round trip of
  one hop's activations; the speed model's prior (plan/measured_prior.py) takes the card's bandwidth and hop from them;
- on a GPU build, the dense model's decode fully on the device: a lower bound of its bandwidth,
  recorded for reference only (launch overheads keep it far below the card's bandwidth on small models);
- each MoE model's attention on the device: decode and prefill at the benchmarks' depths with every routed
  expert on the host; the extra time per GB of KV cache a token's attention reads (its bytes and its compute)
  is the speed model's prior for the depth term, which two runs at one depth cannot tell; at the first depth the
  probe also runs with no routed expert on the host where that fits, and the two placements' times anchor the
  prior's fixed time and host term (speed_fit.anchored), which then replace the default and the link probe's hop.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.config import BenchSettings, CeilingsSettings
from ..core.errors import MoeplaceError
from ..core.units import GB
from ..model.meta import ModelMeta
from ..model.reads import bytes_per_token
from ..plan.measured_prior import probe_run
from ..plan.speed import TESTS, features
from ..runtime.cpus import split_cpus
from ..runtime.device import LINK_FACTS, LINK_PROBE_BYTES, DeviceSetup, HostSide, attached, host_side, link_facts
from ..runtime.llamacpp import bench_command, require_binary
from ..runtime.native import ram_read_gbps
from ..runtime.process import run_checked
from ..runtime.provenance import host_facts
from ..runtime.tool_output import bench_records

log = logging.getLogger("moeplace")

# Decode is bandwidth-bound when it reaches this share of the RAM ceiling; compute-bound when it
# stays below but more threads speed it up; otherwise per-token fixed costs (graph, thread sync)
# set its pace, as for models so small that a token's weights are read in well under a millisecond.
BANDWIDTH_BOUND_FRACTION = 0.8
SCALING_FLOOR = 1.2
ATTENTION_ROUNDS = 3  # processes per depth when timing attention
_PROBE = f"{LINK_PROBE_BYTES / 2**20:.0f} MiB"
LINK_DETAILS = {
    "device_copy": f"{_PROBE} device-to-device copy counted as read + write: the card's memory bandwidth",
    "host_to_device_pinned": f"{_PROBE} from page-locked host memory",
    "host_to_device_pageable": f"{_PROBE} from ordinary host memory, as llama.cpp's mmapped host weights travel",
    "device_to_host_pinned": f"{_PROBE} to page-locked host memory",
    "hop_round_trip": "a 16 KiB copy to the device and back (native/gpulink.c): one host/device hop of activations",
}
COLUMNS = [
    "ceiling",
    "subject",
    "threads",
    "value",
    "value_sd",
    "unit",
    "effective_gbps",
    "fraction_of_ram_read",
    "thread_scaling",
    "bound",
    "n_cpu_moe",
    "depths",
    "detail",
]


def disk_read_mbps(path: Path, *, block: int, random_order: bool, seconds: float, seed: int = 0) -> float | None:
    """O_DIRECT reads of `path` in `block`-byte blocks for about `seconds`; None where O_DIRECT is refused."""
    size = path.stat().st_size
    blocks = size // block
    if blocks == 0:
        raise MoeplaceError(f"{path} is smaller than one {block}-byte block; cannot time reads of it.")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return None  # e.g. tmpfs, some overlay file systems
    buffer = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    order = random.Random(seed)
    done = 0
    try:
        start = time.monotonic()
        while True:
            for i in range(blocks):
                offset = (order.randrange(blocks) if random_order else i) * block
                try:
                    done += os.preadv(fd, [buffer], offset)
                except OSError:
                    return None  # this file system accepts O_DIRECT opens but not the reads
                if time.monotonic() - start >= seconds:
                    return done / (time.monotonic() - start) / 1e6
    finally:
        os.close(fd)
        buffer.close()


def decode_tok_s(
    manifest: dict[str, Any],
    model: Path,
    threads: int,
    gen: int,
    repetitions: int,
    on_device: bool,
    log_file: Path,
    timeout_s: float = 1800,
) -> float:
    """Decode speed (llama-bench tg) with every layer on the CPU, or all on the device."""
    cmd = [str(require_binary(manifest, "llama-bench")), "-m", str(model), "-p", "0", "-n", str(gen)]
    cmd += ["-r", str(repetitions), "-t", str(threads), "-ngl", "99" if on_device else "0", "-o", "jsonl"]
    out = run_checked(cmd, f"decoding {model.name} with llama-bench", log_file, timeout_s=timeout_s)
    rows = bench_records(out.stdout)
    if not rows:
        raise MoeplaceError(f"llama-bench printed no result decoding {model.name}; see {log_file}.")
    return float(rows[0]["avg_ts"])


def _placement_rows(
    name: str,
    test: str,
    timed_runs: dict[tuple[int, int, int], list[float]],
    at: tuple[int, int],
    threads: int,
    device: str,
) -> list[dict[str, Any]]:
    """The probe's seconds per token at its first depth, with every routed expert on the host and, where that
    fits, with none: the median over rounds, and the spread of each round's own median."""
    depth, n_layer = at
    rows = []
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
    manifest: dict[str, Any],
    name: str,
    model: Path,
    meta: ModelMeta,
    device: DeviceSetup,
    bench: BenchSettings,
    depths: tuple[int, ...],
    log_file: Path,
) -> list[dict[str, Any]]:
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
        samples = _timed_rounds(manifest, name, model, bench, placements, rpc, host, threads, log_file)
    rows = []
    for test, timed_runs in samples.items():
        rows += _placement_rows(name, test, timed_runs, (depths[0], n_layer), threads, device.label)
        rows += _attention_cost(name, test, timed_runs, meta, bench, threads, device.label)
    return rows


def _timed_rounds(
    manifest: dict[str, Any],
    name: str,
    model: Path,
    bench: BenchSettings,
    placements: list[tuple[int, int]],
    rpc: str | None,
    host: HostSide,
    threads: int,
    log_file: Path,
) -> dict[str, dict[tuple[int, int, int], list[float]]]:
    """Per test, the seconds per token of each repetition by (round, depth, n_cpu_moe): the placements take
    turns, ATTENTION_ROUNDS times, one llama-bench process each; one that fails is not tried again."""
    samples: dict[str, dict[tuple[int, int, int], list[float]]] = {test: {} for test in TESTS}
    failed: set[tuple[int, int]] = set()  # e.g. every expert on the device does not fit
    for round_, (depth, n) in itertools.product(range(ATTENTION_ROUNDS), placements):
        if (depth, n) in failed:
            continue
        cmd = bench_command(manifest, str(model), depth, n, bench, rpc, threads=threads)
        try:
            out = run_checked(
                cmd,
                f"timing {name} at depth {depth} with -ncmoe {n}",
                log_file,
                timeout_s=bench.timeout_s,
                before_exec=host.enter,
                on_stderr_line=host.on_line,
            )
        except MoeplaceError as e:  # e.g. this depth does not fit even with every expert on the host
            log.warning("%s", e)
            failed.add((depth, n))
            continue
        for r in bench_records(out.stdout):
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
) -> list[dict[str, Any]]:
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


def bound(fraction: float, scaling: float | None) -> str:
    """The verdict at the most threads; with one thread only, compute and overhead are not told apart."""
    if fraction >= BANDWIDTH_BOUND_FRACTION:
        return "bandwidth"
    if scaling is None:
        return "compute or overhead"
    return "compute" if scaling >= SCALING_FLOOR else "overhead"


def _decode_rows(
    kind: str, name: str, speeds: dict[int, float], per_token: float, ram: dict[int, float], detail: str
) -> list[dict[str, Any]]:
    most = max(speeds)
    scaling = speeds[most] / speeds[1] if most > 1 else None
    verdict = bound(speeds[most] * per_token / GB / ram[most], scaling)
    rows = []
    for t, tok_s in speeds.items():
        effective = tok_s * per_token / GB
        rows.append(
            {
                "ceiling": kind,
                "subject": name,
                "threads": t,
                "value": tok_s,
                "unit": "tok/s",
                "effective_gbps": effective,
                "fraction_of_ram_read": effective / ram[t],
                "thread_scaling": tok_s / speeds[1],
                "bound": verdict,
                "detail": f"{detail}; {per_token / 1e6:.1f} MB read per token",
            }
        )
    return rows


def measure_ceilings(
    *,
    manifest: dict[str, Any],
    dense: tuple[Path, dict[str, Any]],
    models: dict[str, tuple[Path, dict[str, Any]]],
    device: DeviceSetup,
    settings: CeilingsSettings,
    bench: BenchSettings,
    log_file: Path,
) -> pd.DataFrame:
    threads, seconds, gen, repetitions = settings.threads, settings.seconds, settings.gen, settings.repetitions
    ram_bytes, random_block = settings.ram_probe_bytes, settings.random_block_bytes
    thread_counts = list(range(1, threads + 1))
    ram = {t: ram_read_gbps(log_file, t, ram_bytes, seconds) for t in thread_counts}
    log.info("RAM read GB/s by threads: %s", ram)
    rows: list[dict[str, Any]] = [
        {
            "ceiling": "ram_read",
            "subject": "host RAM",
            "threads": t,
            "value": gbps,
            "unit": "GB/s",
            "detail": f"membw: {t} thread(s) summing {ram_bytes / 2**20:.0f} MiB, best of 3 over {seconds:g} s",
        }
        for t, gbps in ram.items()
    ]
    disk_file = max((path for path, _ in models.values()), key=lambda p: p.stat().st_size, default=dense[0])
    for name, block, random_order in (("disk_seq_read", 2**20, False), ("disk_random_read", random_block, True)):
        mbps = disk_read_mbps(disk_file, block=block, random_order=random_order, seconds=seconds)
        order = "random" if random_order else "sequential"
        rows.append(
            {
                "ceiling": name,
                "subject": str(disk_file),
                "value": mbps,
                "unit": "MB/s",
                "detail": f"O_DIRECT {order} {block // 1024} KiB reads of the model file "
                f"({disk_file.stat().st_size / 1e6:.0f} MB)"
                + ("" if mbps is not None else "; this file system refuses O_DIRECT, not measured"),
            }
        )
    dense_path, dense_meta = dense
    per_token = bytes_per_token(dense_meta)
    speeds = {t: decode_tok_s(manifest, dense_path, t, gen, repetitions, False, log_file) for t in thread_counts}
    rows += _decode_rows("dense_decode", dense_meta.name, speeds, per_token, ram, "dense model, all on the CPU")
    for name, (path, meta) in models.items():
        speeds = {t: decode_tok_s(manifest, path, t, gen, repetitions, False, log_file) for t in thread_counts}
        rows += _decode_rows("moe_decode", name, speeds, bytes_per_token(meta), ram, "MoE model, all on the CPU")
        rows += attention_rows(manifest, name, path, meta, device, bench, settings.attention_depths, log_file)
    if device.kind == "gpu" and manifest.get("backend") == "cuda":
        facts = link_facts(log_file)
        log.info("GPU links: %s", facts)
        rows += [
            {
                "ceiling": name,
                "subject": device.label,
                "value": facts[key],
                "unit": unit,
                "detail": LINK_DETAILS[name],
            }
            for key, (name, unit) in LINK_FACTS.items()
        ]
    if device.kind == "gpu":
        tok_s = decode_tok_s(manifest, dense_path, threads, gen, repetitions, True, log_file)
        rows.append(
            {
                "ceiling": "device_decode",
                "subject": device.label,
                "threads": threads,
                "value": tok_s,
                "unit": "tok/s",
                "effective_gbps": tok_s * per_token / GB,
                "detail": "dense model all on the device: its effective GB/s is a lower bound of the card's bandwidth",
            }
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["host"] = host_facts()["host"]
    return table
