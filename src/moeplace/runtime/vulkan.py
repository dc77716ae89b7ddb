"""llama.cpp's Vulkan backend as this project builds and runs it: the pinned source's one patch (Debian 12's
Vulkan headers), what keys the build, and Mesa's lavapipe, a real Vulkan implementation on the CPU that stands in
for a GPU where none is lent (llamacpp.backend: lavapipe; never chosen by auto).

On lavapipe what is real: llama.cpp's Vulkan device and buffer names (Vulkan0, Vulkan_Host), where each tensor
goes, llama-fit-params' planning against the device's memory, and the out-of-memory path (a refused
vkAllocateMemory). What is not: the speed (a CPU's), falling free memory, and a refusal by Mesa itself (Mesa 22
reports a fixed 2048 MiB heap and does not enforce it): the device's size is the config's, shown to llama.cpp and
enforced by the vkcap shim (native/vkcap.c, see lavapipe_env).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from ..core.errors import MoeplaceError
from .process import run, run_checked

PATCHES = Path(__file__).parents[1] / "patches"
# Applied to the vendored llama.cpp before every Vulkan build, pinned like the sdist: ggml-vulkan.cpp uses
# vk::LayerSettingEXT, which Debian 12's Vulkan headers (1.3.239; backports has none newer) lack; the patch builds
# the instance without the validation layer's settings where the headers lack VK_EXT_layer_settings.
PATCH = {
    "file": "vulkan-layer-settings.patch",
    "sha256": "c647a8b9aa8421de9e3642a68df46bce392d8f30592d06a1c9997ee7d4363ebe",
}
DEBIAN_PACKAGES = ("mesa-vulkan-drivers", "libvulkan-dev", "glslc", "vulkan-tools", "spirv-headers")
INSTALL = f"Mesa's lavapipe and the Vulkan build tools (apt-get install {' '.join(DEBIAN_PACKAGES)})"
# A CPU-type device is skipped by llama.cpp unless named: lavapipe is then Vulkan0.
VISIBLE = {"GGML_VK_VISIBLE_DEVICES": "0"}
LABEL = "lavapipe (Mesa's CPU Vulkan), not a GPU"


class BuildIdentity(TypedDict):
    """What keys a Vulkan build beside its CMake options (hashed as JSON into the cache key: keys and values kept)."""

    patch: str  # the pinned patch's sha256
    vulkan_headers: str | None
    glslc: str | None
    lavapipe: NotRequired[bool]  # a build run on lavapipe


class VulkanDevice(TypedDict):
    """A device in vulkaninfo's output (`moeplace doctor --json` prints it as is): its name, whether it is a CPU
    type (software), its device-local memory as llama.cpp counts it, and its driver where vulkaninfo names one."""

    name: str
    software: bool
    total_bytes: int
    free_bytes: int
    driver: NotRequired[str]


@dataclass
class _Heap:
    """One memoryHeaps[n] block of vulkaninfo while it is read."""

    open: bool = False  # a heap's block (not memoryTypes')
    local: bool = False  # MEMORY_HEAP_DEVICE_LOCAL_BIT
    size: int = 0
    budget: int | None = None
    usage: int = 0


def patch_file() -> Path:
    path = PATCHES / PATCH["file"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != PATCH["sha256"]:
        raise MoeplaceError(f"{path} has sha256 {digest}, expected {PATCH['sha256']}; refusing to apply it.")
    return path


def apply_patch(source: Path, log_file: Path) -> None:
    """The pinned patch applied to the vendored llama.cpp in `source` (a clean failure if it does not apply)."""
    patch = shutil.which("patch")
    if not patch:
        raise MoeplaceError("building llama.cpp with Vulkan needs patch (apt-get install patch).")
    cmd = [patch, "-p1", "--forward", "-d", str(source), "-i", str(patch_file())]
    run_checked(cmd, f"applying {PATCH['file']} to llama.cpp", log_file)


def _first(cmd: list[str], pattern: str) -> str | None:
    done = run(cmd, timeout_s=30) if shutil.which(cmd[0]) else None
    m = re.search(pattern, done.stdout + done.stderr) if done and done.ok else None
    return m[1].strip() if m else None


def headers_version() -> str | None:
    """The Vulkan headers' VK_HEADER_VERSION (239 on Debian 12), which decides whether the patch is needed."""
    for include in (Path("/usr/include"), Path("/usr/local/include")):
        header = include / "vulkan" / "vulkan_core.h"
        text = header.read_text(errors="replace") if header.is_file() else ""
        if m := re.search(r"#define VK_HEADER_VERSION (\d+)", text):
            return m[1]
    return None


def build_identity(lavapipe: bool = False) -> BuildIdentity:
    """What keys a Vulkan build beside its CMake options: the patch, the headers and the shader compiler (and that
    it runs on lavapipe)."""
    glslc = _first(["glslc", "--version"], r"(.+)")
    identity: BuildIdentity = {"patch": PATCH["sha256"], "vulkan_headers": headers_version(), "glslc": glslc}
    if lavapipe:
        identity["lavapipe"] = True
    return identity


def lavapipe_devices() -> list[VulkanDevice]:
    """Mesa's software Vulkan devices (llvmpipe) that vulkaninfo lists: name, memory, and the driver's version."""
    done = run(["vulkaninfo"], timeout_s=60) if shutil.which("vulkaninfo") else None
    found = vulkaninfo_devices(done.stdout) if done and done.ok else []
    return [d for d in found if d["software"] and "llvmpipe" in d["name"].lower()]


def mesa_version() -> str | None:
    """Mesa's version as lavapipe reports it (e.g. "Mesa 22.3.6 (LLVM 15.0.6)")."""
    return next((d.get("driver") for d in lavapipe_devices() if d.get("driver")), None)


def runtime_env() -> dict[str, str]:
    """The environment every llama.cpp process of a lavapipe build runs with: lavapipe made visible as Vulkan0."""
    return dict(VISIBLE)


def lavapipe_env(vkcap: str, cap_bytes: int) -> dict[str, str]:
    """The environment of a llama.cpp process on a lavapipe device of `cap_bytes`: the vkcap shim preloaded, which
    shows lavapipe as a discrete card of that size (a device-local heap of `cap_bytes` beside host memory) and
    refuses a device allocation past it with VK_ERROR_OUT_OF_DEVICE_MEMORY, as a full card does."""
    return {"LD_PRELOAD": vkcap, "MOEPLACE_DEVICE_CAP_BYTES": str(cap_bytes)}


def vulkaninfo_devices(text: str) -> list[VulkanDevice]:
    """Each device in `vulkaninfo`'s full output, in its order (GGML_VK_VISIBLE_DEVICES' indices): name, whether it
    is a CPU type (software), and its device-local memory total and free as llama.cpp counts them (the heap's
    budget less its usage where the driver reports a budget, else its size)."""
    devices: list[VulkanDevice] = []
    heap = _Heap()

    def close_heap(opens: bool = False) -> None:
        nonlocal heap
        if heap.local and devices:
            devices[-1]["total_bytes"] += heap.size
            devices[-1]["free_bytes"] += heap.size if heap.budget is None else heap.budget - heap.usage
        heap = _Heap(open=opens)

    for raw in text.splitlines():
        line = raw.strip()
        if re.fullmatch(r"GPU\d+:", raw.rstrip()):
            close_heap()
            devices.append({"name": "", "software": False, "total_bytes": 0, "free_bytes": 0})
        elif not devices:
            continue
        elif m := re.match(r"deviceName\s*=\s*(.+)", line):
            devices[-1]["name"] = devices[-1]["name"] or m[1].strip()
        elif m := re.match(r"driverInfo\s*=\s*(.+)", line):
            devices[-1]["driver"] = m[1].strip()
        elif m := re.match(r"deviceType\s*=\s*(\S+)", line):
            devices[-1]["software"] = m[1] == "PHYSICAL_DEVICE_TYPE_CPU"
        elif re.match(r"memoryHeaps\[\d+\]:", line) or re.match(r"memoryTypes:", line):
            close_heap(opens=line.startswith("memoryHeaps"))
        elif heap.open and (m := re.match(r"(size|budget|usage)\s*=\s*(\d+)", line)):
            setattr(heap, m[1], int(m[2]))
        elif heap.open and line == "MEMORY_HEAP_DEVICE_LOCAL_BIT":
            heap.local = True
    close_heap()
    return devices


def visible_devices(devices: list[VulkanDevice], visible: str | None) -> list[VulkanDevice]:
    """The devices llama.cpp uses: those GGML_VK_VISIBLE_DEVICES names (software ones included), else the
    hardware ones (llama.cpp skips CPU-type devices unless named)."""
    if visible is None:
        return [d for d in devices if not d["software"]]
    indices = [int(i) for i in re.split(r"[,\s]+", visible.strip()) if i]
    if any(i >= len(devices) for i in indices):
        raise MoeplaceError(
            f"GGML_VK_VISIBLE_DEVICES={visible} names a device beyond the {len(devices)} vulkaninfo lists."
        )
    return [devices[i] for i in indices]
