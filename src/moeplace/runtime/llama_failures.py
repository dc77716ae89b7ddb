"""Where a llama.cpp run failed, read from its log on any backend and in any llama.cpp version's wording: the
allocation that ran out of memory (its stage, device and size), the failure llama.cpp recovered from by retrying
without pipeline parallelism, and an error that is not about memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .llama_names import MiB, device_name


@dataclass
class OutOfMemory:
    """Where an allocation failed: the stage (weights, kv, compute, runtime), the device as the log names it,
    the size asked for where printed, and the line that says so."""

    stage: str
    device: str | None
    requested_bytes: int | None
    line: str


# Lines that say an allocation failed, with what they tell: the device (a name, or an index), and a size.
_ALLOC_FAILED = (
    re.compile(r"allocating (?P<mib>[\d.]+) MiB on device (?P<index>\d+): \w+ failed"),
    re.compile(r"failed to allocate (?P<device>\S+) buffer of size (?P<bytes>\d+)"),
    re.compile(r"failed to allocate buffer of size (?P<bytes>\d+)"),
    re.compile(r"Device memory allocation of size (?P<bytes>\d+) failed"),
    re.compile(r"can't malloc (?P<bytes>\d+) Bytes memory on device"),  # SYCL
    re.compile(r"unable to allocate (?P<device>\S+) buffer"),
    re.compile(r"failed to allocate buffer, size = (?P<mib>[\d.]+) MiB"),  # Metal
    re.compile(r"ErrorOutOfDeviceMemory|OutOfDeviceMemory|out of device memory|OUT_OF_DEVICE_MEMORY", re.I),
    re.compile(r"(?:CUDA|HIP|ROCm|MUSA) error: out of memory|cudaMalloc failed|hipMalloc failed"),
    re.compile(r"Insufficient Memory|kIOGPUCommandBufferCallbackErrorOutOfMemory|std::bad_alloc"),
    re.compile(r"failed to allocate buffer for (?:kv|rs) cache|failed for self-attention cache"),
    re.compile(r"failed to allocate compute (?:pp |tg )?buffers"),
)
# The stage a failure belongs to, from the lines at and after it ("unable to allocate CUDA0 buffer" while loading
# tensors; "failed to allocate buffer for kv cache"; "failed to allocate compute buffers").
_STAGE_SAYS = (
    (re.compile(r"command buffer \d+ failed with status"), "runtime"),  # Metal: a graph ran out while computing
    (
        re.compile(
            r"unable to allocate \S+ buffer|error loading model|failed to load model|load_tensors: failed|"
            r"Failed to allocate buffer type"  # ik_llama.cpp's weights
        ),
        "weights",
    ),
    (re.compile(r"buffer for (?:kv|rs) cache|kv_cache\w*: failed|failed for self-attention cache"), "kv"),
    (re.compile(r"compute (?:pp |tg )?buffers|ggml_gallocr_reserve|graph_reserve|sched_reserve: failed"), "compute"),
)
# Where a log had got to before a failure, from the last line before it that tells (checked in this order): its
# compute buffers logged (it was running), its KV cache logged (compute came next), its weights logged or a
# context begun (the KV cache came next), or its tensors being loaded.
_PHASE = (
    (
        re.compile(
            r"compute buffer size|graph splits|graph nodes|slot|server is listening|model loaded|sampler|"
            r"prompt eval|llama_perf|warming up|warmup|generate:"
        ),
        "runtime",
    ),
    (re.compile(r"KV buffer size|RS buffer size|KV self size"), "compute"),
    (
        re.compile(
            r"buffer size =|n_ctx\s+=|constructing llama_context|llama_new_context_with_model:|"
            r"llama_init_from_model:"
        ),
        "kv",
    ),
    (
        re.compile(r"load_tensors|llm_load_tensors|llama_model_load|llama_model_loader|print_info|llm_load_print_meta"),
        "weights",
    ),
)
_CURRENT_DEVICE = re.compile(r"current device: (\d+)")
_NAMED_DEVICE = re.compile(r"(?:failed|unable) to allocate (\S+) buffer\b(?!s)")
_BUFFER_NAME = re.compile(r"(?:CUDA|ROCm|HIP|Vulkan|MTL|Metal|SYCL|RPC|CANN|MUSA|CPU)\w*(?:\[[^\]]*\])?")
# llama.cpp recovers from one failure: a compute buffer too large with pipeline parallelism is reserved again
# without it.
_RETRY = re.compile(r"retrying without pipeline parallelism")


def _buffer_name(token: str | None) -> str | None:
    """A token that names a buffer (CUDA0, ROCm_Host, Vulkan0), not a word such as "backend" in "unable to
    allocate backend buffer"."""
    return token if token and _BUFFER_NAME.fullmatch(token) else None


def _stage(lines: list[str], i: int) -> str:
    """The stage of the failure at line i: what the lines from it on say, else what the log did before it."""
    for later in lines[i : i + 12]:
        for pattern, stage in _STAGE_SAYS:
            if pattern.search(later):
                return stage
    for earlier in reversed(lines[:i]):
        for pattern, stage in _PHASE:
            if pattern.search(earlier):
                return stage
    return "runtime"


def find_oom(log: str, backend: str | None) -> OutOfMemory | None:
    """The allocation failure that stopped the run: the first one after the last recovery llama.cpp made."""
    lines = log.splitlines()
    start = max((i for i, line in enumerate(lines) if _RETRY.search(line)), default=-1) + 1
    for i in range(start, len(lines)):
        m = next((m for p in _ALLOC_FAILED if (m := p.search(lines[i]))), None)
        if not m:
            continue
        found = m.groupdict()
        after = lines[i : i + 12]
        named = (_buffer_name(d[1]) for later in after if (d := _NAMED_DEVICE.search(later)))
        device = _buffer_name(found.get("device")) or next((d for d in named if d), None)
        index = found.get("index") or next((d[1] for later in after if (d := _CURRENT_DEVICE.search(later))), None)
        if device is None and index is not None:
            device = device_name(backend, index)
        if device is None and "cpu_buffer_type" in lines[i]:  # ggml_backend_cpu_buffer_type_alloc_buffer
            device = "CPU"
        sizes = (m.groupdict() for later in lines[i : i + 4] for p in _ALLOC_FAILED[:7] if (m := p.search(later)))
        size = next((g for g in sizes if g.get("bytes") or g.get("mib")), {})  # the cascade's first size
        requested = int(size["bytes"]) if size.get("bytes") else round(float(size["mib"]) * MiB) if size else None
        return OutOfMemory(_stage(lines, i), device, requested, lines[i].strip())
    return None


# A failure that is not about memory (read where no allocation failed), the most telling kind first: the backend's
# own error ("ROCm error: device kernel image is invalid", "CUDA error: an illegal memory access was encountered"),
# a model this build cannot load, a lost device or GPU fault, a failed assert or op, a crash.
# Searched in the whole log at once (re.M: "^" is a line's start), never line by line: a -v log of a long sweep
# holds tens of thousands of lines, and a pattern tried line by line from every position took seconds per sweep.
_ERRORS = tuple(
    re.compile(pattern, re.M)
    for pattern in (
        r"\b(?:CUDA|ROCm|HIP|MUSA|SYCL|CANN) error: (?!out of memory).*\S",
        r"error loading model: (?!.*(?:allocat|memory)).*\S",
        r"^.*(?:DeviceLost|VK_ERROR_DEVICE_LOST|Memory access fault by GPU|HSA_STATUS_ERROR_).*\S",
        r"^.*(?:GGML_ASSERT\(.*\) failed|ggml_cuda_compute_forward: \w+ failed).*",
        r"\w+: (?:[\w ]+: )?(?:V cache quantization requires flash_attn|quantized V cache was requested.*)",
        r"^.*(?:Segmentation fault|SIGSEGV|Illegal instruction|core dumped).*",
    )
)


def find_error(log: str) -> str | None:
    """The line of an error that is not an out-of-memory, the most telling kind first (None: no such line)."""
    for pattern in _ERRORS:
        if m := pattern.search(log):
            return m[0].strip()
    return None


def pipeline_retry(log: str, backend: str | None) -> OutOfMemory | None:
    """The compute-buffer failure with pipeline parallelism that llama.cpp recovered from by retrying without it
    (builds since late 2025), where the log shows one."""
    lines = log.splitlines()
    last = max((i for i, line in enumerate(lines) if _RETRY.search(line)), default=None)
    return find_oom("\n".join(lines[:last]), backend) if last is not None else None
