"""A plan for several devices: which layers each holds, whose experts stay with them, and what goes to the host.

llama.cpp's layer split (-sm layer, the default) gives device i the repeating layers il with il / (L + 1) below the
i-th cumulative share of -ts; the output layer counts as layer L and lands on the last device; the input embedding
stays on the host. A layer's KV cache lives on its layer's device, and so do its experts unless an -ot rule sends
them to the host. So -ts written as layer counts (k0, k1, ..., the last one counting the output layer) places
whole layers exactly, and one -ot rule for the experts kept on the host finishes the plan: --n-cpu-moe across
devices is never used (it takes the first n layers, which are all the first device's, and leaves the last device
full). With any -ot rule llama.cpp turns pipeline parallelism off, so each device holds one compute buffer;
without one (every expert on the devices) it pipelines them, with larger buffers, and where those do not fit
retries without.

Each device keeps its margin free; its compute buffer is the single-device estimate or llama.cpp's own reserve.
The estimate is not a bound per device: on two emulated devices (60/40 MB, the tiny twins, 2026-12-04) llama.cpp
allocated 6-9 MiB more than it at ubatch 256 and 4K, and 1-9 MiB less at ubatch 512.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.config import Device
from ..model.kvcache import layer_kv_bytes
from ..model.memory import Workload, estimate_compute, minimum_n
from ..model.meta import Layer, ModelMeta
from ..runtime.allocation import reserve
from ..runtime.build import Build
from .offload import expert_tensors, ot_value

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class DevicePlan:
    """One device's share: its repeating layers [first, end), the layers whose experts it holds, its buffers."""

    index: int
    vram_bytes: int
    margin_bytes: int
    first: int
    end: int
    expert_layers: tuple[int, ...]
    weights: int
    kv: int
    compute: int
    output: bool  # holds the output layer (the last device)

    @property
    def free_bytes(self) -> int:
        return self.vram_bytes - self.margin_bytes - self.weights - self.kv - self.compute


@dataclass(frozen=True)
class MultiPlan:
    devices: tuple[DevicePlan, ...]
    host_expert_layers: tuple[int, ...]

    @property
    def tensor_split(self) -> tuple[int, ...]:
        """-ts as layer counts: each device's repeating layers, the last one's plus the output layer."""
        return tuple(d.end - d.first + (1 if d.output else 0) for d in self.devices)

    @property
    def fits(self) -> bool:
        return all(d.free_bytes >= 0 for d in self.devices)

    @property
    def device_hops(self) -> int:
        """Card boundaries a token crosses: the cards holding layers, less one."""
        return max(sum(1 for d in self.devices if d.end > d.first) - 1, 0)

    def host_tensors(self, meta: ModelMeta) -> set[str]:
        return expert_tensors(meta, list(self.host_expert_layers))

    def host_rule(self, meta: ModelMeta, separator: str = ",") -> str:
        """The -ot value that keeps the host's experts there (empty: none)."""
        return ot_value(self.host_tensors(meta), separator)


def _non_expert(layer: Layer) -> int:
    return sum(b for role, b in layer.bytes.items() if role != "expert")


def _output_bytes(meta: ModelMeta) -> int:
    """The output layer's weights on its device: the output matrix (a tied one is a device copy of the input
    embedding) and its norm."""
    g = meta.global_bytes
    return (g.get("output", 0) or g.get("token_embd", 0)) + g.get("output_norm", 0)


def device_share(
    meta: ModelMeta,
    w: Workload,
    index: int,
    device: Device,
    span: range,
    output: bool,
    compute: int,
    host_layers: frozenset[int] | None = None,
) -> DevicePlan:
    """Device `index` holding the layers in `span` (and the output layer if `output`), keeping the experts of as many
    of its last layers as fit beside its other buffers and margin, or, given `host_layers`, of every layer not in it."""
    layers = meta.layers[span.start : span.stop]
    kv_per_layer = layer_kv_bytes(meta, w.ctx, w.type_k, w.type_v, w.ubatch)[span.start : span.stop]
    kv = (sum(kv_per_layer) + sum(layer.state_bytes for layer in layers)) * w.parallel
    weights = sum(_non_expert(layer) for layer in layers) + (_output_bytes(meta) if output else 0)
    room = device.vram_bytes - device.kept_free - weights - kv - compute
    kept: list[int] = []
    for layer in reversed(layers):  # the last layers' experts stay: the host rule is then one range per device
        if host_layers is not None:
            if layer.index not in host_layers:
                kept.append(layer.index)
            continue
        if layer.bytes["expert"] > room:
            break
        room -= layer.bytes["expert"]
        kept.append(layer.index)
    weights += sum(meta.layers[il].bytes["expert"] for il in kept)
    return DevicePlan(
        index,
        device.vram_bytes,
        device.kept_free,
        span.start,
        span.stop,
        tuple(sorted(kept)),
        weights,
        kv,
        compute,
        output,
    )


def _split(
    meta: ModelMeta,
    w: Workload,
    devices: list[Device],
    bounds: list[int],
    compute: Callable[[int], int],
    host_layers: frozenset[int] | None = None,
) -> MultiPlan:
    edges = [0, *bounds, meta.n_layer]
    last = len(devices) - 1
    shares = tuple(
        device_share(meta, w, i, d, range(edges[i], edges[i + 1]), i == last, compute(i), host_layers)
        for i, d in enumerate(devices)
    )
    resident = {il for d in shares for il in d.expert_layers}
    return MultiPlan(shares, tuple(il for il in range(meta.n_layer) if il not in resident))


def _score(plan: MultiPlan) -> tuple[bool, int]:
    """Every device within its memory first, then the most expert bytes on the devices."""
    return plan.fits, sum(d.weights for d in plan.devices)


def plan_devices(
    meta: ModelMeta, devices: list[Device], w: Workload, compute: Callable[[int], int] | None = None
) -> MultiPlan:
    """The layer split over `devices` (in llama.cpp's device order) that fits each and keeps the most expert bytes
    on them: from a split proportional to each device's memory, each boundary moved while that gains (a coordinate
    search; layers alike make the gain flat once every device's room is used). `compute(i)` is device i's compute
    buffer, else the single-device estimate. A plan where some device does not fit even with all its experts on
    the host has that device's free_bytes negative."""
    n_layer = meta.n_layer
    compute = compute or (lambda i: estimate_compute(meta, w, n_layer))
    total = sum(d.vram_bytes for d in devices)
    bounds, acc = [], 0
    for d in devices[:-1]:
        acc += d.vram_bytes
        bounds.append(round(n_layer * acc / total))
    best = _split(meta, w, devices, bounds, compute)
    improved = True
    while improved:
        improved = False
        for i in range(len(bounds)):
            lo = bounds[i - 1] if i else 0
            hi = bounds[i + 1] if i + 1 < len(bounds) else n_layer
            for b in range(lo, hi + 1):
                trial = _split(meta, w, devices, bounds[:i] + [b] + bounds[i + 1 :], compute)
                if _score(trial) > _score(best):
                    best, bounds, improved = trial, bounds[:i] + [b] + bounds[i + 1 :], True
    return best


# Each device's compute buffer as llama.cpp reserves it for a plan, the devices pipelined or not.
Reserve = Callable[[MultiPlan, bool], tuple[int, ...]]


def plan_devices_reserved(
    meta: ModelMeta, devices: list[Device], w: Workload, reserve: Reserve, tries: int = 6
) -> MultiPlan:
    """plan_devices checked against llama.cpp's reserve (`reserve(plan, pipelined)`: each device's compute buffer for
    exactly that plan, in device order): a candidate counts when it fits beside the buffers reserved for it, and
    the next one is planned with those buffers, until a candidate repeats. The buffers follow the split and which
    experts stay on the host (each -ot rule splits the graph), so they are checked per candidate, never carried
    from another. The counted candidate with the most expert bytes on the devices wins; with none, the last one
    checked, not fitting.

    With no -ot rule llama.cpp pipelines the devices, with larger compute buffers (25 MiB against 9 on the tiny
    qwen3moe twin at 4K without flash attention), and where those do not fit it retries without: a plan that
    keeps every expert on the devices fits when the unpipelined buffers do, and holds the pipelined ones where
    they fit too."""

    def checked(candidate: MultiPlan, pipelined: bool = False) -> MultiPlan:
        compute = reserve(candidate, pipelined)
        return MultiPlan(
            tuple(replace(d, compute=c) for d, c in zip(candidate.devices, compute)), candidate.host_expert_layers
        )

    candidate, counted = plan_devices(meta, devices, w), []
    for _ in range(tries):
        plan = checked(candidate)
        counted += [plan] if plan.fits else []
        following = plan_devices(meta, devices, w, [d.compute for d in plan.devices].__getitem__)
        if (following.tensor_split, following.host_expert_layers) == (plan.tensor_split, plan.host_expert_layers):
            break
        candidate = following
    best = max(counted, key=_score) if counted else plan
    if best.fits and not best.host_expert_layers and (pipelined := checked(best, pipelined=True)).fits:
        return pipelined
    return best


def default_split(n_layer: int, free: list[int]) -> list[int]:
    """Where each device after the first begins under llama.cpp's own layer split, with no -ts (llama-model.cpp,
    load_tensors): shares by each device's free memory as it reports it (an emulated device: its cap), summed and
    normalised in float32; layer il, the output layer counted as n_layer, goes to the first device whose share
    exceeds il / (n_layer + 1)."""

    splits = np.cumsum(np.asarray(free, dtype=np.float32), dtype=np.float32)
    splits /= splits[-1]
    device = [
        int(np.searchsorted(splits, np.float32(il) / np.float32(n_layer + 1), side="right")) for il in range(n_layer)
    ]
    return [sum(1 for d in device if d <= i) for i in range(len(free) - 1)]


def ncmoe_plan(
    meta: ModelMeta, devices: list[Device], w: Workload, n: int, compute: Callable[[int], int] | None = None
) -> MultiPlan:
    """--n-cpu-moe n over `devices` as llama.cpp runs it with no -ts: its own split, the first n layers' experts on
    the host (all on the first devices), every other layer's with its layer. `compute(i)` as in plan_devices."""
    compute = compute or (lambda i: estimate_compute(meta, w, meta.n_layer))
    bounds = default_split(meta.n_layer, [d.vram_bytes for d in devices])
    return _split(meta, w, devices, bounds, compute, frozenset(range(n)))


def minimum_ncmoe(
    meta: ModelMeta,
    devices: list[Device],
    w: Workload,
    compute_at: Callable[[int], Callable[[int], int]] | None = None,
) -> tuple[int | None, MultiPlan]:
    """The lowest --n-cpu-moe that fits every device under llama.cpp's own split (None: none), and its plan (with
    every layer's experts on the host where none fits); `compute_at(n)` is each device's compute buffer at n."""

    def at(n: int) -> MultiPlan:
        return ncmoe_plan(meta, devices, w, n, compute_at(n) if compute_at else None)

    n = minimum_n(meta, lambda k: at(k).fits)
    return n, at(meta.n_layer if n is None else n)


# With no -ot rule llama.cpp pipelines several devices; an -ot rule that matches no tensor turns that off, so a
# plan that keeps every expert on the devices is reserved as it loads where the pipelined buffers do not fit.
UNPIPELINED = "^no-tensor$=CPU"


def plan_args(meta: ModelMeta, p: MultiPlan, w: Workload) -> tuple[list[str], str | None]:
    """A plan over several devices as llama.cpp's arguments (the workload's, -ts) and its -ot value (None: none)."""
    return [*w.llama_args(), "-ts", ",".join(map(str, p.tensor_split))], p.host_rule(meta) or None


@dataclass(frozen=True)
class Attached:
    """Devices attached for llama.cpp to reserve buffers on: its `names` for them (RPC endpoints, or CUDA0, ...),
    the build (`manifest`), the model file, the RPC endpoints to pass (None: local devices) and the log."""

    names: list[str]
    manifest: Build
    model_path: str
    rpc: str | None
    log_path: Path

    def reserve(self, args: list[str], n_cpu_moe: int, overrides: str | None) -> Any:
        return reserve(self.manifest, self.model_path, args, n_cpu_moe, self.rpc, self.log_path, overrides)


def reserved_plan(meta: ModelMeta, w: Workload, devices: list[Device], at: Attached) -> MultiPlan:
    """The plan over the attached `devices` (llama.cpp's `names` for them: RPC endpoints or CUDA0, ...), each
    candidate's compute buffers reserved by llama.cpp for exactly that candidate (plan_devices_reserved)."""

    def reserved(p: MultiPlan, pipelined: bool) -> tuple[int, ...]:
        args, rule = plan_args(meta, p, w)
        buffers = at.reserve(args, 0, rule or (None if pipelined else UNPIPELINED))
        return tuple(buffers.device(name).get("compute", 0) for name in at.names)

    return plan_devices_reserved(meta, devices, w, reserved)


def reserved_ncmoe(meta: ModelMeta, w: Workload, devices: list[Device], at: Attached) -> tuple[int | None, MultiPlan]:
    """minimum_ncmoe on the attached `devices`, each candidate n's compute buffers reserved by llama.cpp (at n = 0
    unpipelined: llama.cpp falls back to that where the pipelined buffers do not fit)."""

    def compute_at(n: int) -> Callable[[int], int]:
        buffers = at.reserve(w.llama_args(), n, None if n else UNPIPELINED)
        return lambda i: buffers.device(at.names[i]).get("compute", 0)

    return minimum_ncmoe(meta, devices, w, compute_at)
