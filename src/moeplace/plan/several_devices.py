"""`recommend` over several devices (--vram A,B,... or --vram auto on a machine with several cards): per context
the plan over them (plan/devices.py), each device's share in words or JSON, its expected speeds and its line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from ..core.backends import device_name
from ..core.config import Device
from ..core.records import JsonObject
from ..model.memory import Workload, host_bytes
from ..model.meta import ModelMeta
from . import commands
from .assumed import Expected
from .devices import MultiPlan, plan_devices
from .request import Request


def _layers_text(layers: tuple[int, ...] | list[int]) -> str:
    """0-4, 7, 9-11."""
    runs: list[list[int]] = []
    for il in sorted(layers):
        if runs and il == runs[-1][1] + 1:
            runs[-1][1] = il
        else:
            runs.append([il, il])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs) or "none"


def describe(meta: ModelMeta, plan: MultiPlan, backend: str) -> list[str]:
    """Per device what it holds, in MiB, and what stays on the host: the lines recommend prints."""
    mib = 2**20
    lines = []
    for d in plan.devices:
        name = device_name(backend, d.index)
        layers = f"layers {d.first}-{d.end - 1}" if d.end > d.first else "no layers"
        buffers = ", ".join(
            f"{what} {size / mib:.0f} MiB"
            for what, size in (
                ("weights", d.weights),
                ("KV", d.kv),
                ("compute", d.compute),
                ("margin", d.margin_bytes),
                ("free", d.free_bytes),
            )
        )
        size = f"{d.vram_bytes / 2**30:.1f} GiB" if d.vram_bytes >= 2**30 else f"{d.vram_bytes / mib:.0f} MiB"
        lines.append(
            f"{name} ({size}): {layers}{' and the output' if d.output else ''}, "
            f"the experts of {_layers_text(d.expert_layers)}; {buffers}"
        )
    lines.append(
        f"host: the experts of {_layers_text(plan.host_expert_layers)} "
        f"({host_bytes(meta, plan.host_tensors(meta)) / mib:.0f} MiB with the input embedding)"
    )
    return lines


class DevicesPlanJson(TypedDict):
    """A plan over several devices as --json prints it."""

    ctx: int
    fits: bool
    tensor_split: list[int]
    override_tensor: str | None
    devices: list[JsonObject]  # each device's buffers (plan/devices.DevicePlan's fields) and free bytes
    host_expert_layers: list[int]
    host_bytes: int
    speed: NotRequired[Expected | None]  # where it fits
    command: NotRequired[str]


def plan_json(meta: ModelMeta, plan: MultiPlan, w: Workload) -> DevicesPlanJson:
    return {
        "ctx": w.ctx,
        "fits": plan.fits,
        "tensor_split": list(plan.tensor_split),
        "override_tensor": plan.host_rule(meta),
        "devices": [{**d.__dict__, "free_bytes": d.free_bytes} for d in plan.devices],
        "host_expert_layers": list(plan.host_expert_layers),
        "host_bytes": host_bytes(meta, plan.host_tensors(meta)),
    }


# A plan's expected speeds (assumed.expected) and the line that says them, for its host experts, workload and hops.
Speed = Callable[[frozenset[str], Workload, int], tuple[Expected, str]]


@dataclass(frozen=True)
class SplitContext:
    """One context's plan over several devices: its JSON, and in words each device's share, the expected speeds
    and why it does not fit (None: it fits)."""

    plan: DevicesPlanJson
    shares: tuple[str, ...]
    speed_text: str
    error: str | None


def several_devices(
    request: Request,
    meta: ModelMeta,
    sizes: list[int],
    backend: str,
    margin_bytes: int,
    path: str,
    speed: Speed,
) -> list[SplitContext]:
    """recommend on several devices (--vram A,B,... or auto on a machine with several cards): per context the plan
    over them in llama.cpp's order, each device's share, its expected speeds and the command line (`path`: the
    file llama.cpp loads)."""
    devices = [Device(size, margin_bytes) for size in sizes]
    contexts = []
    for ctx in request.contexts:
        w = request.workload(ctx, backend)
        p = plan_devices(meta, devices, w)
        expected, said = speed(frozenset(p.host_tensors(meta)), w, p.device_hops) if p.fits else (None, "")
        flags = commands.request_flags(meta, ctx, None, False, request.tool)
        row = plan_json(meta, p, w)
        row["speed"] = expected
        if not p.fits:
            short = ", ".join(
                f"device {d.index} by {-d.free_bytes / 2**20:.0f} MiB" for d in p.devices if d.free_bytes < 0
            )
            error = (
                f"context {ctx} does not fit on these devices even with every expert on the host ({short}); "
                "reduce the context or quantize the KV cache."
            )
            contexts.append(SplitContext(row, (), "", error))
            continue
        rule = p.host_rule(meta, ";" if request.tool == "bench" else ",")
        if request.tool == "bench":
            line = commands.llama_bench(path, ctx, 0, request.cache(), [rule] if rule else None, p.tensor_split, flags)
        else:
            line = commands.llama_server_split(path, ctx, p.tensor_split, rule, request.cache(), flags)
        row["command"] = line
        contexts.append(SplitContext(row, tuple(describe(meta, p, backend)), said, None))
    return contexts
