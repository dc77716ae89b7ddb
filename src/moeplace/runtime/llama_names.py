"""How llama.cpp names what it logs: devices (CUDA0, ROCm1, Vulkan0, MTL0, SYCL0, RPC0[host:port]) and host buffers
(CPU_Mapped, CUDA_Host), the backend a name belongs to, and the unit its sizes are printed in.
"""

from __future__ import annotations

from ..core.backends import BACKENDS, LOGGED_ONLY

MiB = 2**20

# The backend a buffer or device name belongs to, by its prefix (the registry's, the first record of a prefix
# winning, then the backends moeplace only reads, and the host's).
_BACKEND_OF_BUFFER = (
    *((prefix, b.name) for b in BACKENDS for prefix in b.log_prefixes),
    *((prefix, name) for prefix, name, _ in LOGGED_ONLY),
    ("CPU", "cpu"),
)
_DEVICE_PREFIX = {**{b.name: b.device_prefix for b in BACKENDS}, **{name: prefix for prefix, name, _ in LOGGED_ONLY}}


def is_host(buffer: str) -> bool:
    """A host buffer: CPU, CPU_Mapped, CPU_REPACK, CPU_AARCH64, AMX, and every backend's pinned host memory
    (CUDA_Host, ROCm_Host, Vulkan_Host, SYCL_Host, ...). CUDA0, ROCm1, Vulkan0, MTL0/Metal, SYCL0, RPC0[...] and
    CUDA_Split (rows split over several GPUs) are devices."""
    return buffer.startswith(("CPU", "AMX")) or buffer.endswith("_Host") or buffer == "host"


def backend_of(buffer: str) -> str | None:
    return next((backend for prefix, backend in _BACKEND_OF_BUFFER if buffer.startswith(prefix)), None)


def device_name(backend: str | None, index: int | str) -> str:
    """The name llama.cpp gives a backend's device by its index (a log that names only the index and no backend:
    CUDA's)."""
    return f"{_DEVICE_PREFIX.get(backend or '', 'CUDA')}{index}"


def device_order(name: str) -> tuple[str, int]:
    """A device name as (prefix, index), to sort devices by index (CUDA2 before CUDA10): ("CUDA", 2)."""
    digits = len(name) - len(name.rstrip("0123456789"))
    return (name[: len(name) - digits], int(name[len(name) - digits :])) if digits else (name, 0)
