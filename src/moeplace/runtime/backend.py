"""Which llama.cpp backend this machine builds and uses: CUDA, HIP or Vulkan where a GPU and its toolkit are
present, else the CPU (measured through the emulated device). One line says which and why; a GPU without its
toolkit says what to install.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MoeplaceError
from .process import run

BACKENDS = ("auto", "cpu", "cuda", "hip", "vulkan")
ROCM = os.environ.get("ROCM_PATH", "/opt/rocm")
NVIDIA_QUERY = ["--query-gpu=name,memory.total,memory.free,compute_cap", "--format=csv,noheader,nounits"]
INSTALL = {
    "cuda": "the CUDA toolkit for nvcc (Debian: apt-get install nvidia-cuda-toolkit; or NVIDIA's cuda-toolkit)",
    "hip": "ROCm's HIP compiler hipcc (Debian: apt-get install hipcc; or AMD's rocm-hip-sdk)",
    "vulkan": "the Vulkan SDK's glslc and headers (Debian: apt-get install glslc libvulkan-dev)",
}


@dataclass
class Backend:
    name: str  # cpu, cuda, hip or vulkan
    reason: str
    cmake_options: list[str] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)  # name, total_bytes, free_bytes
    toolkit: str | None = None
    install: str | None = None  # what a present GPU lacks to be used

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tool(name: str, *extra: str) -> str | None:
    """A program on PATH, or at one of the usual install places."""
    found = shutil.which(name)
    return found or next((p for p in extra if Path(p).is_file()), None)


def _lines(cmd: list[str]) -> list[str]:
    result = run(cmd, timeout_s=30)
    return [line.strip() for line in result.stdout.splitlines() if line.strip()] if result.ok else []


def nvidia_devices() -> list[dict[str, Any]]:
    """NVIDIA GPUs as nvidia-smi reports them (name, total and free bytes, compute capability)."""
    smi = _tool("nvidia-smi")
    devices = []
    for line in _lines([smi, *NVIDIA_QUERY]) if smi else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
            devices.append({"name": parts[0], "total_bytes": int(parts[1]) * 2**20, "free_bytes": int(parts[2]) * 2**20,
                            "compute_cap": parts[3]})  # fmt: skip
    return devices


def amd_devices() -> list[dict[str, Any]]:
    """AMD GPU agents rocminfo lists (their gfx target; memory is not reported there)."""
    tool = _tool("rocminfo", f"{ROCM}/bin/rocminfo")
    names = [line.split(":", 1)[1].strip() for line in (_lines([tool]) if tool else []) if line.startswith("Name:")]
    return [{"name": n, "total_bytes": None, "free_bytes": None} for n in dict.fromkeys(names) if n.startswith("gfx")]


def vulkan_devices() -> list[dict[str, Any]]:
    """Vulkan GPUs (software rasterisers such as llvmpipe left out)."""
    tool = _tool("vulkaninfo")
    lines = _lines([tool, "--summary"]) if tool else []
    names = [line.split("=", 1)[1].strip() for line in lines if line.startswith("deviceName")]
    return [{"name": n, "total_bytes": None, "free_bytes": None} for n in names if "llvmpipe" not in n.lower()]


def _candidates() -> list[tuple[str, list[dict[str, Any]], str | None, list[str]]]:
    """(backend, devices, toolkit, cmake options) for each GPU kind this machine shows."""
    out = []
    if nvidia := nvidia_devices():
        archs = sorted({d["compute_cap"].replace(".", "") for d in nvidia})
        nvcc = _tool("nvcc", f"{os.environ.get('CUDA_HOME', '/usr/local/cuda')}/bin/nvcc")
        out.append(("cuda", nvidia, nvcc, ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}"]))
    if amd := amd_devices():
        targets = ";".join(d["name"] for d in amd)
        hipcc = _tool("hipcc", f"{ROCM}/bin/hipcc")
        out.append(("hip", amd, hipcc, ["-DGGML_HIP=ON", f"-DAMDGPU_TARGETS={targets}"]))
    if vulkan := vulkan_devices():
        out.append(("vulkan", vulkan, _tool("glslc"), ["-DGGML_VULKAN=ON"]))
    return out


def detect(requested: str = "auto") -> Backend:
    """The backend to build: `requested`, or with auto the first GPU kind whose toolkit is present."""
    if requested not in BACKENDS:
        raise MoeplaceError(f"llamacpp.backend: {requested!r} is not one of {', '.join(BACKENDS)}.")
    if requested == "cpu":
        return Backend("cpu", "llamacpp.backend is cpu: the CPU build, measured through the emulated device")
    candidates = _candidates()
    for name, devices, toolkit, options in candidates:
        if requested not in ("auto", name):
            continue
        what = ", ".join(d["name"] for d in devices)
        if toolkit:
            return Backend(name, f"{what} found, and {Path(toolkit).name} to build for it", options, devices, toolkit)
        if requested == name:
            raise MoeplaceError(f"llamacpp.backend is {name}, but {Path(toolkit or name).name} is missing: install "
                                f"{INSTALL[name]}.")  # fmt: skip
        return Backend("cpu", f"{what} found, but no {name.upper()} compiler to build for it: the CPU build for now",
                       devices=devices, install=INSTALL[name])  # fmt: skip
    if requested != "auto":
        raise MoeplaceError(f"llamacpp.backend is {requested}, but this machine shows no such GPU.")
    return Backend("cpu", "no GPU found (nvidia-smi, rocminfo, vulkaninfo): the CPU build and the emulated device")
