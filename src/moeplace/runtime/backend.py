"""Which llama.cpp backend this machine builds and uses: CUDA, HIP or Vulkan where a GPU and its toolkit are
present, else the CPU (measured through the emulated device). One line says which and why; a GPU without its
toolkit says what to install.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from ..core.backends import BUILDS, built_as
from ..core.errors import MoeplaceError
from .process import run
from .tool_output import nvidia_smi_csv, rocm_smi
from .vulkan import INSTALL as LAVAPIPE_INSTALL
from .vulkan import VulkanDevice, lavapipe_devices, visible_devices, vulkaninfo_devices

BACKENDS = BUILDS  # lavapipe: only when asked for
ROCM = os.environ.get("ROCM_PATH", "/opt/rocm")
NVIDIA_QUERY = ["--query-gpu=name,memory.total,memory.free,compute_cap", "--format=csv,noheader,nounits"]


class GpuDevice(TypedDict):
    """A GPU as its vendor's tool lists it (`moeplace doctor --json` prints it as is): total and free bytes where
    the tool reports them (None: rocminfo and vulkaninfo --summary do not)."""

    name: str
    total_bytes: int | None
    free_bytes: int | None
    compute_cap: NotRequired[str]  # nvidia-smi's, e.g. "8.9"


@dataclass
class Backend:
    name: str  # cpu, cuda, hip, vulkan or lavapipe (Vulkan on Mesa's CPU implementation)
    reason: str
    cmake_options: list[str] = field(default_factory=list)
    devices: list[GpuDevice] | list[VulkanDevice] = field(default_factory=list)  # lavapipe: vulkaninfo's devices
    toolkit: str | None = None
    install: str | None = None  # what a present GPU lacks to be used


def _tool(name: str, *extra: str) -> str | None:
    """A program on PATH, or at one of the usual install places."""
    found = shutil.which(name)
    return found or next((p for p in extra if Path(p).is_file()), None)


def _lines(cmd: list[str]) -> list[str]:
    result = run(cmd, timeout_s=30)
    return [line.strip() for line in result.stdout.splitlines() if line.strip()] if result.ok else []


def nvidia_devices() -> list[GpuDevice]:
    """NVIDIA GPUs as nvidia-smi reports them (name, total and free bytes, compute capability)."""
    smi = _tool("nvidia-smi")
    result = run([smi, *NVIDIA_QUERY], timeout_s=30) if smi else None
    if not result or not result.ok:
        return []
    gpus = nvidia_smi_csv(result.stdout, tuple(NVIDIA_QUERY[0].split("=", 1)[1].split(",")))
    return [
        {"name": name, "total_bytes": round(total * 2**20), "free_bytes": round(free * 2**20), "compute_cap": cap}
        for g in gpus
        if (name := g["name"]) is not None
        and (total := g.get("total_mib")) is not None
        and (free := g.get("free_mib")) is not None
        and (cap := g.get("compute_cap")) is not None
    ]


def amd_devices() -> list[GpuDevice]:
    """AMD GPU agents rocminfo lists (their gfx target; memory is not reported there)."""
    tool = _tool("rocminfo", f"{ROCM}/bin/rocminfo")
    names = [line.split(":", 1)[1].strip() for line in (_lines([tool]) if tool else []) if line.startswith("Name:")]
    return [{"name": n, "total_bytes": None, "free_bytes": None} for n in dict.fromkeys(names) if n.startswith("gfx")]


def vulkan_devices() -> list[GpuDevice]:
    """Vulkan GPUs (software rasterisers such as llvmpipe left out)."""
    tool = _tool("vulkaninfo")
    lines = _lines([tool, "--summary"]) if tool else []
    names = [line.split("=", 1)[1].strip() for line in lines if line.startswith("deviceName")]
    return [{"name": n, "total_bytes": None, "free_bytes": None} for n in names if "llvmpipe" not in n.lower()]


def _candidates() -> list[tuple[str, list[GpuDevice], str | None, list[str]]]:
    """(backend, devices, toolkit, cmake options) for each GPU kind this machine shows."""
    out = []
    if nvidia := nvidia_devices():
        archs = sorted({d["compute_cap"].replace(".", "") for d in nvidia})
        nvcc = _tool("nvcc", f"{os.environ.get('CUDA_HOME', '/usr/local/cuda')}/bin/nvcc")
        out.append(("cuda", nvidia, nvcc, [*built_as("cuda").cmake, f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}"]))
    if amd := amd_devices():
        targets = ";".join(d["name"] for d in amd)
        hipcc = _tool("hipcc", f"{ROCM}/bin/hipcc")
        out.append(("hip", amd, hipcc, [*built_as("hip").cmake, f"-DAMDGPU_TARGETS={targets}"]))
    if vulkan := vulkan_devices():
        out.append(("vulkan", vulkan, _tool("glslc"), list(built_as("vulkan").cmake)))
    return out


def detect(requested: str = "auto") -> Backend:
    """The backend to build: `requested`, or with auto the first GPU kind whose toolkit is present."""
    if requested not in BACKENDS:
        raise MoeplaceError(f"llamacpp.backend: {requested!r} is not one of {', '.join(BACKENDS)}.")
    if requested == "cpu":
        return Backend("cpu", "llamacpp.backend is cpu: the CPU build, measured through the emulated device")
    if requested == "lavapipe":
        return _lavapipe()
    candidates = _candidates()
    for name, devices, toolkit, options in candidates:
        if requested not in ("auto", name):
            continue
        what = ", ".join(d["name"] for d in devices)
        if toolkit:
            return Backend(name, f"{what} found, and {Path(toolkit).name} to build for it", options, devices, toolkit)
        if requested == name:
            raise MoeplaceError(
                f"llamacpp.backend is {name}, but {Path(toolkit or name).name} is missing: "
                f"install {built_as(name).install}."
            )
        return Backend(
            "cpu",
            f"{what} found, but no {name.upper()} compiler to build for it: the CPU build for now",
            devices=devices,
            install=built_as(name).install,
        )
    if requested != "auto":
        raise MoeplaceError(f"llamacpp.backend is {requested}, but this machine shows no such GPU.")
    return Backend("cpu", "no GPU found (nvidia-smi, rocminfo, vulkaninfo): the CPU build and the emulated device")


def _lavapipe() -> Backend:
    """The Vulkan build run on Mesa's lavapipe: a real Vulkan device on the CPU, never chosen by auto."""
    devices, glslc = lavapipe_devices(), _tool("glslc")
    if not devices or not glslc or not Path("/usr/include/vulkan/vulkan.hpp").is_file():
        lacking = [
            what
            for what, ok in (
                ("lavapipe", devices),
                ("glslc", glslc),
                ("the Vulkan headers", Path("/usr/include/vulkan/vulkan.hpp").is_file()),
            )
            if not ok
        ]
        raise MoeplaceError(
            f"llamacpp.backend is lavapipe, but {', '.join(lacking)} missing: install {LAVAPIPE_INSTALL}."
        )
    what = ", ".join(f"{d['name']}, {d.get('driver', 'Mesa')}" for d in devices)
    return Backend(
        "lavapipe",
        f"llamacpp.backend is lavapipe: the Vulkan build on {what}, software (Mesa's CPU Vulkan), not a GPU",
        list(built_as("lavapipe").cmake),
        devices,
        glslc,
    )


def detected_gpu_backend() -> str | None:
    """The backend of the GPU this machine shows (cuda, rocm or vulkan; metal on a Mac), whatever is built."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "metal"
    return next((built_as(name).name for name, *_ in _candidates()), None)


# Every card's free bytes now and its name, in llama.cpp's device order, and the tool that read them.
FreeMemory = tuple[list[tuple[int, str]], str]


def gpu_free_memory(backend: str) -> FreeMemory:
    """Every card's free memory now and its name, in the tools' order (llama.cpp's device order), and the tool
    that read them (nvidia-smi, rocm-smi or vulkaninfo: the devices llama.cpp's Vulkan backend uses, software ones
    such as lavapipe only where GGML_VK_VISIBLE_DEVICES names them, as llama.cpp does)."""
    if backend == "cuda" and (nvidia := nvidia_devices()):
        return [(c["free_bytes"] or 0, c["name"]) for c in nvidia], "nvidia-smi"  # nvidia-smi reports it
    if backend == "rocm" and (tool := _tool("rocm-smi", f"{ROCM}/bin/rocm-smi")):
        done = run([tool, "--showmeminfo", "vram"], timeout_s=30)
        rocm = rocm_smi(done.stdout) if done.ok else []
        free = [(round(mib * 2**20), str(c["name"])) for c in rocm if (mib := c.get("free_mib")) is not None]
        if free:
            return free, "rocm-smi"
    if backend == "vulkan" and (tool := _tool("vulkaninfo")):
        done = run([tool], timeout_s=60)
        found = vulkaninfo_devices(done.stdout) if done.ok else []
        cards = visible_devices(found, os.environ.get("GGML_VK_VISIBLE_DEVICES"))
        if cards and all(c["total_bytes"] for c in cards):
            soft = " (software: not a GPU)"
            return [(c["free_bytes"], c["name"] + (soft if c["software"] else "")) for c in cards], "vulkaninfo"
    raise MoeplaceError(
        f"--vram auto: cannot read a {backend} card's free memory here (nvidia-smi, rocm-smi or vulkaninfo finds "
        "none); "
        "give the card's memory instead, e.g. --vram 16GB."
    )


def build_tools() -> dict[str, str | None]:
    """What building llama.cpp needs (cmake, a C and a C++ compiler): each one's first version line, None if
    missing."""
    found = {}
    for tool in ("cmake", "cc", "c++"):
        path = shutil.which(tool)
        done = run([path, "--version"], timeout_s=10) if path else None
        found[tool] = (done.stdout.strip().splitlines() or ["present"])[0] if done and done.ok else None
    return found
