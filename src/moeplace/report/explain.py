"""`moeplace explain LOG`: what a pasted llama.cpp log says went where (per device: weights, KV, compute; the
host's share; how many layers' experts stayed in RAM), why it ran out of memory if it did, and the `recommend`
line that plans that card."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from ..core.errors import MoeplaceError
from ..runtime.llama_log import LogReport, MiB, is_host, read_log
from ..runtime.tool_output import read_bench

_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_\w*_(?:ch)?exps\b")
_STAGE_WORDS = {
    "weights": "loading the weights",
    "kv": "allocating the KV cache",
    "compute": "reserving the compute buffers",
    "runtime": "running (after the load)",
}
_RECOMMEND_BACKEND = {"cuda": "cuda", "rocm": "rocm", "vulkan": "vulkan", "metal": "metal", "sycl": "sycl",
                      "rpc": "rpc"}  # fmt: skip


# The command a paste often starts with (llama-server ..., ./llama-cli \\ on several lines, ollama's runner), and the
# flags of it that the plan and the words use.
_PROGRAM = re.compile(
    r"(?:^|[\s/\\$>=\"'])(?:llama-server|llama-cli|llama-bench|llama-fit-params|llama-completion|llama-mtmd-cli|"
    r"llama-sweep-bench|ollama_llama_server|ollama runner|server|main)(?:\.exe)?\s+(-.*)$"
)
# llama-server's router prints the arguments it starts a model with one to a line: "srv          load:   --model".
_ARG_LINE = re.compile(r"\bsrv\s+load:\s+(\S.*?)\s*$")
_OPTIONS = {"-c": "ctx", "--ctx-size": "ctx", "-ngl": "ngl", "--n-gpu-layers": "ngl", "--gpu-layers": "ngl",
            "-ot": "ot", "--override-tensor": "ot", "-ub": "ubatch", "--ubatch-size": "ubatch",
            "-ncmoe": "n_cpu_moe", "--n-cpu-moe": "n_cpu_moe", "-np": "parallel", "--parallel": "parallel",
            "-m": "model", "--model": "model", "-sm": "split_mode", "--split-mode": "split_mode",
            "-fa": "flash_attn", "--flash-attn": "flash_attn"}  # fmt: skip
_FLASH = {"on": "on", "1": "on", "true": "on", "enabled": "on", "off": "off", "0": "off", "false": "off",
          "auto": "auto"}  # fmt: skip
# A paste with lines cut out of it: a line that is only an ellipsis or a snip mark, or one that says lines were cut.
_CUT = re.compile(
    r"^\s*(?:\.{1,3}|…|\[\.\.\.\]|\[…\]|\(\.\.\.\)|<snip>|\[snip\])\s*$|"
    r"\b(?:truncated|snipped|omitted|removed|cut|skipped|repeated)\b.*\b(?:lines?|times)\b|"
    r"\blines?\b.*\b(?:truncated|snipped|omitted|removed|cut|skipped)\b",
    re.I | re.M,
)


def command_args(text: str) -> dict[str, Any]:
    """The flags of the first llama.cpp command line the text shows, or of the router's argument lines ({} where
    it shows neither): ctx, ngl, ubatch, n_cpu_moe, parallel, model, split_mode and flash_attn as typed, ot as the
    list of -ot rules."""
    lines = re.sub(r"\\[ \t]*\r?\n", " ", text).splitlines()
    commands = [m[1] for line in lines if (m := _PROGRAM.search(line))]
    arg_lines = [m[1] for line in lines if (m := _ARG_LINE.search(line))]
    for command in commands[:1] or ([shlex.join(arg_lines)] if arg_lines else []):
        try:
            tokens = shlex.split(command)
        except ValueError:
            tokens = command.split()
        args: dict[str, Any] = {}
        for i, token in enumerate(tokens):
            flag, _, value = token.partition("=") if token.startswith("--") else (token, "", "")
            key = _OPTIONS.get(flag)
            if key is None:
                continue
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            value = value or (following if following and not re.match(r"-[^\d]", following) else "")
            if key == "flash_attn" and not value:  # builds of 2024/25: a bare -fa
                value = "on"
            if key == "ot" and value:
                args.setdefault("ot", []).extend(value.split(","))
            elif value:
                args[key] = value
        return args
    return {}


def _starts_in_overrides(text: str) -> bool:
    """The paste begins with an override line: the ones before it (llama.cpp prints them all) were left out."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return "buffer type overrid" in first


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, str) and re.fullmatch(r"-?\d+", value) else None


def _rounded(size: int | None) -> float | None:
    return round(size / MiB, 2) if size else None


def _retried(report: LogReport) -> dict[str, Any] | None:
    """The compute-buffer failure with pipeline parallelism that llama.cpp recovered from, where it shows one."""
    failed = report.retried
    return (
        {"device": failed.device, "requested_mib": _rounded(failed.requested_bytes), "line": failed.line}
        if failed
        else None
    )


def _mib(kinds: dict[str, int]) -> dict[str, float]:
    mib = {kind: round(size / MiB, 2) for kind, size in kinds.items()}
    return mib | {"total": round(sum(kinds.values()) / MiB, 2)}


def experts_on_host(report: LogReport, text: str = "") -> dict[str, Any] | None:
    """The routed-expert tensors the log shows overridden to a host buffer, and their layers (None: the log has
    no override lines; llama.cpp logs them with -v). at_least: the paste looks cut (a snip mark, or the override
    lines, which llama.cpp prints layer by layer, skip layers or show part of one), so there may be more."""
    if not report.overridden:
        return None
    host = [name for name, buffer in report.overridden.items() if is_host(buffer) and _EXPERT.match(name)]
    per_layer = Counter(int(_EXPERT.match(name)[1]) for name in host)
    seen = list(per_layer)
    skips = any(b - a > 1 for a, b in zip(seen, seen[1:])) or len(set(per_layer.values())) > 1
    layers = sorted(seen)
    return {"tensors": len(host), "layers": len(layers), "layer_list": layers,
            "at_least": bool(host) and (skips or bool(_CUT.search(text)) or _starts_in_overrides(text))}  # fmt: skip


def card_memory(report: LogReport, device: str) -> int | None:
    """What the log says the device had: its free memory at load, else its total."""
    return report.free_at_load.get(device) or report.card_memory.get(device)


# The driver saying that one allocation was over its limit (Vulkan's maxMemoryAllocationSize, a buffer-size cap).
_LIMIT_SAYS = re.compile(r"exceeds device (?:memory allocation|buffer size) limit|maxMemoryAllocationSize", re.I)
# An integrated GPU sharing the host's RAM: Vulkan's "uma: 1", ROCm's UMA memory line, AMD APUs by name or gfx id.
_APU = re.compile(
    r"uma: 1\b|get_available_uma_memory|gfx(?:1150|1151|1152|1103|1035|1036|90c)\b|Radeon (?:\d{3,4}[MS]\b|8060S)|"
    r"Radeon\(TM\) \d{3}M|Ryzen AI",
    re.I,
)
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
    ),  # fmt: skip
    (
        re.compile(r"not within the file bounds|invalid magic|unexpectedly reached end|corrupt|failed to read"),
        "the model file is incomplete or damaged: download it again and check its size or checksum",
    ),
    (re.compile(r"failed to open|No such file"), "llama.cpp could not open the model file: check its path"),
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


def _copies(n: int) -> str:
    return f"{n} {'copy' if n == 1 else 'copies'}"


def _cause(report: LogReport, text: str) -> str:
    """Why the allocation failed: allocation-limit (one allocation over a driver's limit, with room to spare),
    pipeline-copies (a compute buffer multiplied by pipeline parallelism's copies), or memory (too little)."""
    oom = report.oom
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


def _why(report: LogReport, cause: str, args: dict[str, Any], text: str) -> tuple[str, str]:
    """What happened and what to do about it, in words."""
    oom = report.oom
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
        why = (f"{where} could not make one allocation{asked} while {stage}{room}: that is a limit on a single "
               "allocation (the driver's), not a lack of memory, so planning with the free memory would fail the "
               "same way.")  # fmt: skip
        apu = _APU.search(text)
        smaller = {
            "compute": f"a smaller -ub (e.g. -ub {max(64, (_number(args.get('ubatch')) or 512) // 2)})",
            "kv": "a smaller -c, or a quantized cache (-ctk q8_0 -ctv q8_0)",
        }.get(oom.stage, "fewer layers on the device (-ngl), or the largest tensors kept on the host (-ot ...=CPU)")
        todo = f"Make that buffer smaller: {smaller}; or split it over several devices."
        if apu:
            todo += (" On an AMD APU the GPU's share of the RAM is capped by the kernel's GTT/TTM limit "
                     "(amdgpu.gttsize, ttm.pages_limit) and by the driver's single-allocation cap: raising those "
                     "also works.")  # fmt: skip
        return why, todo
    why = f"{where} ran out of memory while {stage}{asked}{before}{had}."
    if not _copies_on(report, text):
        return why, ""
    n = report.pipeline_copies or 4
    ngl = f" (your -ngl {args['ngl']} does)" if args.get("ngl") else ""
    layers = f"-ngl {report.n_layer}" if report.n_layer else "-ngl equal to the layer count"
    if cause == "pipeline-copies":
        why += (f" Pipeline parallelism caused it: it was on ('pipeline parallelism enabled', {_copies(n)}), so "
                f"llama.cpp reserved {_copies(n)} of the compute buffers' inputs on each device, which is what made "
                "this buffer so large.")  # fmt: skip
    else:
        why += (f" Pipeline parallelism was on ({_copies(n)} of the compute buffers' inputs on each device), which "
                "makes this buffer larger: turning it off may be enough.")  # fmt: skip
    todo = (f"Turn pipeline parallelism off: build llama.cpp with -DGGML_SCHED_MAX_COPIES=1 (a CMake option; no "
            "environment variable or flag sets it), or keep llama.cpp from choosing it, which it does only with "
            f"several devices, -sm layer and every layer plus the output layer on the GPUs{ngl}: {layers} (the "
            "output layer stays on the host) or -sm row turns it off, and so does any -ot in llama.cpp (not in older "
            "ik_llama.cpp builds). llama.cpp builds since late 2025 (PR #16748) retry without it by themselves; "
            "ik_llama.cpp builds since September 2025 make 1 copy.")  # fmt: skip
    return why, todo


def _fix(report: LogReport, args: dict[str, Any]) -> str:
    """The recommend line for this model, card and context, with the pasted command's own -c, -ub, -np, -fa and
    its -ot pins (placeholders where the text does not say)."""
    model = report.model_path or args.get("model") or "MODEL.gguf"
    device = (report.oom and report.oom.device) or next(iter(report.buffers.devices), None)
    free = card_memory(report, device or "")
    vram = f"{free // MiB}MiB" if free else "YOUR_CARD_MEMORY"
    ctx = report.n_ctx or (_number(args.get("ctx")) or None) or "CONTEXT"
    line = ["moeplace", "recommend", model, "--vram", vram, "--ctx", str(ctx)]
    if report.backend in _RECOMMEND_BACKEND:
        line += ["--backend", _RECOMMEND_BACKEND[report.backend]]
    for flag, key in (("--ubatch", "ubatch"), ("--parallel", "parallel")):
        if (_number(args.get(key)) or 0) > 0:
            line += [flag, args[key]]
    if _FLASH.get(str(args.get("flash_attn", "")).lower()):
        line += ["--flash-attn", _FLASH[args["flash_attn"].lower()]]
    for rule in args.get("ot", []):
        if "exps" not in rule and "=" in rule:  # the experts' placement is what recommend plans
            line += ["-ot", rule]
    return shlex.join(line)


def _error(report: LogReport) -> dict[str, str]:
    hint = next((h for pattern, h in _ERROR_HINTS if pattern.search(report.error)), None)
    todo = hint or "search llama.cpp's issues for this line; moving memory around will not fix it"
    return {"line": report.error, "why": "llama.cpp stopped with an error that is not about memory.", "todo": todo}


def explain(text: str, source: str = "the text") -> dict[str, Any]:
    """The log's account as JSON-ready values (MiB); a one-line error for text that is not llama.cpp's."""
    if not text.strip():
        raise MoeplaceError(f"{source} is empty, so it is not a llama.cpp log: paste llama-server's or llama-cli's "
                            "output from its start (with -v for each tensor's buffer).")  # fmt: skip
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
    devices = {name: _mib(kinds) for name, kinds in buffers.devices.items()}
    for name, row in devices.items():
        if name in report.free_at_load:
            row["free_at_load"] = round(report.free_at_load[name] / MiB, 2)
    host = _mib(buffers.host) | {
        "buffers": {name: _mib(kinds) for name, kinds in buffers.sizes.items() if is_host(name)}
    }
    out: dict[str, Any] = {
        "kind": "llama.cpp log",
        "backend": report.backend,
        "gpus": report.gpus,
        "devices": devices,
        "host": host,
        "experts_on_host": experts_on_host(report, text),
        "offloaded_layers": list(report.offloaded) if report.offloaded else None,
        "n_ctx": report.n_ctx,
        "n_layer": report.n_layer,
        "pipeline_parallel": report.pipeline_parallel,
        "pipeline_copies": report.pipeline_copies,
        "pipeline_retried": _retried(report),
        "model": report.model_path,
        "breakdown": report.breakdown,
        "command": args or None,
        "status": report.status,
        "dry_run": {"kind": report.dry_run, "why": _DRY_RUN_WORDS[report.dry_run]} if report.dry_run else None,
        "error": _error(report) if report.error else None,
        "oom": None,
        "fix": None,
    }
    if report.oom:
        oom = report.oom
        requested = round(oom.requested_bytes / MiB, 2) if oom.requested_bytes else None
        cause = _cause(report, text)
        why, todo = _why(report, cause, args, text)
        out["oom"] = {"stage": oom.stage, "device": oom.device, "requested_mib": requested, "line": oom.line,
                      "cause": cause, "why": why, "todo": todo}  # fmt: skip
        out["fix"] = todo if cause == "allocation-limit" else _fix(report, args)
    return out


def render(found: dict[str, Any]) -> str:
    """The account as a person reads it."""
    if found["kind"] != "llama.cpp log":
        lines = [f"llama-bench results: {len(found['records'])} records"]
        for r in found["records"]:
            test = f"pp{r.get('n_prompt', 0)}" if not r.get("n_gen") else f"tg{r['n_gen']}"
            depth = f" @ d{r['n_depth']}" if r.get("n_depth") else ""
            ncmoe = f", -ncmoe {r['n_cpu_moe']}" if r.get("n_cpu_moe") not in (None, "") else ""
            lines.append(f"  {test}{depth}{ncmoe}: {r.get('avg_ts', float('nan')):.2f} tok/s")
        return "\n".join(lines)
    lines = [f"backend: {found['backend'] or 'unknown'}" + (f" ({', '.join(found['gpus'])})" if found["gpus"] else "")]
    if found["n_ctx"]:
        lines.append(f"context: {found['n_ctx']} tokens")
    lines.append(f"{'':<22}{'weights':>10}{'KV':>10}{'compute':>10}{'output':>10}{'total':>11}  MiB")

    def row(name: str, mib: dict[str, float]) -> str:
        cells = "".join(f"{mib.get(k, 0):>10,.1f}" for k in ("weights", "kv", "compute", "output"))
        free = f"  ({mib['free_at_load']:,.0f} free at load)" if "free_at_load" in mib else ""
        return f"{name:<22}{cells}{mib['total']:>11,.1f}{free}"

    for name, mib in found["devices"].items():
        lines.append(row(name, mib))
    if found["host"]["buffers"]:
        lines.append(row("host", found["host"]) + f"  [{', '.join(found['host']['buffers'])}]")
    if not found["devices"] and not found["host"]["buffers"]:
        lines[-1] = "buffers: none in this text (llama.cpp logs them as it loads: paste the log from its start)"
    experts = found["experts_on_host"]
    if experts:
        at_least = "at least " if experts["at_least"] else ""
        cut = " (the paste looks cut: lines are missing)" if experts["at_least"] else ""
        lines.append(f"experts in host RAM: {at_least}{experts['tensors']} tensors in {experts['layers']} layers{cut}")
    elif found["host"].get("weights"):
        lines.append("experts in host RAM: not logged (run with -v to see each tensor's buffer)")
    if found["offloaded_layers"]:
        lines.append(f"layers offloaded: {found['offloaded_layers'][0]}/{found['offloaded_layers'][1]}")
    if found["breakdown"]:
        columns = list(next(iter(found["breakdown"].values())))
        lines.append("llama.cpp's own memory table (MiB): " + ", ".join(columns))
        for device, row in found["breakdown"].items():
            lines.append(f"  {device:<20}" + "".join(f"{row[c]:>10,}" for c in columns))
    if found["pipeline_parallel"]:
        copies = found["pipeline_copies"] or 4
        lines.append(f"pipeline parallelism: on ({_copies(copies)} of the compute buffers' inputs per device)")
    if retried := found["pipeline_retried"]:
        asked = f"{retried['requested_mib']:,.2f} MiB" if retried["requested_mib"] else "its compute buffers"
        lines.append(f"pipeline parallelism: its copies made the compute buffers too large ({asked} asked on "
                     f"{retried['device'] or 'a device'}), so llama.cpp retried without it (1 copy)")  # fmt: skip
    if found["dry_run"]:
        lines.append(f"dry run: {found['dry_run']['why']}.")
    if found["status"] == "oom":
        oom = found["oom"]
        lines.append(("allocation failed: " if oom["cause"] == "allocation-limit" else "out of memory: ") + oom["why"])
        lines.append(f"  the line: {oom['line']}")
        if oom["todo"]:
            lines.append(f"  what to do: {oom['todo']}")
        if oom["cause"] != "allocation-limit":
            lines.append(f"  plan it: {found['fix']}")
    elif found["status"] == "error":
        lines.append(f"error: {found['error']['why']}")
        lines.append(f"  the line: {found['error']['line']}")
        lines.append(f"  what to do: {found['error']['todo']}.")
    elif found["dry_run"]:
        lines.append("status: dry run (nothing was allocated, so nothing could fail)")
    elif found["pipeline_retried"]:
        lines.append("status: ok (the one failed allocation was recovered from: llama.cpp retried without the copies)")
    else:
        lines.append("status: ok (no allocation failed in this text)")
    return "\n".join(lines)


_READ_LIMIT = 256 * MiB  # far more than any log; a model file passed by mistake is refused before it is read whole


def read_text(path: str) -> str:
    """The text of a log file (or stdin for -), UTF-8 or a Windows UTF-16 one; a one-line error for a folder, a
    GGUF model, a binary file or one too large to be a log."""
    import sys

    name = "stdin" if path == "-" else path
    if path == "-":
        data = _read_checked(sys.stdin.buffer, name)
    elif Path(path).is_dir():
        raise MoeplaceError(f"{path} is a folder, not a log: pass the log file llama.cpp's output was saved to.")
    else:
        try:
            with open(path, "rb") as f:
                data = _read_checked(f, name)
        except OSError as e:
            raise MoeplaceError(f"{path}: cannot read it ({e.strerror}).") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # PowerShell's Tee-Object and > write UTF-16
        return data.decode("utf-16", errors="replace")
    if len(data) > _READ_LIMIT or b"\0" in data[: 1 << 16]:
        too = "too large to be a log" if len(data) > _READ_LIMIT else "a binary file, not a log"
        raise MoeplaceError(f"{name} is {too}: pass the text llama.cpp printed, from the load to where it stopped.")
    return data.decode("utf-8", errors="replace")


def _read_checked(stream: Any, name: str) -> bytes:
    """The stream's bytes (at most one past the limit), refusing a GGUF model from its first four."""
    head = stream.read(4)
    if head == b"GGUF":
        raise MoeplaceError(
            f"{name} is a GGUF model, not a log: run llama.cpp on it and save what it prints "
            "(e.g. llama-server -m MODEL.gguf ... 2>&1 | tee server.log), then explain server.log."
        )
    return head + stream.read(_READ_LIMIT + 1 - len(head))
