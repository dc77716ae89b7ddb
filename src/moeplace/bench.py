"""Stage 'bench': one real llama-bench run per (model, context, n_cpu_moe), recorded whatever happens.

Each configuration runs in its own llama-bench process (a failed load aborts the rest of a
llama-bench sweep). A run that cannot allocate, crashes or hangs becomes records with status
oom/crash/timeout and the stderr tail, never a lost sweep. The device is a GPU, or the emulated
one (runtime/device.py).
"""

from __future__ import annotations

import json
import logging
import re
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .config import BenchSettings
from .kvcache import cache_args
from .runtime.device import DeviceSetup, attached
from .runtime.llamacpp import require_binary
from .runtime.process import classify, run, tail
from .runtime.provenance import build_facts, host_facts, pipeline_revision

log = logging.getLogger("moeplace")

TESTS = ("pp", "tg")
_KV_BUFFER = re.compile(r"KV buffer size =\s+([\d.]+) MiB")
_N_CTX = re.compile(r"llama_context: n_ctx\s+=\s+(\d+)")
_OVERRIDE = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


def bench_command(
    manifest: dict[str, Any],
    model: str,
    depth: int,
    n_cpu_moe: int,
    s: BenchSettings,
    rpc: str | None,
    overrides: str | None = None,
) -> list[str]:
    cmd = [str(require_binary(manifest, "llama-bench"))]
    if rpc:
        cmd += ["--rpc", rpc]  # before -ot, so RPC buffer types are known when -ot is parsed
    cmd += [
        "-m",
        model,
        "-d",
        str(depth),
        "-p",
        str(s.prompt),
        "-n",
        str(s.gen),
        "-ngl",
        "99",
        "-ncmoe",
        str(n_cpu_moe),
        "-t",
        str(s.threads),
        "-r",
        str(s.repetitions),
        *cache_args(s.type_k, s.type_v),
        "-o",
        "jsonl",
        "-v",
    ]
    if overrides:
        cmd += ["-ot", overrides]
    return cmd


def parse_log(stderr: str) -> dict[str, Any]:
    """llama.cpp's own accounting from a -v log: KV bytes per context created, and placements."""
    contexts: list[dict[str, float]] = []
    for line in stderr.splitlines():
        if m := _N_CTX.search(line):
            contexts.append({"n_ctx": int(m[1]), "kv_mib": 0.0})
        elif (m := _KV_BUFFER.search(line)) and contexts:
            contexts[-1]["kv_mib"] += float(m[1])
    overridden = sorted({m[1] for m in _OVERRIDE.finditer(stderr)})
    return {"contexts": contexts, "overridden_tensors": overridden}


def run_bench(
    *,
    model_name: str,
    model_path: str,
    model_files: list[dict[str, Any]],
    ctx: int,
    n_cpu_moe: int,
    settings: BenchSettings,
    device: DeviceSetup,
    manifest: dict[str, Any],
    log_path: Path,
    workdir: Path,
    variant: str = "ncmoe",
    overrides: str | None = None,
    depth: int | None = None,
) -> list[dict[str, Any]]:
    """Run one configuration at context depth `depth` (default: ctx); one record per test, successful or not."""
    depth = ctx if depth is None else depth
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    facts = host_facts()
    with attached(device, manifest, settings.threads, log_path) as rpc:
        cmd = bench_command(manifest, model_path, depth, n_cpu_moe, settings, rpc, overrides)
        result = run(cmd, timeout_s=settings.timeout_s, log_path=log_path)
    parsed = parse_log(result.stderr)
    results = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results["pp" if r["n_gen"] == 0 else "tg"] = r
    status, reason = classify(result)
    base = {
        "model": model_name,
        "ctx": ctx,
        "n_cpu_moe": n_cpu_moe,
        "variant": variant,
        "overrides": overrides or "",
        "n_prompt": settings.prompt,
        "n_gen": settings.gen,
        "n_depth": depth,
        "repetitions": settings.repetitions,
        "threads": settings.threads,
        "type_k": settings.type_k,
        "type_v": settings.type_v,
        "device_kind": device.kind,
        "device": device.label,
        "device_cap_bytes": device.cap_bytes,
        **build_facts(manifest),
        "model_files": model_files,
        "started": started,
        **facts,
        **pipeline_revision(workdir),
        "kv_contexts": parsed["contexts"],
        "cpu_tensors": parsed["overridden_tensors"],
    }
    records = []
    for test in TESTS if settings.prompt else ("tg",):  # -p 0: a decode-only probe
        r = results.get(test)
        if r is not None:
            samples = r.get("samples_ts") or []
            mean = float(r["avg_ts"])
            cv = statistics.stdev(samples) / mean if len(samples) > 1 and mean else 0.0
            records.append(
                {
                    **base,
                    "test": test,
                    "status": "ok",
                    "avg_ts": mean,
                    "stddev_ts": float(r["stddev_ts"]),
                    "samples_ts": samples,
                    "cv": cv,
                    "noisy": cv > settings.noisy_cv,
                    "backends": r.get("backends"),
                    "gpu_info": r.get("gpu_info"),
                    "error": "",
                }
            )
        else:
            records.append(
                {
                    **base,
                    "test": test,
                    "status": status if status != "ok" else "error",
                    "avg_ts": None,
                    "stddev_ts": None,
                    "samples_ts": [],
                    "cv": None,
                    "noisy": None,
                    "backends": None,
                    "gpu_info": None,
                    "error": f"{reason}: {tail(result.stderr)}",
                }
            )
    log.info("n_cpu_moe=%d ctx=%d: %s", n_cpu_moe, ctx, ", ".join(f"{r['test']} {r['status']}" for r in records))
    return records


def auto_sweep(n_min: int | None, n_layer: int, points_above: int = 6) -> list[int]:
    """Two values below the budget's minimum (expected to run out of memory), then up to all layers."""
    if n_min is None:  # the context does not fit at all: one run records how it fails
        return [n_layer]
    below = [n for n in (n_min - 2, n_min - 1) if n >= 0]
    span = n_layer - n_min
    above = sorted({n_min + round(i * span / (points_above - 1)) for i in range(points_above)}) if span else [n_min]
    return below + above
