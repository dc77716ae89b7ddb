"""What every measured row carries: host, CPU, GPU processes, the llama.cpp build, the pipeline's commit."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

from ..core.records import Provenance
from .build import Build
from .process import run


def host_facts() -> Provenance:
    cpu = platform.processor()
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    facts: Provenance = {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }
    if shutil.which("nvidia-smi"):  # other processes on the GPU bias a measurement: record them
        query = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
        facts["gpu_processes"] = run(query, timeout_s=30).stdout.strip().splitlines()
        cards = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.free", "--format=csv,noheader"]
        facts["gpus"] = run(cards, timeout_s=30).stdout.strip().splitlines()  # name, driver, total and free memory
    return facts


def build_facts(manifest: Build) -> Provenance:
    return {
        "llamacpp_version": manifest.version,
        "llamacpp_commit": manifest.build_commit,
        "llamacpp_build": manifest.build_number,
    }


def pipeline_revision(workdir: Path) -> Provenance:
    """The pipeline's git commit and whether the tree had uncommitted changes (recorded, never a rerun trigger)."""

    def git(*args: str) -> str:
        out = run(["git", "-C", str(workdir), *args], timeout_s=60)
        return out.stdout.strip() if out.ok else ""

    commit = git("rev-parse", "HEAD")
    return {
        "pipeline_commit": commit or "unknown",
        "pipeline_dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None,
    }
