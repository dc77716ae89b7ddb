"""Unified memory: a GPU whose memory is the machine's RAM (Apple Silicon on Metal; an AMD APU on ROCm or Vulkan,
which llama.cpp's Vulkan backend logs as `uma: 1`). There is one pool. The model's weights on the device, its KV
cache and compute buffers, the experts llama.cpp keeps "on the host" (CPU_Mapped: the same RAM) and the operating
system all come out of it, so moving experts to the host frees nothing in the pool; it only keeps them out of the
GPU's share, which the OS caps:

- macOS wires at most the GPU's working set, Metal's recommendedMaxWorkingSetSize (what llama.cpp logs and takes as
  the device's memory): by default about two thirds of the RAM below 64 GiB (16 GiB: 10922.67 MiB; 32 GiB: 21845.33
  MiB, as llama.cpp logs them) and three quarters from 64 GiB (64 GiB: 49152 MiB). `sudo sysctl
  iogpu.wired_limit_mb=N` raises it until the next reboot.
- Linux maps an APU's memory through the GTT, capped by TTM's page limit: half the RAM by default; the kernel's
  `ttm.pages_limit=` (4 KiB pages) and `amdgpu.gttsize=` (MiB) raise it, and the BIOS's VRAM carve-out is apart.

A plan on such a device must fit two limits: the device's buffers within the cap (less the margin), and everything
(device buffers, host-side weights, what the OS keeps) within the RAM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.errors import MoeplaceError
from ..runtime.process import run

GiB = 2**30
# What the OS and a desktop keep beyond the model, by default: macOS with a browser and an editor open.
OS_RESERVE = 4 * GiB
# Unified memory sizes sold (Apple Silicon's; APUs' 32-128 among them), GB as sold (each GiB in the machine), to name
# the smallest that would fit.
SIZES_GIB = (8, 16, 18, 24, 32, 36, 48, 64, 96, 128, 192, 256, 512)


@dataclass(frozen=True)
class Pool:
    """A unified-memory machine: its RAM, the GPU's working-set cap and where it comes from, what the OS keeps."""

    ram_bytes: int
    cap_bytes: int
    cap_source: str
    os_bytes: int = OS_RESERVE

    def describe(self) -> str:
        return (
            f"unified memory: {self.ram_bytes / GiB:.1f} GiB shared by the GPU, the CPU and the OS; the GPU's "
            f"working set at most {self.cap_bytes / GiB:.1f} GiB ({self.cap_source}); {self.os_bytes / GiB:.1f} "
            "GiB kept for the OS and other programs"
        )


def default_cap(ram_bytes: int, backend: str) -> tuple[int, str]:
    """The GPU's working-set cap a machine of this RAM has unless raised, and how to raise it."""
    if backend == "metal":
        num, den = (3, 4) if ram_bytes >= 64 * GiB else (2, 3)
        return ram_bytes * num // den, f"macOS's default, {num}/{den} of the RAM; sudo sysctl iogpu.wired_limit_mb=N"
    return ram_bytes // 2, "TTM's default, half the RAM; raise it with the kernel's ttm.pages_limit and amdgpu.gttsize"


def pool_for(ram_bytes: int, backend: str, wired_limit_mib: int | None = None, os_bytes: int = OS_RESERVE) -> Pool:
    """The pool of a machine with this RAM: the cap the user set (iogpu.wired_limit_mb; 0: the default) or the
    default."""
    if ram_bytes <= os_bytes:
        raise MoeplaceError(
            f"--vram {ram_bytes / GiB:.1f}GiB: a unified-memory machine's RAM must leave the OS its "
            f"{os_bytes / GiB:.0f} GiB; give the machine's memory, e.g. --vram 36GiB."
        )
    if wired_limit_mib:
        if wired_limit_mib * 2**20 > ram_bytes:
            raise MoeplaceError(
                f"--wired-limit {wired_limit_mib}: more MiB than the machine's {ram_bytes >> 20}; give the "
                "iogpu.wired_limit_mb you set (sysctl iogpu.wired_limit_mb shows it)."
            )
        return Pool(ram_bytes, wired_limit_mib * 2**20, f"--wired-limit {wired_limit_mib}", os_bytes)
    cap, source = default_cap(ram_bytes, backend)
    return Pool(ram_bytes, cap, source, os_bytes)


@dataclass(frozen=True)
class PoolFit:
    """What a plan takes of the pool: its device buffers, the weights left on the host side, the OS's share."""

    device_bytes: int
    host_bytes: int
    pool: Pool

    @property
    def total(self) -> int:
        return self.device_bytes + self.host_bytes + self.pool.os_bytes

    @property
    def short_bytes(self) -> int:
        """How much the RAM lacks (0 or less: it fits)."""
        return self.total - self.pool.ram_bytes


def smallest_pool(fits: Callable[[Pool], bool], backend: str) -> Pool | None:
    """The smallest unified memory sold (at its default cap) at which `fits` holds (None: none)."""
    for size in SIZES_GIB:
        pool = pool_for(size * GiB, backend)
        if fits(pool):
            return pool
    return None


# How a macOS `sysctl -n NAME` is read (injected in tests: this machine is not a Mac).
Sysctl = Callable[[str], str]


def read_sysctl(name: str) -> str:
    """macOS's `sysctl -n NAME` ("" where it cannot say)."""
    done = run(["sysctl", "-n", name], timeout_s=5)
    return done.stdout if done.ok else ""


def read_mac(backend: str = "metal", sysctl: Sysctl | None = None) -> Pool | None:
    """This Mac's pool (--vram auto): hw.memsize and iogpu.wired_limit_mb (0: macOS's default cap), as `sysctl`
    (default read_sysctl) reads them; None where sysctl cannot say (not a Mac)."""
    sysctl = sysctl or read_sysctl
    try:
        ram = int(sysctl("hw.memsize").strip())
    except ValueError:
        return None
    try:
        limit = int(sysctl("iogpu.wired_limit_mb").strip() or 0)
    except ValueError:
        limit = 0
    pool = pool_for(ram, backend, limit or None)
    if limit:
        pool = Pool(pool.ram_bytes, pool.cap_bytes, f"iogpu.wired_limit_mb = {limit}, read now", pool.os_bytes)
    return pool
