"""A llama.cpp log as a person reads it, on any backend and in any llama.cpp version's wording: buffers per device
and per host buffer, each load and context (the main model's, a draft model's, a model's own MTP head's, a
multimodal projector's), overridden tensors, the cards, and where an allocation failed (read by llama_failures.py).
tool_output.py reads the rest: --list-devices, llama-bench's records, llama-fit-params, nvidia-smi, rocm-smi.

Real cards print what the emulated device never does (CUDA_Host pinned buffers, several devices, each backend's
own out-of-memory wording), so every reader is tested on real output from real cards (tests/data/llamacpp/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..core.backends import STARTED
from .llama_buffers import Buffers, Load, live_parts, merged, read_loads
from .llama_failures import OutOfMemory, find_error, find_oom, pipeline_retry
from .llama_names import MiB, backend_of, device_name

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
_BACKEND_OF_INIT = tuple((re.compile(started), name) for started, name in STARTED)


# llama.cpp's --fit (on by default since late 2025) and llama-fit-params size the buffers without allocating them.
_FIT = re.compile(
    r"llama_params_fit|common_fit_params|fitting params to|llama-fit-params|fitted CLI arguments|"
    r"printing estimated memory"
)
_KV_SIZE = re.compile(r"KV buffer size\s*=\s*(\d+(?:[.,]\d+)?) MiB")
_RAN = re.compile(
    r"server is listening|memory breakdown|model loaded|prompt eval|llama_perf|generate:|main loop|"
    r"failed to allocate|unable to allocate|out of memory"  # a load that ran out of memory is no dry run
)


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
# its host row: "|   - Host               |                  25094 =  1502 +   21504 +    2088                |"
_BREAKDOWN_HOST = re.compile(
    r"\|\s+- Host\s+\|\s+(?P<self>\d+) = \s*(?P<model>\d+) \+\s+(?P<context>\d+) \+\s+(?P<compute>\d+)\s+\|"
)
# --fit's projection: "- CUDA0 (NVIDIA GeForce RTX 3090):  24124 total,  48454 used, -24608 free vs. target of   1024"
_PROJECTED = re.compile(
    r"- (?P<device>\S+) \((?P<card>[^)]*)\):\s+(?P<total>\d+) total,\s+(?P<used>-?\d+) used,\s+(?P<free>-?\d+) free"
)


def memory_tables(log: str) -> list[dict[str, dict[str, int]]]:
    """Every memory table llama.cpp printed, in order, each per device (MiB): --fit prints one per try (2026 builds
    one more for a draft model or an MTP head fitted beside the main one), llama-server one for its main context at
    exit."""
    tables: list[dict[str, dict[str, int]]] = []
    for line in log.splitlines():
        if "memory breakdown" in line:
            tables.append({})
        elif (m := _BREAKDOWN.search(line)) and tables:
            tables[-1][m["device"]] = {k: int(v) for k, v in m.groupdict().items() if k not in ("device", "card")}
    return [table for table in tables if table]


def memory_breakdown(log: str) -> dict[str, dict[str, int]]:
    """The last memory table llama.cpp printed, per device (MiB): total, free, self = model + context + compute,
    and what it could not account for (its Host row: self, model, context, compute); or --fit's projection (total,
    used, free) where no table is printed."""
    rows: dict[str, dict[str, int]] = {}
    for m in _BREAKDOWN.finditer(log):
        rows[m["device"]] = {k: int(v) for k, v in m.groupdict().items() if k not in ("device", "card")}
    if rows and (hosts := list(_BREAKDOWN_HOST.finditer(log))):
        rows["Host"] = {k: int(v) for k, v in hosts[-1].groupdict().items()}
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
    text: str = field(default="", repr=False)  # the log itself

    @property
    def status(self) -> str:
        return "oom" if self.oom else "error" if self.error else "ok"

    @property
    def parts(self) -> list[Buffers]:
        """What the run held at once, per part (main, draft, mtp, projector): see live_parts."""
        return live_parts(self.loads, self.text)

    @property
    def buffers(self) -> Buffers:
        """Every live part together (the main model and context, a draft's, an MTP head's, a projector's): what
        the run held when it ran (or stopped)."""
        return merged(*self.parts)

    @property
    def main(self) -> Buffers:
        """The main model with its context: what llama.cpp's own memory table counts."""
        return next(iter(self.parts), Buffers())

    @property
    def n_ctx(self) -> int | None:
        return self.main.n_ctx

    def is_llamacpp(self) -> bool:
        read = (self.loads, self.gpus, self.overridden, self.offloaded, self.oom, self.model_path, self.breakdown)
        said = (self.error, self.dry_run, self.retried, self.free_at_load, _OWN_LINE.search(self.text))
        return any(read) or any(said)


# A line only llama.cpp prints: its functions' names before a colon (a paste of a few lines, grep's output).
_OWN_LINE = re.compile(
    r"^(?:.*\s)?(?:sched_reserve|llama_context|llama_kv_cache|load_tensors|llama_model_loader):", re.M
)
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
    free: dict[str, int] = {}
    for m in _USING.finditer(log):  # the first: a draft model's load, later, finds the main model's weights there
        free.setdefault(m[1], int(m[3]) * MiB)
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
    backend = _backend(log, merged(*live_parts(loads, log)))
    found = [m[1].strip() for line in log.splitlines() for p in _GPU_NAMES if (m := p.search(line))]
    gpus = [name for name in found if len(name) > 2]  # a feature table's flag column ("Y", "N") names no GPU
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
        text=log,
    )
