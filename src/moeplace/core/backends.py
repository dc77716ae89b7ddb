"""llama.cpp's backends, one record each: everything moeplace knows of a backend is written here once, and every
list of backends in the package (the plan's --backend choices, its default margin, the device names llama.cpp gives
it, the buffer names its logs carry, what builds it, whether its memory is the host's) is read from this table.

Adding a backend is adding its record (with the evidence for its margin); tests/test_backends.py fails where a
module keeps a list of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import MoeplaceError

MiB = 2**20

# What real cards used beyond llama.cpp's logged buffers (docs/real-cards.md): an RTX 4070 Ti SUPER's published
# out-of-memory boundary puts CUDA's between 176 and 923 MiB over its 16 GiB (CUDA's context took 231-521 MiB of
# headless cards, its runtime 254-681 MiB more); five Arc B580 boundaries put SYCL's between 698 and 997 MiB over
# its size and 369-668 over its free memory. ROCm and Vulkan have no boundary of their own and take CUDA's.
_CUDA_EVIDENCE = "an RTX 4070 Ti SUPER's published out-of-memory boundary: 176-923 MiB over its 16 GiB"


@dataclass(frozen=True)
class BackendRecord:
    """One llama.cpp backend as moeplace plans, builds, names and reads it."""

    name: str  # as --backend and every plan say it
    device_prefix: str  # llama.cpp's name for its devices, before the index (CUDA0) and in -ot rules
    log_prefixes: tuple[str, ...]  # the buffer and device names its logs carry (CUDA0, CUDA_Host; HIP for ROCm)
    margin_mib: int  # MiB kept free beyond llama.cpp's buffers, against the card's size
    auto_margin_mib: int  # the same against the free memory read just before the load (--vram auto)
    margin_evidence: str
    op_offload: bool  # runs a large batch's op on the card with host weights copied into its compute buffer
    build: str | None = None  # llamacpp.backend that builds it on this machine kind (None: not built here)
    cmake: tuple[str, ...] = ()  # the CMake options that build it (a GPU's architectures are added when found)
    install: str | None = None  # what a machine with its GPU lacks to build it
    unified: bool = False  # its memory is the host's RAM (Apple Silicon): the card and the host are one pool
    software: bool = False  # no GPU under it: an emulated or CPU-rendered device, capped exactly
    started: str = ""  # a regex of what llama.cpp logs as it starts the backend (how explain tells a log's backend)
    vendor: str = ""  # the GPU maker whose cards it is the native backend of (the card table's sources)


BACKENDS: tuple[BackendRecord, ...] = (
    BackendRecord(
        "cuda", "CUDA", ("CUDA",), 768, 768, _CUDA_EVIDENCE, op_offload=True, build="cuda", cmake=("-DGGML_CUDA=ON",),
        install="the CUDA toolkit for nvcc (Debian: apt-get install nvidia-cuda-toolkit; or NVIDIA's cuda-toolkit)",
        started=r"found \d+ CUDA devices", vendor="nvidia",
    ),
    BackendRecord(
        "rocm", "ROCm", ("ROCm", "HIP"), 768, 768, "none of its own: CUDA's", op_offload=True, build="hip",
        cmake=("-DGGML_HIP=ON",), install="ROCm's HIP compiler hipcc (Debian: apt-get install hipcc; or AMD's "
        "rocm-hip-sdk)", started=r"found \d+ ROCm devices", vendor="amd",
    ),
    BackendRecord(
        "vulkan", "Vulkan", ("Vulkan",), 768, 768, "none of its own: CUDA's", op_offload=True, build="vulkan",
        cmake=("-DGGML_VULKAN=ON",), install="the Vulkan SDK's glslc and headers (Debian: apt-get install glslc "
        "libvulkan-dev)", started=r"ggml_vulkan: Found \d+ Vulkan devices",
    ),
    BackendRecord(
        "metal", "MTL", ("MTL", "Metal"), 1024, 1024,
        "--vram is the recommended working set, which llama.cpp reports as the card's; macOS keeps the rest",
        op_offload=False, unified=True, started=r"ggml_metal_init|ggml_metal_device_init|MTL\d|Metal_Mapped",
        vendor="apple",
    ),
    BackendRecord(
        "sycl", "SYCL", ("SYCL",), 768, 448,
        "five Arc B580 boundaries: 698-997 MiB over its size, 369-668 MiB over its free memory", op_offload=True,
        started=r"ggml_sycl_init|SYCL\d", vendor="intel",
    ),
    BackendRecord(
        "rpc", "RPC", ("RPC",), 0, 0, "the emulated device is capped exactly: nothing beyond", op_offload=False,
        build="cpu", software=True,
    ),
    BackendRecord(
        "lavapipe", "Vulkan", ("Vulkan",), 0, 0, "the vkcap shim shows Mesa's CPU Vulkan as a card of exactly the "
        "configured size: nothing beyond", op_offload=True, build="lavapipe", cmake=("-DGGML_VULKAN=ON",),
        software=True,
    ),
)  # fmt: skip

# Backends llama.cpp has that moeplace reads in logs but does not plan for: (device prefix, name, what starts it).
LOGGED_ONLY: tuple[tuple[str, str, str], ...] = (
    ("MUSA", "musa", r"found \d+ MUSA devices"),
    ("CANN", "cann", r"CANN\d"),
)
# What llama.cpp logs as it starts each backend, and the backend: how a pasted log's backend is told.
STARTED = (
    *((b.started, b.name) for b in BACKENDS if b.started),
    *((started, name) for _, name, started in LOGGED_ONLY),
)

NAMES = tuple(b.name for b in BACKENDS)
# What llamacpp.backend builds: auto (the first GPU whose toolkit is here) or one record's build.
BUILDS = ("auto", *(b.build for b in BACKENDS if b.build))
# The backends whose published sweeps the speed prior learns from (a name a MANIFEST may give, HIP's as ROCm's).
PRIOR_NAMES = {**{b.name: b.name for b in BACKENDS if not b.software}, "hip": "rocm"}


def backend(name: str) -> BackendRecord:
    """The record of a backend by the name plans use."""
    for b in BACKENDS:
        if b.name == name:
            return b
    raise MoeplaceError(f"backend {name!r}: choose one of {', '.join(NAMES)}.")


def built_as(build: str) -> BackendRecord:
    """The backend a llama.cpp build runs its device on (llamacpp.backend: cpu is the emulated device, rpc)."""
    return next(b for b in BACKENDS if b.build == build)


def native(vendor: str) -> str:
    """The backend llama.cpp runs a maker's cards on natively (CUDA for NVIDIA's, ROCm for AMD's, ...)."""
    return next(b.name for b in BACKENDS if b.vendor == vendor)


def op_offload(name: str) -> bool:
    """Whether this backend copies host experts into its compute buffer for a large batch (False for none: the
    seed's constants have no backend)."""
    return any(b.name == name and b.op_offload for b in BACKENDS)


def device_name(name: str, index: int) -> str:
    """llama.cpp's name for a backend's device, as -ot takes it (CUDA0, MTL0, RPC0)."""
    return f"{backend(name).device_prefix}{index}"


def margin_bytes(name: str, against_free: bool = False) -> int:
    """The bytes kept free on a card of this backend beyond llama.cpp's buffers: against its size, or against the
    free memory read just before the load."""
    b = backend(name)
    return (b.auto_margin_mib if against_free else b.margin_mib) * MiB
