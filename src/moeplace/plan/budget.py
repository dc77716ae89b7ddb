"""Stage 'budget': the smallest --n-cpu-moe that fits the device at each context (seed 000 §5.4), to the byte.

The device must hold what llama.cpp allocates there (memory.py): the weights it keeps on the device, the KV
cache, the compute buffer (llama.cpp's own reserve for this placement when a build is at hand, else our
estimate), a vision projector if any, and the margin the user keeps free. --n-cpu-moe moves the first n
layers' experts to the host; the answer is the smallest n that fits. The seed's constants mode has no
tensors: there, as in the seed, a fixed overhead stands in for the compute buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..core.backends import op_offload
from ..core.config import Device, DeviceTarget
from ..core.errors import MoeplaceError
from ..core.units import GB
from ..model.draft import DraftRequest, Speculative, draft_need
from ..model.kvcache import kv_bytes, pad
from ..model.memory import (
    NO_PINS,
    DeviceNeed,
    Pins,
    Workload,
    device_need,
    host_bytes,
    host_kept_bytes,
    host_layer_count,
    minimum_n,
)
from ..model.meta import Model, ModelMeta, SeedModel, is_seed
from ..runtime.allocation import reserve
from ..runtime.build import Build
from ..runtime.cpus import split_cpus
from ..runtime.device import attached, device_setup, margin_on, planned_backend
from .unified import Pool, PoolFit

if TYPE_CHECKING:
    import pandas as pd

FITS = "ok"
DOES_NOT_FIT = "does_not_fit"

# compute(workload, n_cpu_moe) -> the device compute buffer's bytes; None: our estimate.
Compute = Callable[[Workload, int], int] | None
# draft_compute(workload) -> a draft model's device compute buffer (llama.cpp's reserve); None: the estimate.
DraftCompute = Callable[[Workload], int] | None


@dataclass(frozen=True)
class Beside:
    """What shares the device with the model beyond its own buffers and a projector: a speculative draft (with
    llama.cpp's reserve of a draft model's compute, where known), and on unified memory the pool the device is."""

    spec: Speculative | None = None
    pool: Pool | None = None
    draft_compute: DraftCompute = None

    def asked(self, draft: DraftRequest, pool: Pool | None = None) -> Beside:
        """This with the draft as a request has it (none, or its n_max and KV types), and on another pool."""
        spec = self.spec if draft.asked else None
        spec = spec and replace(spec, n_max=draft.n_max, type_k=draft.type_k, type_v=draft.type_v)
        return replace(self, spec=spec, pool=pool or self.pool)

    def spec_args(self, draft_path: str | None) -> tuple[str, ...]:
        """The speculative decoding flags of every llama-server line (none without a draft)."""
        return tuple(self.spec.llama_args(draft_path)) if self.spec else ()


NOTHING_BESIDE = Beside()


class BudgetRow(TypedDict, total=False):
    """One workload's budget: a row of results/budget/*.csv before its GB columns (recommend's JSON adds to it)."""

    ctx: int
    cells: int
    ubatch: int
    flash_attn: str
    parallel: int
    cache_type_k: str
    cache_type_v: str
    kv_bytes: int
    weights_bytes: int | None  # None: the seed's constants, which have no tensors
    compute_bytes: int | None
    compute_source: str  # llama.cpp (its own reserve), estimate, or overhead (the seed's constants)
    extra_bytes: int
    budget_bytes: int  # the room left for experts at n_cpu_moe (negative: short by that much)
    n_cpu_moe: int | None  # None: nothing fits, even with every expert on the host
    margin_bytes: int
    resident_layers: int
    status: str
    # speculative decoding (model/draft.py): its kind and the draft context's buffers (for draft-mtp the weights are
    # the MTP head's, in the main model's buffer)
    spec_type: str
    draft_weights_bytes: int
    draft_kv_bytes: int
    draft_compute_bytes: int
    # unified memory (unified.py): the pool's RAM and what the plan takes of it in all (device, host side, OS)
    pool_ram_bytes: int
    pool_used_bytes: int


def resident_layers(meta: Model, budget_bytes: float) -> int:
    """How many of the last layers keep their experts on the device within the budget."""
    used, resident = 0.0, 0
    for layer in reversed(meta.layers):
        used += layer.expert_bytes
        if used > budget_bytes:
            break
        resident += 1
    return resident


def _constants_plan(meta: SeedModel, device: Device, w: Workload) -> BudgetRow:
    kv = kv_bytes(meta, w.ctx, w.type_k, w.type_v) * w.parallel
    budget = device.vram_bytes - meta.non_expert_bytes - kv - device.kept_free
    fits = budget >= 0
    resident = resident_layers(meta, budget) if fits else 0
    return {
        "kv_bytes": kv,
        "budget_bytes": budget,
        "weights_bytes": None,
        "compute_bytes": None,
        "compute_source": "overhead",
        "n_cpu_moe": meta.n_layer - resident if fits else None,
    }


def plan(
    meta: Model,
    device: Device,
    w: Workload,
    compute: Compute = None,
    extra_bytes: int = 0,
    pins: Pins = NO_PINS,
    beside: Beside = NOTHING_BESIDE,
) -> BudgetRow:
    """One workload's budget: each device buffer at the minimum n_cpu_moe (at n = all layers where nothing
    fits), the room left for experts, and that n, with the user's -ot pins applied before --n-cpu-moe; with a draft
    `beside` it, the draft's context beside the main one (the main's workload as drafting changes it); with a
    unified-memory pool, `device` is its GPU cap and the whole plan must also fit the RAM (else nothing fits)."""
    row: BudgetRow = {
        "ctx": w.ctx,
        "cells": pad(w.ctx) * w.parallel,
        "ubatch": w.ubatch,
        "flash_attn": w.flash_attn,
        "parallel": w.parallel,
        "cache_type_k": w.type_k,
        "cache_type_v": w.type_v,
    }
    if is_seed(meta):
        row |= _constants_plan(meta, device, w)
    else:
        spec = beside.spec
        needs: dict[int, DeviceNeed] = {}
        main = spec.main(meta, w) if spec else w

        def need(n: int) -> DeviceNeed:
            if n not in needs:
                needs[n] = device_need(meta, main, n, compute and (lambda k: compute(main, k)), extra_bytes, pins)
                if spec:
                    needs[n] = replace(needs[n], draft=draft_need(spec, meta, w, n, beside.draft_compute).total)
            return needs[n]

        n = minimum_n(meta, lambda k: need(k).total + device.kept_free <= device.vram_bytes)
        shown_n = meta.n_layer if n is None else n
        shown = need(shown_n)
        resident_experts = meta.expert_bytes - (meta.total_bytes - host_kept_bytes(meta) - shown.weights)
        row |= {
            "kv_bytes": shown.kv,
            "weights_bytes": shown.weights,
            "compute_bytes": shown.compute,
            "compute_source": "llama.cpp" if compute else "estimate",
            "extra_bytes": shown.extra,
            "budget_bytes": device.vram_bytes - device.kept_free - (shown.total - resident_experts),
            "n_cpu_moe": n,
        }
        row |= _beside_row(meta, w, beside, shown, shown_n, pins, device.kept_free)
    row["margin_bytes"] = device.kept_free
    fitted = row["n_cpu_moe"]
    if fitted is None:
        row["resident_layers"] = 0
    elif is_seed(meta):  # the seed's constants: no tensors, no pins
        row["resident_layers"] = meta.n_layer - fitted
    else:  # layers with every expert on the device, after the pins
        row["resident_layers"] = meta.n_layer - host_layer_count(meta, pins.host_set(meta, fitted))
    row["status"] = FITS if fitted is not None else DOES_NOT_FIT
    return row


def _beside_row(
    meta: ModelMeta, w: Workload, beside: Beside, need: DeviceNeed, n: int, pins: Pins, margin: int
) -> BudgetRow:
    """The plan's draft buffers at --n-cpu-moe n, and on unified memory what it takes of the pool in all: its device
    buffers and margin, and the weights on the CPU side; nothing fits where the RAM is short."""
    row: BudgetRow = {}
    if spec := beside.spec:
        d = draft_need(spec, meta, w, n, beside.draft_compute)
        row |= {"spec_type": spec.kind, "draft_weights_bytes": d.weights, "draft_kv_bytes": d.kv}
        row["draft_compute_bytes"] = d.compute
    if pool := beside.pool:
        fit = PoolFit(need.total + margin, host_bytes(meta, pins.host_set(meta, n)), pool)
        row |= {"pool_ram_bytes": pool.ram_bytes, "pool_used_bytes": fit.total}
        if fit.short_bytes > 0:
            row["n_cpu_moe"] = None
    return row


def beside_text(p: BudgetRow) -> list[str]:
    """The plan's draft buffers and, on unified memory, what it takes of the RAM, as lines (none without them)."""
    lines = []
    if "spec_type" in p:
        weights, kv, compute = p["draft_weights_bytes"], p["draft_kv_bytes"], p["draft_compute_bytes"]
        lines.append(
            f"draft ({p['spec_type']}): {(weights + kv + compute) / GB:.2f} GB on the card: weights {weights / GB:.2f},"
            f" KV {kv / GB:.2f}, compute {compute / GB:.2f} GB (the speeds below are the model's without drafting)"
        )
    if "pool_used_bytes" in p:
        lines.append(
            f"unified memory: {p['pool_used_bytes'] / GB:.2f} GB of its {p['pool_ram_bytes'] / GB:.2f} GB in all"
        )
    return lines


def does_not_fit_message(p: BudgetRow, vram_bytes: int) -> str:
    """One line: which buffers leave no room even with every expert on the host; then (recommend) the fixes."""
    if p.get("pool_used_bytes", 0) > p.get("pool_ram_bytes", 2**63):
        used, ram = p["pool_used_bytes"], p["pool_ram_bytes"]
        return (
            f"context {p['ctx']} does not fit: on unified memory the GPU and the CPU share the {ram / 2**30:.1f} GiB, "
            f"and the plan needs {used / 2**30:.1f} GiB of it in all (weights, KV cache, compute buffers and what the "
            f"OS keeps), {(used - ram) / GB:.2f} GB more than there is: experts on the CPU do not help; what would fit:"
        )
    parts = f"its KV cache ({p['kv_bytes'] / GB:.2f} GB)"
    if (compute := p.get("compute_bytes")) is not None:
        parts += f", compute buffer ({compute / GB:.2f} GB)"
    advice = "reduce the context or quantize the KV cache." if p["compute_source"] == "overhead" else "what would fit:"
    return (
        f"context {p['ctx']} does not fit in {vram_bytes / GB:.2f} GB even with every expert on the host: {parts} "
        f"plus the non-expert weights and margin exceed the card by {-p['budget_bytes'] / GB:.2f} GB; {advice}"
    )


@dataclass(frozen=True)
class StageDevice:
    """What the budget stage plans on: the device (its cap and margin), its backend, and llama.cpp's own compute
    reserve there (None: the estimate)."""

    device: Device
    backend: str
    compute: Compute

    def workload(self, ctx: int, ubatch: int, flash_attn: str, type_k: str, type_v: str) -> Workload:
        """What the sweep's llama-bench asks of the device at `ctx`: logits for a whole batch, one sequence, and
        on a backend that copies host experts for a large batch, their copy (as recommend's --emit bench)."""
        return Workload(ctx, ubatch, flash_attn, type_k, type_v, outputs="batch", op_offload=op_offload(self.backend))


@contextmanager
def compute_from_llamacpp(
    model_path: str | None,
    manifest: Build | None,
    target: DeviceTarget,
    memory: Device,
    log_path: Path,
) -> Iterator[StageDevice]:
    """The device to plan for (device.vram auto: the GPU's free memory now) and llama.cpp's own compute reserve
    on it, the emulated device started for the duration. The seed's constants have no file: no reserve."""
    if model_path is None or manifest is None:
        if memory.vram_bytes is None:
            raise MoeplaceError("device.vram is auto, which needs a model file and a GPU; give the card's size.")
        # No device to ask: the seed's constants plan for no backend, and auto keeps nothing beyond its overhead.
        yield StageDevice(memory.for_backend("rpc"), "", None)
        return

    setup = device_setup(target, manifest)
    with attached(setup, manifest, split_cpus(setup.kind == "emulated"), log_path) as rpc:
        device = Device(setup.cap_bytes, margin_on(setup, manifest, memory))
        compute = reserved_compute(manifest, model_path, rpc, log_path)
        yield StageDevice(device, planned_backend(setup, manifest), compute)


def reserved_compute(
    manifest: Build, model_path: str, rpc: str | None, log_path: Path, pins: str | None = None
) -> Compute:
    """The device compute buffer as llama.cpp reserves it for a workload and placement (the user's -ot `pins`
    first), on the attached device."""

    def compute(w: Workload, n_cpu_moe: int) -> int:
        buffers = reserve(manifest, model_path, w.llama_args(), n_cpu_moe, rpc, log_path, pins)
        device = buffers.only_device()
        if "compute" not in device:
            raise MoeplaceError(
                f"llama-fit-params logged no compute buffer on the device for {model_path} at "
                f"--n-cpu-moe {n_cpu_moe}; see {log_path}."
            )
        return device["compute"]

    return compute


COLUMNS = [
    "ctx",
    "cells",
    "kv_gb",
    "compute_gb",
    "budget_gb",
    "resident_layers",
    "n_cpu_moe",
    "status",
    "kv_bytes",
    "weights_bytes",
    "compute_bytes",
    "compute_source",
    "margin_bytes",
    "budget_bytes",
    "ubatch",
    "flash_attn",
    "cache_type_k",
    "cache_type_v",
]


def budget_table(meta: Model, device: Device, workloads: list[Workload], compute: Compute = None) -> pd.DataFrame:
    """Memory only (speeds are the predict stage's): a new bandwidth never reruns what depends on the budget."""
    return budget_frame([plan(meta, device, w, compute) for w in workloads])


def budget_frame(rows: Sequence[BudgetRow], extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """The budget table of these rows: COLUMNS, their sizes also in GB, then the `extra` columns."""
    import pandas as pd  # here, not at the top: recommend's start-up would pay half a second for a table it never makes

    table = [
        {
            **p,
            "kv_gb": p["kv_bytes"] / GB,
            "compute_gb": p["compute_bytes"] / GB if p["compute_bytes"] is not None else None,
            "budget_gb": p["budget_bytes"] / GB,
        }
        for p in rows
    ]
    return pd.DataFrame(table, columns=COLUMNS + list(extra)).astype({"n_cpu_moe": "Int64"})
