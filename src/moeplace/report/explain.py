"""`moeplace explain LOG`: what a pasted llama.cpp log says went where (per device: weights, KV, compute; the
host's share; how many layers' experts stayed in RAM), why it ran out of memory if it did, and the `recommend`
line that plans that card."""

from __future__ import annotations

import re
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


def _mib(kinds: dict[str, int]) -> dict[str, float]:
    mib = {kind: round(size / MiB, 2) for kind, size in kinds.items()}
    return mib | {"total": round(sum(kinds.values()) / MiB, 2)}


def experts_on_host(report: LogReport) -> dict[str, Any] | None:
    """The routed-expert tensors the log shows overridden to a host buffer, and their layers (None: the log has
    no override lines; llama.cpp logs them with -v)."""
    if not report.overridden:
        return None
    host = [name for name, buffer in report.overridden.items() if is_host(buffer) and _EXPERT.match(name)]
    layers = sorted({int(_EXPERT.match(name)[1]) for name in host})
    return {"tensors": len(host), "layers": len(layers), "layer_list": layers}


def card_memory(report: LogReport, device: str) -> int | None:
    """What the log says the device had: its free memory at load, else its total."""
    return report.free_at_load.get(device) or report.card_memory.get(device)


def _why(report: LogReport) -> str | None:
    oom = report.oom
    if oom is None:
        return None
    asked = f" ({oom.requested_bytes / MiB:,.2f} MiB asked)" if oom.requested_bytes else ""
    where = oom.device or "the device"
    held = report.buffers.devices.get(oom.device or "", {})
    before = f" after {sum(held.values()) / MiB:,.0f} MiB already placed there" if held else ""
    free = report.free_at_load.get(oom.device or "")
    total = report.card_memory.get(oom.device or "")
    had = (
        f"; it had {free / MiB:,.0f} MiB free at load" if free else f"; it has {total / MiB:,.0f} MiB" if total else ""
    )
    return f"{where} ran out of memory while {_STAGE_WORDS[oom.stage]}{asked}{before}{had}."


def _fix(report: LogReport) -> str:
    """The recommend line for this model, card and context (placeholders where the log does not say)."""
    model = report.model_path or "MODEL.gguf"
    device = (report.oom and report.oom.device) or next(iter(report.buffers.devices), None)
    free = card_memory(report, device or "")
    vram = f"{free // MiB}MiB" if free else "YOUR_CARD_MEMORY"
    args = ["moeplace", "recommend", model, "--vram", vram, "--ctx", str(report.n_ctx or "CONTEXT")]
    if report.backend in _RECOMMEND_BACKEND:
        args += ["--backend", _RECOMMEND_BACKEND[report.backend]]
    return " ".join(args)


def explain(text: str, source: str = "the text") -> dict[str, Any]:
    """The log's account as JSON-ready values (MiB); a one-line error for text that is not llama.cpp's."""
    report = read_log(text)
    records = read_bench(text) if "|" in text or text.lstrip().startswith(("[", "{", "build_commit")) else []
    if records and not report.loads and not report.oom:
        return {"kind": "llama-bench results", "gpus": report.gpus, "records": records}
    if not report.is_llamacpp():
        raise MoeplaceError(
            f"{source} is not a llama.cpp log: it has no buffer, device, override or out-of-memory line. Paste "
            "llama-server's or llama-cli's output from its start (with -v for each tensor's buffer)."
        )
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
        "experts_on_host": experts_on_host(report),
        "offloaded_layers": list(report.offloaded) if report.offloaded else None,
        "n_ctx": report.n_ctx,
        "n_layer": report.n_layer,
        "pipeline_parallel": report.pipeline_parallel,
        "pipeline_copies": report.pipeline_copies,
        "model": report.model_path,
        "breakdown": report.breakdown,
        "status": report.status,
        "oom": None,
        "fix": None,
    }
    if report.oom:
        oom = report.oom
        requested = round(oom.requested_bytes / MiB, 2) if oom.requested_bytes else None
        out["oom"] = {"stage": oom.stage, "device": oom.device, "requested_mib": requested, "line": oom.line,
                      "why": _why(report)}  # fmt: skip
        out["fix"] = _fix(report)
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
        lines.append(f"experts in host RAM: {experts['tensors']} tensors in {experts['layers']} layers")
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
        lines.append(f"pipeline parallelism: on ({copies} copies of the compute buffers per device)")
    if found["status"] == "oom":
        lines.append(f"out of memory: {found['oom']['why']}")
        lines.append(f"  the line: {found['oom']['line']}")
        lines.append(f"  plan it: {found['fix']}")
    else:
        lines.append("status: ok (no allocation failed in this text)")
    return "\n".join(lines)


def read_text(path: str) -> str:
    import sys

    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(errors="replace")
    except OSError as e:
        raise MoeplaceError(f"{path}: cannot read it ({e.strerror}).") from None
