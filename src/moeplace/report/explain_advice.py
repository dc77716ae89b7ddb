"""What explain says beside the buffers, in the terms of whoever printed the log: the tool (llama.cpp's own programs,
Ollama, LM Studio) and its settings, unified memory (an APU's or a Mac's GPU using the system's RAM), flash
attention that llama.cpp turned off by itself and why, and a multi-GPU split that put too much on one card.
"""

from __future__ import annotations

import re

from ..runtime.llama_log import LogReport
from ..runtime.llama_names import MiB, device_order
from .paste import CommandArgs

# Ollama's own lines ("time=... level=INFO source=server.go:...", journal "ollama[1234]:", its Go runner), then what
# only hints at it (a blob path under .ollama/): a user may run llama-server on a model in Ollama's or LM Studio's
# folder, and then llama.cpp's flags are the fix, not that app's settings.
_OLLAMA = re.compile(r"ollama\[\d+\]|ollama_llama_server|ollama runner|source=\w+\.go:\d+|OLLAMA_|ollama\s+\|")
_OLLAMA_PATH = re.compile(r"\.ollama[/\\]")
# LM Studio's developer log: "2025-11-12 14:34:51 [DEBUG]" alone on a line, the llama.cpp line on the next (0.3.x);
# "[2026-03-11 16:57:06][INFO][model] ..." (0.4.x); "[LM Studio] GPU Configuration:".
_LMSTUDIO = re.compile(
    r"LM Studio|LM STUDIO|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[(?:DEBUG|INFO|WARN|ERROR)\]\s*$|"
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]\[(?:DEBUG|INFO|WARN|ERROR)\]",
    re.M,
)
_OWN_PROGRAM = re.compile(r"(?:^|[\s/\\])(?:llama-server|llama-cli|llama-bench|llama-sweep-bench|llama-completion)\b")


def tool(text: str) -> str:
    """The program that printed the log: "ollama", "lm-studio" or "llama.cpp" (its own programs and the rest)."""
    if _OLLAMA.search(text):
        return "ollama"
    if _LMSTUDIO.search(text):
        return "lm-studio"
    if _OWN_PROGRAM.search(text):
        return "llama.cpp"
    if _OLLAMA_PATH.search(text):
        return "ollama"
    return "llama.cpp"
    if _OLLAMA.search(text):
        return "ollama"
    if _LMSTUDIO.search(text):
        return "lm-studio"
    return "llama.cpp"


# The context Ollama gave its runner: "KvSize:262144" in a load request (2025-26), "--ctx-size 8192" in the runner's
# command line (2024-25), num_ctx times the parallel requests.
_OLLAMA_CTX = re.compile(r"\bKvSize:(\d+)|ollama(?:_llama_server)?(?:\.exe)? runner .*?--ctx-size (\d+)")


def ollama_context(text: str) -> int | None:
    """The context Ollama gave its runner, in tokens, where the paste shows it."""
    m = _OLLAMA_CTX.search(text)
    return int(m[1] or m[2]) if m else None


# An Ollama paste without the runner's load lines: its server log holds them.
_OLLAMA_PARTIAL = (
    "the paste is partial: Ollama's server log has the runner's whole output (journalctl -u ollama on Linux, "
    "~/.ollama/logs/server.log on macOS, %LOCALAPPDATA%\\Ollama\\server.log on Windows); set OLLAMA_DEBUG=1 for each "
    "tensor's buffer"
)


def tool_todo(name: str, stage: str, report: LogReport) -> str | None:
    """What to change, in the settings of the tool that printed the log (None: llama.cpp's flags, said elsewhere)."""
    if name == "ollama":
        fewer = f" (it placed {report.offloaded[0]} of {report.offloaded[1]} layers)" if report.offloaded else ""
        ctx = ollama_context(report.text)
        asked = f" (this runner was given {ctx:,} tokens)" if ctx else ""
        todo = (
            f"In Ollama: put fewer layers on the GPU with num_gpu{fewer} (PARAMETER num_gpu N in a Modelfile, or "
            '"options": {"num_gpu": N} in the request), a shorter context with num_ctx'
            f"{asked}, and for the server OLLAMA_FLASH_ATTENTION=1 with OLLAMA_KV_CACHE_TYPE=q8_0 (half the KV "
            "bytes). Ollama 0.30.0 and newer run llama.cpp's llama-server: LLAMA_ARG_N_CPU_MOE=N ollama serve keeps "
            "N layers' experts in RAM"
        )
        if not report.model_path or not any(load.weights.sizes for load in report.loads):
            todo += "; " + _OLLAMA_PARTIAL
        return todo + "."
    if name == "lm-studio":
        return (
            "In LM Studio, in the model's load settings: lower 'GPU Offload' (layers on the GPU), or turn on "
            "'Force Model Expert Weights onto CPU' for a mixture-of-experts model; a smaller 'Context Length'; "
            "'Flash Attention' on with a q8_0 'K Cache Quantization Type' and 'V Cache Quantization Type'."
        )
    return None


# An integrated GPU sharing the host's RAM: Vulkan's "uma: 1", ROCm's UMA memory line, AMD APUs by name or gfx id.
APU = re.compile(
    r"uma: 1\b|get_available_uma_memory|gfx(?:1150|1151|1152|1103|1035|1036|90c)\b|Radeon (?:\d{3,4}[MS]\b|8060S)|"
    r"Radeon\(TM\) \d{3}M|Ryzen AI",
    re.I,
)
_METAL = re.compile(r"ggml_metal|MTL\d|Metal_Mapped|recommendedMaxWorkingSetSize")
_WORKING_SET = re.compile(r"recommendedMaxWorkingSetSize\s*=\s*(\d+(?:\.\d+)?) MB")


def unified(report: LogReport, text: str) -> str | None:
    """The words for a GPU whose memory is the system's RAM (None: a card with its own memory)."""
    metal = report.backend == "metal" or bool(_METAL.search(text))
    if not metal and not APU.search(text):
        return None
    shared = (
        "this GPU has no memory of its own: its buffers are the system's RAM, shared with the host's buffers, the "
        "OS and every other program, so a device's 'free' figure is the system's free RAM, not room the GPU alone "
        "can use, and the host's share above comes out of the same pool"
    )
    if metal:
        cap = _WORKING_SET.search(text)  # ggml-metal prints it in MB of 10^6 bytes
        said = f" ({float(cap[1]) * 1e6 / MiB:,.0f} MiB here)" if cap else ""
        return (
            f"{shared}. macOS caps what the GPU may hold at Metal's recommendedMaxWorkingSetSize{said}, about "
            "two thirds to three quarters of the RAM, and llama.cpp reports that cap as the GPU's memory; sudo "
            "sysctl iogpu.wired_limit_mb=N raises it until the next reboot (leave the OS 8 GB or so)"
        )
    return (
        f"{shared}. Linux caps the GPU's share with the kernel's GTT/TTM limit (amdgpu.gttsize, ttm.pages_limit "
        "on the kernel command line) and the BIOS's dedicated VRAM carve-out; the OS needs some GB of the rest"
    )


# "llama_context: layer 0 is assigned to device CUDA0 but the Flash Attention tensor is assigned to device CPU (usually
# due to missing support)" then "llama_context: Flash Attention was auto, set to disabled" (builds of late 2025);
# "resolve_fused_ops: layer 0 is assigned to device CUDA0 but Flash Attention is assigned to device CPU" then
# "resolve_fused_ops: Flash Attention not supported, set to disabled" (2026, src/llama-context.cpp).
_FA_OFF = re.compile(r"Flash Attention was auto, set to disabled|Flash Attention not supported, set to disabled")
# Builds of 2024-25 turn it off for a model they cannot run it on: "flash_attn is not compatible with Grok - forcing
# off", "flash_attn requires n_embd_head_k == n_embd_head_v - forcing off".
_FA_FORCED = re.compile(r"flash_attn (is not compatible with \S+|requires [^\n]*?) - forcing off")
_FA_WHY = re.compile(
    r"layer (\d+) is assigned to device (\S+) but (?:the )?Flash Attention (?:tensor )?is assigned to device (\S+)"
)


def flash_attention(text: str, args: CommandArgs) -> str | None:
    """Why llama.cpp turned flash attention off by itself (asked for auto), from the log and the pasted command's
    cache types; None where it did not."""
    if forced := _FA_FORCED.search(text):
        return (
            f"llama.cpp turned flash attention off for this model (the log: flash_attn {forced[1]}): without it "
            "a quantized V cache is refused and the compute buffer grows with the context; keep the V cache at f16"
        )
    if not _FA_OFF.search(text):
        return None
    why = _FA_WHY.search(text)
    types = (args.get("type_k", "f16"), args.get("type_v", "f16"))
    asked = (
        f"; -ctk {types[0]} -ctv {types[1]} are asked here, and K and V of one type (q8_0, or f16) have kernels on "
        "most backends"
        if types != ("f16", "f16")
        else ""
    )
    if why and why[3] in ("CPU", "none"):
        cause = (
            f"layer {why[1]} runs on {why[2]}, but its flash-attention step would run on {why[3]}, so that backend "
            f"has no kernel for this model's head size or these cache types (or the KV cache is in host RAM: -nkvo)"
            f"{asked}"
        )
    elif why:
        cause = f"layer {why[1]} runs on {why[2]}, but its flash-attention step would run on {why[3]}"
    else:
        cause = "the backend cannot run it for this model"
    return (
        f"flash attention was asked for as auto and llama.cpp turned it off: {cause}. Without flash attention a "
        "quantized V cache is refused and the compute buffer grows with the context"
    )


def split_fix(report: LogReport, args: CommandArgs) -> str | None:
    """On several GPUs, a failure on one card while the others had room: the split put too much there. The fix in
    numbers where the log gives each card's free memory (-ts proportional to it), more --n-cpu-moe, or --fit; with
    --n-cpu-moe, why the last card gets the GPU's experts. None: one GPU, or nothing to say of the others."""
    oom = report.oom
    if not oom or not oom.device:
        return None
    cards = sorted(set(report.free_at_load) | set(report.buffers.devices) | set(_table_free(report)), key=device_order)
    if len(cards) < 2 and device_order(oom.device)[1] == 0:
        return None
    n = args.get("n_cpu_moe")
    tail = (
        f" --n-cpu-moe {n} keeps the experts of the first {n} layers in RAM, so the layers whose experts stay on a "
        "GPU are the last ones, and a layer split gives them to the last cards: spread them with -ts (more layers "
        "to the first cards) or -ot rules that keep experts in RAM from each card's own layers (ik_llama.cpp "
        "builds since March 2026 spread --n-cpu-moe over the cards themselves)."
        if n
        else ""
    )
    room = {card: _room(report, card) for card in cards if card != oom.device}
    spare = {card: free for card, free in room.items() if free is not None and free > 2 * 1024 * MiB}
    if not spare:
        return f"the split put too much on {oom.device}.{tail}".strip() if tail else None
    free_at = {card: free for card in cards if (free := report.free_at_load.get(card) or report.card_memory.get(card))}
    split = ""
    if len(free_at) == len(cards):
        biggest = max(free_at.values())
        split = " (e.g. -ts " + ",".join(f"{round(10 * free_at[c] / biggest)}" for c in cards) + ", by free memory)"
    left = ", ".join(f"{card} {free / MiB:,.0f} MiB" for card, free in spare.items())
    return (
        f"the split put too much on {oom.device} while the other cards had room ({left} left): move layers off "
        f"it with -ts{split}, keep more experts in RAM with a larger --n-cpu-moe, or let llama.cpp split by free "
        f"memory with --fit on (builds since late 2025).{tail}"
    )


def _table_free(report: LogReport) -> dict[str, int]:
    return {d: row["free"] for d, row in report.breakdown.items() if "free" in row}


def _room(report: LogReport, card: str) -> int | None:
    """What a card had left: its free memory at load less what the run put there."""
    free = report.free_at_load.get(card) or report.card_memory.get(card)
    if free is None:
        return None
    return free - sum(report.buffers.devices.get(card, {}).values())
