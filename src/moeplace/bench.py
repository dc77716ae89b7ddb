"""Stage 'bench': one real llama-bench run per (model, context, n_cpu_moe), recorded whatever happens.

Each configuration runs in its own llama-bench process (a failed load aborts the rest of a
llama-bench sweep). A run that cannot allocate, crashes or hangs becomes records with status
oom/crash/timeout and the stderr tail, never a lost sweep. On a machine without a GPU the
"device" is emulated: a ggml RPC server on 127.0.0.1, CPU-backed, whose memory is capped by
the devcap shim, so placement and out-of-memory are real while speed is a CPU's.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import MoeplaceError
from .llamacpp import require_binary

log = logging.getLogger("moeplace")

TESTS = ("pp", "tg")
_OOM = re.compile(
    r"out of device memory|failed to allocate|unable to allocate|cudaMalloc failed|out of memory"
    r"|ErrorOutOfDeviceMemory|hipMalloc failed",
    re.IGNORECASE,
)
_KV_BUFFER = re.compile(r"KV buffer size =\s+([\d.]+) MiB")
_N_CTX = re.compile(r"llama_context: n_ctx\s+=\s+(\d+)")
_OVERRIDE = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


@dataclass(frozen=True)
class BenchSettings:
    prompt: int
    gen: int
    repetitions: int
    threads: int
    timeout_s: float
    type_k: str = "f16"
    type_v: str = "f16"
    noisy_cv: float = 0.05


@dataclass(frozen=True)
class DeviceSetup:
    """Where '-ngl 99' puts the model: a real GPU, or the emulated capped RPC device."""

    kind: str  # "gpu" or "emulated"
    label: str
    cap_bytes: int


def device_setup(kind: str, name: str, vram_bytes: int, manifest: dict[str, Any]) -> DeviceSetup:
    if kind == "auto":
        kind = "gpu" if manifest.get("gpu_devices") else "emulated"
    if kind == "gpu":
        if not manifest.get("gpu_devices"):
            raise MoeplaceError(
                "device.kind is gpu, but this llama.cpp build sees no GPU; set llamacpp.bin_dir to a "
                "CUDA/HIP/Vulkan build, or device.kind to emulated."
            )
        return DeviceSetup("gpu", name or manifest["gpu_devices"][0], vram_bytes)
    label = f"emulated device: CPU behind RPC with a {vram_bytes / 2**20:.0f} MiB cap, not a GPU's speed"
    return DeviceSetup("emulated", label, vram_bytes)


def die_with_parent() -> None:
    """In a child: its own process group (so a timeout can kill it whole), and SIGKILL when the job dies."""
    os.setsid()
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def rpc_device(manifest: dict[str, Any], cap_bytes: int, threads: int, log_path: Path) -> Iterator[str]:
    """A capped RPC server on 127.0.0.1 for the duration of one job, always stopped afterwards."""
    server = require_binary(manifest, "ggml-rpc-server")
    port = _free_port()
    env = {**os.environ, "LD_PRELOAD": manifest["devcap"], "MOEPLACE_DEVICE_CAP_BYTES": str(cap_bytes)}
    with log_path.open("a") as out:
        proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise MoeplaceError(f"the RPC server exited at start (code {proc.returncode}); see {log_path}.")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise MoeplaceError(f"the RPC server did not listen on 127.0.0.1:{port} within 30 s; see {log_path}.")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
        "-ctk",
        s.type_k,
        "-ctv",
        s.type_v,
        "-o",
        "jsonl",
        "-v",
    ]
    if s.type_v != "f16":
        cmd += ["-fa", "on"]  # a quantized V cache needs flash attention
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


def classify_failure(returncode: int | None, stderr: str, timed_out: bool) -> tuple[str, str]:
    if timed_out:
        return "timeout", "no result before the per-job timeout"
    if returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name
        return "crash", f"killed by {sig}"
    if _OOM.search(stderr):
        return "oom", "allocation failed on the device"
    if "Remote RPC server crashed" in stderr or "Failed to connect" in stderr:
        return "crash", "the RPC device went away"
    return "error", f"llama-bench exited with code {returncode}"


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def host_facts() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    facts = {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]}
    if shutil.which("nvidia-smi"):  # other processes on the GPU bias a measurement: record them
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        facts["gpu_processes"] = out.stdout.strip().splitlines()
    return facts


def pipeline_revision(workdir: Path) -> dict[str, Any]:
    """The pipeline's git commit and whether the tree had uncommitted changes (recorded, never a rerun trigger)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=workdir, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    return {
        "pipeline_commit": commit or "unknown",
        "pipeline_dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None,
    }


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
    timed_out = False
    with (
        rpc_device(manifest, device.cap_bytes, settings.threads, log_path)
        if device.kind == "emulated"
        else nullcontext() as rpc
    ):
        cmd = bench_command(manifest, model_path, depth, n_cpu_moe, settings, rpc, overrides)
        log.info("$ %s", " ".join(cmd))
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent
        )
        try:
            stdout, stderr = proc.communicate(timeout=settings.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
            stdout, stderr = proc.communicate()
    with log_path.open("a") as out:
        out.write(stderr)
    parsed = parse_log(stderr)
    results = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results["pp" if r["n_gen"] == 0 else "tg"] = r
    status, reason = (
        ("ok", "") if proc.returncode == 0 and not timed_out else classify_failure(proc.returncode, stderr, timed_out)
    )
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
        "llamacpp_version": manifest.get("version"),
        "llamacpp_commit": manifest.get("build_commit"),
        "llamacpp_build": manifest.get("build_number"),
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
                    "error": f"{reason}: {_tail(stderr)}",
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
