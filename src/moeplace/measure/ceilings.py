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
  prior's fixed time and host term (speed_fit.anchored), which then replace the default and the link probe's hop
  (measure/attention.py).
"""

from __future__ import annotations

import logging
import mmap
import os
import random
import time
from pathlib import Path

import pandas as pd

from ..core.config import BenchSettings, CeilingsSettings
from ..core.errors import MoeplaceError
from ..core.records import Row
from ..core.units import GB
from ..model.meta import ModelMeta
from ..model.reads import bytes_per_token
from ..runtime.build import Build
from ..runtime.device import LINK_FACTS, LINK_PROBE_BYTES, DeviceSetup, link_facts
from ..runtime.llamacpp import require_binary
from ..runtime.native import ram_read_gbps
from ..runtime.process import run_checked
from ..runtime.provenance import host_facts
from ..runtime.tool_output import bench_records
from .attention import attention_rows

log = logging.getLogger("moeplace")

# Decode is bandwidth-bound when it reaches this share of the RAM ceiling; compute-bound when it
# stays below but more threads speed it up; otherwise per-token fixed costs (graph, thread sync)
# set its pace, as for models so small that a token's weights are read in well under a millisecond.
BANDWIDTH_BOUND_FRACTION = 0.8
SCALING_FLOOR = 1.2
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
    manifest: Build,
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


def bound(fraction: float, scaling: float | None) -> str:
    """The verdict at the most threads; with one thread only, compute and overhead are not told apart."""
    if fraction >= BANDWIDTH_BOUND_FRACTION:
        return "bandwidth"
    if scaling is None:
        return "compute or overhead"
    return "compute" if scaling >= SCALING_FLOOR else "overhead"


def _decode_rows(
    kind: str, name: str, speeds: dict[int, float], per_token: float, ram: dict[int, float], detail: str
) -> list[Row]:
    most = max(speeds)
    scaling = speeds[most] / speeds[1] if most > 1 else None
    verdict = bound(speeds[most] * per_token / GB / ram[most], scaling)
    rows: list[Row] = []
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
    manifest: Build,
    dense: tuple[Path, ModelMeta],
    models: dict[str, tuple[Path, ModelMeta]],
    device: DeviceSetup,
    settings: CeilingsSettings,
    bench: BenchSettings,
    log_file: Path,
) -> pd.DataFrame:
    """The ceilings above, one row each (by thread count where threads matter), each row with this host's name."""
    thread_counts = list(range(1, settings.threads + 1))
    ram = {t: ram_read_gbps(log_file, t, settings.ram_probe_bytes, settings.seconds) for t in thread_counts}
    log.info("RAM read GB/s by threads: %s", ram)
    disk_file = max((path for path, _ in models.values()), key=lambda p: p.stat().st_size, default=dense[0])
    rows = _ram_rows(ram, settings) + _disk_rows(disk_file, settings)

    def speeds(path: Path) -> dict[int, float]:
        gen, repetitions = settings.gen, settings.repetitions
        return {t: decode_tok_s(manifest, path, t, gen, repetitions, False, log_file) for t in thread_counts}

    dense_path, dense_meta = dense
    per_token = bytes_per_token(dense_meta)
    rows += _decode_rows(
        "dense_decode", dense_meta.name, speeds(dense_path), per_token, ram, "dense model, all on the CPU"
    )
    for name, (path, meta) in models.items():
        rows += _decode_rows("moe_decode", name, speeds(path), bytes_per_token(meta), ram, "MoE model, all on the CPU")
        rows += attention_rows(manifest, name, path, meta, device, bench, settings.attention_depths, log_file)
    if device.kind == "gpu" and manifest.backend == "cuda":
        rows += _link_rows(device, log_file)
    if device.kind == "gpu":
        rows.append(_device_decode_row(manifest, dense, device, settings, log_file))
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["host"] = host_facts()["host"]
    return table


def _ram_rows(ram: dict[int, float], settings: CeilingsSettings) -> list[Row]:
    """The RAM read ceiling's rows, one per thread count."""
    return [
        {
            "ceiling": "ram_read",
            "subject": "host RAM",
            "threads": t,
            "value": gbps,
            "unit": "GB/s",
            "detail": f"membw: {t} thread(s) summing {settings.ram_probe_bytes / 2**20:.0f} MiB, best of 3 over "
            f"{settings.seconds:g} s",
        }
        for t, gbps in ram.items()
    ]


def _disk_rows(disk_file: Path, settings: CeilingsSettings) -> list[Row]:
    """The disk's sequential and random read throughput over `disk_file` (the largest model), O_DIRECT."""
    rows = []
    for name, block, random_order in (
        ("disk_seq_read", 2**20, False),
        ("disk_random_read", settings.random_block_bytes, True),
    ):
        mbps = disk_read_mbps(disk_file, block=block, random_order=random_order, seconds=settings.seconds)
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
    return rows


def _link_rows(device: DeviceSetup, log_file: Path) -> list[Row]:
    """A CUDA card's links (native/gpulink.c), one row each."""
    facts = link_facts(log_file)
    log.info("GPU links: %s", facts)
    return [
        {"ceiling": name, "subject": device.label, "value": facts[key], "unit": unit, "detail": LINK_DETAILS[name]}
        for key, (name, unit) in LINK_FACTS.items()
    ]


def _device_decode_row(
    manifest: Build,
    dense: tuple[Path, ModelMeta],
    device: DeviceSetup,
    settings: CeilingsSettings,
    log_file: Path,
) -> Row:
    """The dense model's decode fully on the device: a lower bound of the card's bandwidth, for reference."""
    dense_path, dense_meta = dense
    tok_s = decode_tok_s(manifest, dense_path, settings.threads, settings.gen, settings.repetitions, True, log_file)
    return {
        "ceiling": "device_decode",
        "subject": device.label,
        "threads": settings.threads,
        "value": tok_s,
        "unit": "tok/s",
        "effective_gbps": tok_s * bytes_per_token(dense_meta) / GB,
        "detail": "dense model all on the device: its effective GB/s is a lower bound of the card's bandwidth",
    }
