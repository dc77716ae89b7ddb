"""A llama.cpp log as a person reads it, on any backend and in any llama.cpp version's wording: buffers per device
and per host buffer, each load and context, overridden tensors, the cards, and where an allocation failed.
(tool_output.py reads the rest: --list-devices, llama-bench's records, llama-fit-params, nvidia-smi, rocm-smi.)

Real cards print what the emulated device never does (CUDA_Host pinned buffers, several devices, each backend's
own out-of-memory wording), so every reader is tested on real output from real cards (tests/data/llamacpp/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MiB = 2**20
KINDS = ("weights", "kv", "compute", "output", "input")

# "load_tensors: CUDA0 model buffer size = 30.62 MiB", older "llm_load_tensors: CUDA0 buffer size = ...",
# "llama_kv_cache: CUDA0 KV buffer size = ...", "CUDA_Host compute buffer size", "CPU  output buffer size",
# RS (a recurrent model's state), DSV4 state buffers (DeepSeek-V4's compressor): all what a load or context holds.
# Some locales print a decimal comma ("4095,05 MiB"); builds of 2024 log a host "input buffer".
_BUFFER = re.compile(
    r"(?P<name>[A-Za-z][\w\-]*(?:\[[^\]\s]*\])?)\s+(?P<kind>model |KV |RS |compute |output |input |DSV4 \S+ state )?"
    r"buffer size\s*=\s*(?P<mib>\d+(?:[.,]\d+)?) MiB"
)
_KIND = {"model": "weights", "": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output",
         "input": "input"}  # fmt: skip
# Each context logs its n_ctx first: "llama_context: n_ctx = 4096" (older: llama_new_context_with_model,
# llama_init_from_model).
_CONTEXT = re.compile(r"(?:llama_context|llama_new_context_with_model|llama_init_from_model):\s+n_ctx\s+=\s+(\d+)")
_OVERRIDE = re.compile(r"[Tt]ensor (\S+) (?:\([^)]*\) )?buffer type overrid(?:d)?en to (\S+)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_PIPELINE = re.compile(r"pipeline parallelism enabled(?: \(n_copies=(\d+)\))?")
_USING = re.compile(r"using device (\S+) \((.*?)\)(?: \([^)]*\))? - (\d+) MiB free")
# ggml_cuda_init's device lines of 2026 (CUDA, ROCm): "Device 0: ..., VRAM: 24126 MiB (23863 MiB free)"
_INIT_VRAM = re.compile(r"\bDevice (\d+): .*, VRAM: (\d+) MiB(?: \((\d+) MiB free\))?")
# 2026 builds' device_info ("0.00.042.225 I   - ROCm0   : AMD Radeon RX 7900 XTX (24560 MiB, 24510 MiB free)") and
# --list-devices ("  ROCm0: AMD Radeon(TM) Graphics (110511 MiB, 110357 MiB free)"): total and free before the load.
_DEVICE_INFO = re.compile(
    r"^(?:.*\s)?-?\s*((?:CUDA|ROCm|Vulkan|SYCL|MUSA|CANN)\d+)\s*: .*\((\d+) MiB, (\d+) MiB free\)\s*$", re.M
)
_N_LAYER = re.compile(r"(?:print_info|llm_load_print_meta):\s+n_layer\s+=\s+(\d+)")
_MODEL_PATH = re.compile(
    r"llama_model_loader: loaded meta data with .* from (\S+\.gguf)|(?:with|loading) model '([^']+\.gguf)'"
)
_GPU_NAMES = (
    re.compile(r"\bDevice \d+: ([^,]+), (?:compute capability|gfx)"),  # ggml_cuda_init (CUDA, ROCm, MUSA)
    # "ggml_vulkan: 0 = AMD Radeon RX 7900 XTX (RADV NAVI31) (radv) | uma: 0", the driver's name last
    re.compile(r"ggml_vulkan: \d+ = (.+?)(?: \([^()]*\))? \|"),
    re.compile(r"ggml_metal_init: found device: (.+)$"),
    re.compile(r"^\|\s*\d+\|\s*\[level_zero:gpu:\d+\]\|\s*([^|]+?)\s*\|"),  # SYCL's device table
)
_BACKEND_OF_INIT = (
    (re.compile(r"found \d+ ROCm devices"), "rocm"),
    (re.compile(r"found \d+ CUDA devices"), "cuda"),
    (re.compile(r"found \d+ MUSA devices"), "musa"),
    (re.compile(r"ggml_vulkan: Found \d+ Vulkan devices"), "vulkan"),
    (re.compile(r"ggml_metal_init|ggml_metal_device_init|MTL\d|Metal_Mapped"), "metal"),
    (re.compile(r"ggml_sycl_init|SYCL\d"), "sycl"),
    (re.compile(r"CANN\d"), "cann"),
)
_BACKEND_OF_BUFFER = (
    ("CUDA", "cuda"), ("ROCm", "rocm"), ("HIP", "rocm"), ("Vulkan", "vulkan"), ("MTL", "metal"), ("Metal", "metal"),
    ("SYCL", "sycl"), ("RPC", "rpc"), ("CANN", "cann"), ("MUSA", "musa"), ("CPU", "cpu"),
)  # fmt: skip
_DEVICE_PREFIX = {"cuda": "CUDA", "rocm": "ROCm", "musa": "MUSA"}


def is_host(buffer: str) -> bool:
    """A host buffer: CPU, CPU_Mapped, CPU_REPACK, CPU_AARCH64, AMX, and every backend's pinned host memory
    (CUDA_Host, ROCm_Host, Vulkan_Host, SYCL_Host, ...). CUDA0, ROCm1, Vulkan0, MTL0/Metal, SYCL0, RPC0[...] and
    CUDA_Split (rows split over several GPUs) are devices."""
    return buffer.startswith(("CPU", "AMX")) or buffer.endswith("_Host") or buffer == "host"


def backend_of(buffer: str) -> str | None:
    return next((backend for prefix, backend in _BACKEND_OF_BUFFER if buffer.startswith(prefix)), None)


@dataclass
class Buffers:
    """What one load and one of its contexts hold: bytes per buffer, as llama.cpp names it, and kind
    (weights, kv, compute, output)."""

    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    n_ctx: int | None = None  # the context's size in tokens, where the log says

    def add(self, buffer: str, kind: str, size: int) -> None:
        kinds = self.sizes.setdefault(buffer, {})
        kinds[kind] = kinds.get(kind, 0) + size

    @property
    def devices(self) -> dict[str, dict[str, int]]:
        """Per device: its bytes per kind; several devices are never summed into one."""
        return {name: kinds for name, kinds in self.sizes.items() if not is_host(name)}

    @property
    def host(self) -> dict[str, int]:
        """Host RAM per kind, over every host buffer (CPU_Mapped weights, CUDA_Host compute, CPU output ...)."""
        total: dict[str, int] = {}
        for name, kinds in self.sizes.items():
            if is_host(name):
                for kind, size in kinds.items():
                    total[kind] = total.get(kind, 0) + size
        return total

    def device(self, name: str) -> dict[str, int]:
        """One device's bytes per kind ({} where it holds none), by llama.cpp's name for it (CUDA1) or, for an RPC
        device, by its endpoint (RPC0[127.0.0.1:50052]: every RPC server is its own device 0)."""
        for device, kinds in self.devices.items():
            if name in (device, device.rpartition("[")[2].rstrip("]")):
                return kinds
        return {}

    def only_device(self) -> dict[str, int]:
        """The one device's bytes per kind ({} where everything is on the host); a plan for one device must not
        read several as one."""
        devices = self.devices
        if len(devices) > 1:
            from ..core.errors import MoeplaceError

            raise MoeplaceError(
                f"llama.cpp used {len(devices)} devices ({', '.join(devices)}), but this step plans for one; "
                "make one visible (e.g. CUDA_VISIBLE_DEVICES=0) or see the multi-device plan."
            )
        return next(iter(devices.values()), {})


@dataclass
class Load:
    """One model load: its weights and the contexts created on it (llama-bench creates one per test)."""

    weights: Buffers = field(default_factory=Buffers)
    contexts: list[Buffers] = field(default_factory=list)

    def last(self) -> Buffers:
        """The weights with the last context's KV, compute and output buffers (the weights alone before any)."""
        context = self.contexts[-1] if self.contexts else Buffers()
        merged = Buffers({name: dict(kinds) for name, kinds in self.weights.sizes.items()}, context.n_ctx)
        for name, kinds in context.sizes.items():
            for kind, size in kinds.items():
                merged.add(name, kind, size)
        return merged

    def each_context(self) -> list[Buffers]:
        return [Load(self.weights, [context]).last() for context in self.contexts]


def read_loads(log: str) -> list[Load]:
    """Every load in a llama.cpp log, with its contexts' buffers, in order."""
    loads: list[Load] = []
    previous_kind = None
    for line in log.splitlines():
        if m := _CONTEXT.search(line):
            if not loads:
                loads.append(Load())
            loads[-1].contexts.append(Buffers(n_ctx=int(m[1])))
            previous_kind = "context"
            continue
        m = _BUFFER.search(line)
        if not m:
            continue
        kind = _KIND.get(m["kind"].split()[0] if m["kind"] else "", "kv")
        size = round(float(m["mib"].replace(",", ".")) * MiB)
        name = m["name"]
        if name.endswith("_Mapped") and not is_host(name):  # Metal's mapped weights: the card reads them
            name = name.removesuffix("_Mapped")
        if kind == "weights":
            if previous_kind != "weights" or not loads:
                loads.append(Load())
            loads[-1].weights.add(name, kind, size)
        else:
            if not loads:
                loads.append(Load())
            load = loads[-1]
            # A log without its n_ctx lines (a pasted excerpt): a context starts at its first buffer, or where a
            # second output buffer shows a new one.
            if not load.contexts or previous_kind == "weights" or (kind == "output" and _has(load.contexts[-1], kind)):
                if previous_kind != "context":
                    load.contexts.append(Buffers())
            load.contexts[-1].add(name, kind, size)
        previous_kind = kind
    return loads


def _has(buffers: Buffers, kind: str) -> bool:
    return any(kind in kinds for kinds in buffers.sizes.values())


def parse_buffers(log: str) -> list[Buffers]:
    """One Buffers per context a llama.cpp log created, with the weights of the load before it (llama-bench
    creates a context per test; llama-fit-params logs its reserve without allocation the same way)."""
    return [buffers for load in read_loads(log) for buffers in load.each_context()]


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
        re.compile(r"unable to allocate \S+ buffer|error loading model|failed to load model|load_tensors: failed"),
        "weights",
    ),  # fmt: skip
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
    ),  # fmt: skip
    (re.compile(r"KV buffer size|RS buffer size|KV self size"), "compute"),
    (
        re.compile(
            r"buffer size =|n_ctx\s+=|constructing llama_context|llama_new_context_with_model:|"
            r"llama_init_from_model:"
        ),
        "kv",
    ),  # fmt: skip
    (
        re.compile(r"load_tensors|llm_load_tensors|llama_model_load|llama_model_loader|print_info|llm_load_print_meta"),
        "weights",
    ),  # fmt: skip
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
            device = f"{_DEVICE_PREFIX.get(backend or '', 'CUDA')}{index}"
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
_ERRORS = (
    re.compile(r"\b(?:CUDA|ROCm|HIP|MUSA|SYCL|CANN) error: (?!out of memory).*\S"),
    re.compile(r"error loading model: (?!.*(?:allocat|memory)).*\S"),
    re.compile(r".*(?:DeviceLost|VK_ERROR_DEVICE_LOST|Memory access fault by GPU|HSA_STATUS_ERROR_).*\S"),
    re.compile(r".*(?:GGML_ASSERT\(.*\) failed|ggml_cuda_compute_forward: \w+ failed).*"),
    re.compile(r".*(?:Segmentation fault|SIGSEGV|Illegal instruction|core dumped).*"),
)
# llama.cpp's --fit (on by default since late 2025) and llama-fit-params size the buffers without allocating them.
_FIT = re.compile(r"llama_params_fit|common_fit_params|fitting params to|llama-fit-params|fitted CLI arguments|"
                  r"printing estimated memory")  # fmt: skip
_KV_SIZE = re.compile(r"KV buffer size\s*=\s*(\d+(?:[.,]\d+)?) MiB")
_RAN = re.compile(r"server is listening|memory breakdown|model loaded|prompt eval|llama_perf|generate:|main loop")


def find_error(log: str) -> str | None:
    """The line of an error that is not an out-of-memory, the most telling kind first (None: no such line)."""
    for pattern in _ERRORS:
        for line in log.splitlines():
            if m := pattern.search(line):
                return m[0].strip()
    return None


def dry_run(log: str, loads: list[Load]) -> str | None:
    """Whether the text is a dry run, not a load: "fit-pass" where the last load's weights (or, where the paste
    has none, all its KV buffers) are 0.00 MiB (the --fit pass before the real load, which allocates nothing),
    "fit-projection" where --fit or llama-fit-params printed its projection and no load follows."""
    weights = [kinds["weights"] for kinds in loads[-1].weights.sizes.values() if "weights" in kinds] if loads else []
    kv = [float(m[1].replace(",", ".")) for m in _KV_SIZE.finditer(log)]
    if (weights and not any(weights)) or (not any(weights) and kv and not any(kv)):
        return "fit-pass"
    fits = list(_FIT.finditer(log))
    ran = fits and _RAN.search(log, fits[-1].end())
    return "fit-projection" if fits and not any(weights) and not ran else None


def pipeline_retry(log: str, backend: str | None) -> OutOfMemory | None:
    """The compute-buffer failure with pipeline parallelism that llama.cpp recovered from by retrying without it
    (builds since late 2025), where the log shows one."""
    lines = log.splitlines()
    last = max((i for i, line in enumerate(lines) if _RETRY.search(line)), default=None)
    return find_oom("\n".join(lines[:last]), backend) if last is not None else None


# llama.cpp's own memory table (2026 builds print it at exit, and --fit for each try):
# "|   - CUDA0 (RTX 4090)   | 24077 = 4890 + (19187 = 17904 +     384 +     898) +         0 |"
_BREAKDOWN = re.compile(
    r"\|\s+- (?P<device>\S+)(?: \((?P<card>[^)]*)\))?\s+\|\s+(?P<total>\d+) = (?P<free>-?\d+) \+ \(\s*(?P<self>\d+) = "
    r"\s*(?P<model>\d+) \+\s+(?P<context>\d+) \+\s+(?P<compute>\d+)\) \+\s+(?P<unaccounted>-?\d+) \|"
)
# --fit's projection: "- CUDA0 (NVIDIA GeForce RTX 3090):  24124 total,  48454 used, -24608 free vs. target of   1024"
_PROJECTED = re.compile(
    r"- (?P<device>\S+) \((?P<card>[^)]*)\):\s+(?P<total>\d+) total,\s+(?P<used>-?\d+) used,\s+(?P<free>-?\d+) free"
)


def memory_breakdown(log: str) -> dict[str, dict[str, int]]:
    """The last memory table llama.cpp printed, per device (MiB): total, free, self = model + context + compute,
    and what it could not account for; or --fit's projection (total, used, free) where no table is printed."""
    rows: dict[str, dict[str, int]] = {}
    for m in _BREAKDOWN.finditer(log):
        rows[m["device"]] = {k: int(v) for k, v in m.groupdict().items() if k not in ("device", "card")}
    if not rows:
        for m in _PROJECTED.finditer(log):
            rows[m["device"]] = {k: int(m[k]) for k in ("total", "used", "free")}
    return rows


@dataclass
class LogReport:
    """What a llama.cpp log says of one run: the backend, the cards, memory per device and host, where the
    overridden tensors went, and whether (and where) it ran out of memory."""

    backend: str | None
    gpus: list[str]
    free_at_load: dict[str, int]
    card_memory: dict[str, int]  # each device's total memory, where its backend's init lines print it
    loads: list[Load]
    overridden: dict[str, str]
    offloaded: tuple[int, int] | None
    pipeline_parallel: bool
    pipeline_copies: int | None
    n_layer: int | None
    model_path: str | None
    oom: OutOfMemory | None
    breakdown: dict[str, dict[str, int]]
    error: str | None = None  # the line of an error that is not about memory, where nothing ran out of memory
    dry_run: str | None = None  # "fit-pass" or "fit-projection": sizes llama.cpp computed, nothing allocated
    retried: OutOfMemory | None = None  # the failure with pipeline parallelism that llama.cpp retried without it

    @property
    def status(self) -> str:
        return "oom" if self.oom else "error" if self.error else "ok"

    @property
    def buffers(self) -> Buffers:
        """The last load with its last context: what the run held when it ran (or stopped)."""
        return self.loads[-1].last() if self.loads else Buffers()

    @property
    def n_ctx(self) -> int | None:
        return self.buffers.n_ctx

    def is_llamacpp(self) -> bool:
        found = (self.loads, self.gpus, self.overridden, self.offloaded, self.oom, self.model_path, self.breakdown)
        return any(found) or bool(self.error or self.dry_run or self.retried)


_DEVICE_TOKEN = re.compile(r"\b((?:CUDA|ROCm|Vulkan|MTL|SYCL|CANN|MUSA|RPC)\d+)\b")


def _backend(log: str, buffers: Buffers) -> str | None:
    """The backend of the log's devices: from its init lines, its device buffers, or any device it names."""
    for pattern, backend in _BACKEND_OF_INIT:
        if pattern.search(log):
            return backend
    devices = [backend_of(name) for name in buffers.devices]
    if found := next((b for b in devices if b), None):
        return found
    named = _DEVICE_TOKEN.search(log)
    return backend_of(named[1]) if named else "cpu" if buffers.sizes else None


def _free_at_load(log: str, backend: str | None) -> dict[str, int]:
    """Each device's free memory as the load found it: llama.cpp's "using device CUDA0 (...) - 23010 MiB free",
    else the free memory ggml_cuda_init printed."""
    free = {m[1]: int(m[3]) * MiB for m in _USING.finditer(log)}
    prefix = _DEVICE_PREFIX.get(backend or "", "CUDA")
    for m in _INIT_VRAM.finditer(log):
        if m[3]:
            free.setdefault(f"{prefix}{m[1]}", int(m[3]) * MiB)
    for m in _DEVICE_INFO.finditer(log):
        free.setdefault(m[1], int(m[3]) * MiB)
    return free


def read_log(log: str) -> LogReport:
    """Everything moeplace reads from a llama-server / llama-cli / llama-completion / llama-bench -v /
    llama-fit-params log."""
    loads = read_loads(log)
    last = loads[-1].last() if loads else Buffers()
    backend = _backend(log, last)
    gpus = [m[1].strip() for line in log.splitlines() for p in _GPU_NAMES if (m := p.search(line))]
    pipeline = _PIPELINE.search(log)
    offloaded = _OFFLOADED.findall(log)
    n_layer = _N_LAYER.search(log)
    model = _MODEL_PATH.search(log)
    oom = find_oom(log, backend)
    error = None if oom else find_error(log)
    return LogReport(
        backend=backend or (backend_of(oom.device) if oom and oom.device else backend_of(error or "")),
        gpus=gpus,
        free_at_load=_free_at_load(log, backend),
        card_memory={m[1]: int(m[2]) * MiB for m in _DEVICE_INFO.finditer(log)}
        | {f"{_DEVICE_PREFIX.get(backend or '', 'CUDA')}{m[1]}": int(m[2]) * MiB for m in _INIT_VRAM.finditer(log)},
        loads=loads,
        overridden={m[1]: m[2] for m in _OVERRIDE.finditer(log)},
        offloaded=(int(offloaded[-1][0]), int(offloaded[-1][1])) if offloaded else None,
        pipeline_parallel=pipeline is not None,
        pipeline_copies=int(pipeline[1]) if pipeline and pipeline[1] else None,
        n_layer=int(n_layer[1]) if n_layer else None,
        model_path=(model[1] or model[2]) if model else None,
        oom=oom,
        breakdown=memory_breakdown(log),
        error=error,
        dry_run=dry_run(log, loads),
        retried=pipeline_retry(log, backend),
    )
