"""`moeplace explain LOG`: what a pasted llama.cpp log says went where (per device: weights, KV, compute; the
host's share; how many layers' experts stayed in RAM), why it ran out of memory if it did, and the `recommend`
line that plans that card."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from typing import Any, TypedDict

from ..core.backends import NAMES as BACKEND_NAMES
from ..core.errors import MoeplaceError
from ..core.records import JsonObject, LlamaBenchRow
from ..runtime.llama_log import LogReport, read_log
from ..runtime.llama_names import MiB, device_order, is_host
from ..runtime.llamacpp_args import DEFAULT_UBATCH
from ..runtime.tool_output import read_bench
from .explain_advice import APU as _APU
from .explain_advice import flash_attention, ollama_context, split_fix, tool, tool_todo, unified
from .explain_parts import TableCheck, mib_row, parts, table_check
from .paste import CommandArgs, command_args, looks_cut

_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_\w*_(?:ch)?exps\b")
_STAGE_WORDS = {
    "weights": "loading the weights",
    "kv": "allocating the KV cache",
    "compute": "reserving the compute buffers",
    "runtime": "running (after the load)",
}


_FLASH = {
    "on": "on",
    "1": "on",
    "true": "on",
    "enabled": "on",
    "off": "off",
    "0": "off",
    "false": "off",
    "auto": "auto",
}


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, str) and re.fullmatch(r"-?\d+", value) else None


def _rounded(size: int | None) -> float | None:
    return round(size / MiB, 2) if size else None


class Retried(TypedDict):
    """A compute buffer llama.cpp failed to allocate with pipeline parallelism, and recovered from without it."""

    device: str | None
    requested_mib: float | None
    line: str


def _retried(report: LogReport) -> Retried | None:
    """The compute-buffer failure with pipeline parallelism that llama.cpp recovered from, where it shows one."""
    failed = report.retried
    return (
        {"device": failed.device, "requested_mib": _rounded(failed.requested_bytes), "line": failed.line}
        if failed
        else None
    )


class ExpertsOnHost(TypedDict):
    """The routed-expert tensors a log shows in host buffers."""

    tensors: int
    layers: int
    layer_list: list[int]
    at_least: bool  # the paste looks cut: there may be more


def experts_on_host(report: LogReport, text: str = "") -> ExpertsOnHost | None:
    """The routed-expert tensors the log shows overridden to a host buffer, and their layers (None: the log has
    no override lines; llama.cpp logs them with -v). at_least: the paste looks cut (a snip mark, or the override
    lines, which llama.cpp prints layer by layer, skip layers or show part of one), so there may be more."""
    if not report.overridden:
        return None
    host = [name for name, buffer in report.overridden.items() if is_host(buffer) and _EXPERT.match(name)]
    per_layer = Counter(int(m[1]) for name in host if (m := _EXPERT.match(name)))
    seen = list(per_layer)
    skips = any(b - a > 1 for a, b in zip(seen, seen[1:])) or len(set(per_layer.values())) > 1
    layers = sorted(seen)
    return {
        "tensors": len(host),
        "layers": len(layers),
        "layer_list": layers,
        "at_least": bool(host) and (skips or looks_cut(text)),
    }


def card_memory(report: LogReport, device: str) -> int | None:
    """What the log says the device had: its free memory at load, else its total."""
    return report.free_at_load.get(device) or report.card_memory.get(device)


# The driver saying that one allocation was over its limit (Vulkan's maxMemoryAllocationSize, a buffer-size cap).
_LIMIT_SAYS = re.compile(r"exceeds device (?:memory allocation|buffer size) limit|maxMemoryAllocationSize", re.I)
_RETRIED = re.compile(r"retrying without pipeline parallelism")
_ERROR_HINTS = (
    (
        re.compile(r"kernel image is invalid|invalid device function|no kernel image|INVALID_CODE_OBJECT|INVALID_ISA"),
        "this llama.cpp build has no GPU code for this card: build it for the card's architecture (ROCm: "
        "-DAMDGPU_TARGETS=gfx... as rocminfo names the card; CUDA: -DCMAKE_CUDA_ARCHITECTURES), or use a build or "
        "backend (e.g. Vulkan) made for it",
    ),
    (
        re.compile(
            r"unknown model architecture|unknown (?:pre-)?tokenizer|wrong number of tensors|missing tensor|"
            r"key not found"
        ),
        "this llama.cpp build cannot read this model (it is older than the model's architecture or converter): "
        "update llama.cpp, or the app that bundles it (ollama, LM Studio)",
    ),
    (
        re.compile(r"not within the file bounds|invalid magic|unexpectedly reached end|corrupt|failed to read"),
        "the model file is incomplete or damaged: download it again and check its size or checksum",
    ),
    (re.compile(r"failed to open|No such file"), "llama.cpp could not open the model file: check its path"),
    (
        re.compile(r"V cache quantization requires flash_attn|quantized V cache was requested"),
        "a quantized V cache needs flash attention, which is off for this model or backend: keep the V cache at "
        "f16 (-ctv f16; in Ollama leave OLLAMA_KV_CACHE_TYPE unset for this model), or turn flash attention on "
        "(-fa on) where the backend supports it",
    ),
    (
        re.compile(r"illegal memory access|DeviceLost|DEVICE_LOST|Memory access fault|HSA_STATUS_ERROR"),
        "the GPU faulted while computing: a driver or llama.cpp bug; update both, and report it with this line",
    ),
)
_DRY_RUN_WORDS = {
    "fit-pass": "this is llama.cpp's --fit dry run, not the load: --fit (on by default since late 2025) first "
    "sizes the buffers without allocating them, so its weights and KV print 0.00 MiB. The real load's lines "
    "follow 'fitting params to free memory took': paste the log from there on, or run with -fit off",
    "fit-projection": "this is llama.cpp's fit projection (llama-fit-params, or --fit before it loads), a dry run "
    "that allocates nothing: its figures are what llama.cpp expected to use, not what it used. Paste the log "
    "of the load that follows to see what went where",
}


def copies(n: int) -> str:
    return f"{n} {'copy' if n == 1 else 'copies'}"


def _cause(report: LogReport, text: str) -> str:
    """Why the allocation failed: allocation-limit (one allocation over a driver's limit, with room to spare),
    pipeline-copies (a compute buffer multiplied by pipeline parallelism's copies), or memory (too little)."""
    oom = report.oom
    assert oom is not None  # an out-of-memory log's
    if _LIMIT_SAYS.search(text):
        return "allocation-limit"
    free = report.free_at_load.get(oom.device or "")
    held = sum(report.buffers.devices.get(oom.device or "", {}).values())
    card = free or report.card_memory.get(oom.device or "")
    asked = oom.requested_bytes or 0
    huge = asked >= card if card else asked > max(held, 4 * 2**30)  # more than the card, or all else on it
    if _copies_on(report, text) and huge:
        return "pipeline-copies"
    if free and asked and (asked + held <= free or (_APU.search(text) and asked <= free)):
        return "allocation-limit"  # on an APU the device's free memory is the host's: one buffer is what failed
    return "memory"


def _copies_on(report: LogReport, text: str) -> bool:
    """Pipeline parallelism was on, with copies, when the compute buffers failed (not after llama.cpp's retry)."""
    on = report.pipeline_parallel and report.pipeline_copies != 1 and not _RETRIED.search(text)
    return bool(on and report.oom and report.oom.stage == "compute")


def _why(report: LogReport, cause: str, args: CommandArgs, text: str) -> tuple[str, str]:
    """What happened and what to do about it, in words."""
    oom = report.oom
    assert oom is not None  # an out-of-memory log's
    asked = f" ({oom.requested_bytes / MiB:,.2f} MiB asked)" if oom.requested_bytes else ""
    where = oom.device or "the device"
    held = report.buffers.devices.get(oom.device or "", {})
    before = f" after {sum(held.values()) / MiB:,.0f} MiB already placed there" if held else ""
    free = report.free_at_load.get(oom.device or "")
    total = report.card_memory.get(oom.device or "")
    had = (
        f"; it had {free / MiB:,.0f} MiB free at load" if free else f"; it has {total / MiB:,.0f} MiB" if total else ""
    )
    stage = _STAGE_WORDS[oom.stage]
    if cause == "allocation-limit":
        room = f", though it had {free / MiB:,.0f} MiB free at load" if free else ""
        why = (
            f"{where} could not make one allocation{asked} while {stage}{room}: that is a limit on a single "
            "allocation (the driver's), not a lack of memory, so planning with the free memory would fail the "
            "same way."
        )
        apu = _APU.search(text)
        smaller = {
            "compute": f"a smaller -ub (e.g. -ub {max(64, (_number(args.get('ubatch')) or DEFAULT_UBATCH) // 2)})",
            "kv": "a smaller -c, or a quantized cache (-ctk q8_0 -ctv q8_0)",
        }.get(oom.stage, "fewer layers on the device (-ngl), or the largest tensors kept on the host (-ot ...=CPU)")
        todo = f"Make that buffer smaller: {smaller}; or split it over several devices."
        if apu:
            todo += (
                " On an AMD APU the GPU's share of the RAM is capped by the kernel's GTT/TTM limit "
                "(amdgpu.gttsize, ttm.pages_limit) and by the driver's single-allocation cap: raising those "
                "also works."
            )
        return why, todo
    why = f"{where} ran out of memory while {stage}{asked}{before}{had}."
    if not _copies_on(report, text):
        return why, split_fix(report, args) or ""
    n = report.pipeline_copies or 4
    ngl = f" (your -ngl {args['ngl']} does)" if args.get("ngl") else ""
    layers = f"-ngl {report.n_layer}" if report.n_layer else "-ngl equal to the layer count"
    if cause == "pipeline-copies":
        why += (
            f" Pipeline parallelism caused it: it was on ('pipeline parallelism enabled', {copies(n)}), so "
            f"llama.cpp reserved {copies(n)} of the compute buffers' inputs on each device, which is what made "
            "this buffer so large."
        )
    else:
        why += (
            f" Pipeline parallelism was on ({copies(n)} of the compute buffers' inputs on each device), which "
            "makes this buffer larger: turning it off may be enough."
        )
    todo = (
        f"Turn pipeline parallelism off: build llama.cpp with -DGGML_SCHED_MAX_COPIES=1 (a CMake option; no "
        "environment variable or flag sets it), or keep llama.cpp from choosing it, which it does only with "
        f"several devices, -sm layer and every layer plus the output layer on the GPUs{ngl}: {layers} (the "
        "output layer stays on the host) or -sm row turns it off, and so does any -ot in llama.cpp (not in older "
        "ik_llama.cpp builds). llama.cpp builds since late 2025 (PR #16748) retry without it by themselves; "
        "ik_llama.cpp builds since September 2025 make 1 copy."
    )
    return why, todo


def _fix(report: LogReport, args: CommandArgs) -> str:
    """The recommend line for this model, card and context, with the pasted command's own -c, -ub, -np, -fa and
    its -ot pins (placeholders where the text does not say)."""
    model = (
        report.model_path or args.get("model") or ("ollama:MODEL" if tool(report.text) == "ollama" else "MODEL.gguf")
    )
    device = (report.oom and report.oom.device) or next(iter(report.buffers.devices), None)
    free = card_memory(report, device or "")
    vram = f"{free // MiB}MiB" if free else "YOUR_CARD_MEMORY"
    cards = sorted(set(report.buffers.devices) | set(report.free_at_load), key=device_order)
    if len(cards) > 1 or device_order(device or "")[1] > 0:  # several cards, planned together, each its memory
        sizes = [card_memory(report, card) for card in cards]
        vram = (
            ",".join(f"{size // MiB}MiB" for size in sizes if size)
            if len(sizes) > 1 and all(sizes)
            else "EACH_CARD,..."
        )
    ctx = report.n_ctx or (_number(args.get("ctx")) or None) or ollama_context(report.text) or "CONTEXT"
    line = ["moeplace", "recommend", model, "--vram", vram, "--ctx", str(ctx)]
    if report.backend in BACKEND_NAMES:  # a backend recommend plans for
        line += ["--backend", report.backend]
    for flag, value in (("--ubatch", args.get("ubatch")), ("--parallel", args.get("parallel"))):
        if value is not None and (_number(value) or 0) > 0:
            line += [flag, value]
    if _FLASH.get(str(args.get("flash_attn", "")).lower()):
        line += ["--flash-attn", _FLASH[args["flash_attn"].lower()]]
    for rule in args.get("ot", []):
        if "exps" not in rule and "=" in rule:  # the experts' placement is what recommend plans
            line += ["-ot", rule]
    return shlex.join(line)


def _error(report: LogReport) -> dict[str, str]:
    error = report.error
    assert error is not None  # a log that stopped with an error
    hint = next((h for pattern, h in _ERROR_HINTS if pattern.search(error)), None)
    todo = hint or "search llama.cpp's issues for this line; moving memory around will not fix it"
    return {"line": error, "why": "llama.cpp stopped with an error that is not about memory.", "todo": todo}


class Explanation(TypedDict, total=False):
    """What explain finds in a paste, JSON-ready (sizes in MiB): llama-bench's results (kind, gpus, records) or a
    llama.cpp log's account (the rest)."""

    kind: str  # "llama-bench results" or "llama.cpp log"
    gpus: list[str]
    records: list[LlamaBenchRow]
    backend: str | None
    devices: dict[str, dict[str, float]]  # device -> buffer kind -> MiB (total, free_at_load)
    host: JsonObject  # the host's buffer kinds in MiB, and each host buffer's
    free_at_load: dict[str, float]  # device -> MiB free as the load found it
    experts_on_host: ExpertsOnHost | None
    offloaded_layers: list[int] | None
    n_ctx: int | None
    n_layer: int | None
    pipeline_parallel: bool | None
    pipeline_copies: int | None
    pipeline_retried: Retried | None
    model: str | None
    parts: dict[str, dict[str, dict[str, float]]] | None  # role -> device (and host) -> kind -> MiB
    breakdown: JsonObject | None
    breakdown_check: dict[str, TableCheck] | None
    command: CommandArgs | None
    tool: str  # the program that printed the log: llama.cpp, ollama or lm-studio
    unified: str | None  # the words for a GPU whose memory is the system's RAM
    flash_attention: str | None  # why llama.cpp turned flash attention off by itself
    expert_logging: bool  # whether running with -v would show where the experts went (a MoE model, a quiet log)
    status: str
    dry_run: dict[str, str] | None
    error: dict[str, str] | None
    oom: dict[str, str | float | None] | None  # where it ran out of memory, why, and what to do
    fix: str | None


def explain(text: str, source: str = "the text") -> Explanation:
    """The log's account as JSON-ready values (MiB); a one-line error for text that is not llama.cpp's."""
    if not text.strip():
        raise MoeplaceError(
            f"{source} is empty, so it is not a llama.cpp log: paste llama-server's or llama-cli's "
            "output from its start (with -v for each tensor's buffer)."
        )
    report = read_log(text)
    records = read_bench(text) if "|" in text or text.lstrip().startswith(("[", "{", "build_commit")) else []
    if records and not report.loads and not report.oom:
        return {"kind": "llama-bench results", "gpus": report.gpus, "records": records}
    if not report.is_llamacpp():
        raise MoeplaceError(
            f"{source} is not a llama.cpp log: it has no buffer, device, override or out-of-memory line. Paste "
            "llama-server's or llama-cli's output from its start (with -v for each tensor's buffer)."
        )
    args = command_args(text)
    buffers = report.buffers
    devices = {name: mib_row(kinds) for name, kinds in buffers.devices.items()}
    for name, row in devices.items():
        if name in report.free_at_load:
            row["free_at_load"] = round(report.free_at_load[name] / MiB, 2)
    host = mib_row(buffers.host) | {
        "buffers": {name: mib_row(kinds) for name, kinds in buffers.sizes.items() if is_host(name)}
    }
    out: Explanation = {
        "kind": "llama.cpp log",
        "backend": report.backend,
        "gpus": report.gpus,
        "devices": devices,
        "host": host,
        "free_at_load": {name: round(free / MiB, 2) for name, free in report.free_at_load.items()},
        "experts_on_host": experts_on_host(report, text),
        "offloaded_layers": list(report.offloaded) if report.offloaded else None,
        "n_ctx": report.n_ctx,
        "n_layer": report.n_layer,
        "pipeline_parallel": report.pipeline_parallel,
        "pipeline_copies": report.pipeline_copies,
        "pipeline_retried": _retried(report),
        "model": report.model_path,
        "parts": parts(report),
        "breakdown": report.breakdown,
        "breakdown_check": table_check(report) or None,
        "command": args or None,
        "tool": tool(text),
        "unified": unified(report, text),
        "flash_attention": flash_attention(text, args),
        "expert_logging": bool(buffers.host.get("weights")) and not _DENSE.search(text) and not _VERBOSE.search(text),
        "status": report.status,
        "dry_run": {"kind": report.dry_run, "why": _DRY_RUN_WORDS[report.dry_run]} if report.dry_run else None,
        "error": _error(report) if report.error else None,
        "oom": None,
        "fix": None,
    }
    if report.oom:
        out["oom"], out["fix"] = _out_of_memory(report, args, text)
    return out


# A dense model (print_info: n_expert = 0) has no experts to place; a log at -v or -lv 4 already shows each
# overridden tensor, so asking for -v again is no help.
_DENSE = re.compile(r"(?:print_info|llm_load_print_meta):\s+n_expert\s+=\s+0\b")
_VERBOSE = re.compile(
    r"verbosity\s*=\s*(?:[4-9]|\d{2,})|(?:-lv|--log-verbosity)\s+[4-9]|--verbose\b|\s-v(?:\s|$)|OLLAMA_DEBUG=1", re.M
)


def _out_of_memory(report: LogReport, args: CommandArgs, text: str) -> tuple[dict[str, str | float | None], str]:
    """Where the run ran out of memory, why, and what to do; and the fix (the `recommend` line that plans it)."""
    oom = report.oom
    assert oom is not None  # an out-of-memory log's
    requested = round(oom.requested_bytes / MiB, 2) if oom.requested_bytes else None
    cause = _cause(report, text)
    why, todo = _why(report, cause, args, text)
    if in_tool := tool_todo(tool(text), oom.stage, report):
        todo = f"{todo} {in_tool}".strip()
    found = {
        "stage": oom.stage,
        "device": oom.device,
        "requested_mib": requested,
        "line": oom.line,
        "cause": cause,
        "why": why,
        "todo": todo,
    }
    return found, todo if cause == "allocation-limit" else _fix(report, args)
