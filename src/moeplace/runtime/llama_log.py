"""A llama.cpp log as a person reads it, on any backend and in any llama.cpp version's wording: buffers per device
and per host buffer, each load and context, overridden tensors, the cards, and where an allocation failed (read by
llama_failures.py). tool_output.py reads the rest: --list-devices, llama-bench's records, llama-fit-params,
nvidia-smi, rocm-smi.

Real cards print what the emulated device never does (CUDA_Host pinned buffers, several devices, each backend's
own out-of-memory wording), so every reader is tested on real output from real cards (tests/data/llamacpp/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.errors import MoeplaceError
from .llama_failures import OutOfMemory, find_error, find_oom, pipeline_retry
from .llama_names import MiB, backend_of, device_name, is_host

KINDS = ("weights", "kv", "compute", "output", "input")

# "load_tensors: CUDA0 model buffer size = 30.62 MiB", older "llm_load_tensors: CUDA0 buffer size = ...",
# "llama_kv_cache: CUDA0 KV buffer size = ...", "CUDA_Host compute buffer size", "CPU  output buffer size",
# RS (a recurrent model's state), DSV4 state buffers (DeepSeek-V4's compressor): all what a load or context holds.
# Some locales print a decimal comma ("4095,05 MiB"); builds of 2024 log a host "input buffer".
_BUFFER = re.compile(
    r"(?P<name>[A-Za-z][\w\-]*(?:\[[^\]\s]*\])?)\s+(?P<kind>model |KV |RS |compute |output |input |DSV4 \S+ state )?"
    r"buffer size\s*=\s*(?P<mib>\d+(?:[.,]\d+)?) MiB"
)
_KIND = {
    "model": "weights",
    "": "weights",
    "KV": "kv",
    "RS": "kv",
    "compute": "compute",
    "output": "output",
    "input": "input",
}
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


# llama.cpp's --fit (on by default since late 2025) and llama-fit-params size the buffers without allocating them.
_FIT = re.compile(
    r"llama_params_fit|common_fit_params|fitting params to|llama-fit-params|fitted CLI arguments|"
    r"printing estimated memory"
)
_KV_SIZE = re.compile(r"KV buffer size\s*=\s*(\d+(?:[.,]\d+)?) MiB")
_RAN = re.compile(r"server is listening|memory breakdown|model loaded|prompt eval|llama_perf|generate:|main loop")


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
    for m in _INIT_VRAM.finditer(log):
        if m[3]:
            free.setdefault(device_name(backend, m[1]), int(m[3]) * MiB)
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
        | {device_name(backend, m[1]): int(m[2]) * MiB for m in _INIT_VRAM.finditer(log)},
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
