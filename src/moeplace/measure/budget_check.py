"""Stage 'budget_check': the budget's minimum --n-cpu-moe against the real one and llama-fit-params' answer.

Over a grid of contexts, ubatch sizes, KV cache types and flash attention, on the configured device:
- predicted_n: the budget's (our weights and KV, llama.cpp's compute reserve for the placement);
- measured_n: the lowest n whose load probe runs (llama-completion at the full context: load, allocate, generate
  a few tokens; what a server does before its first request), searched from the prediction;
- fit_params_n: the layers whose experts llama-fit-params, with no margin, keeps on the host (it may also keep
  whole layers there: fit_params_ngl below the layer count);
- on `depth_checks` cells per model, depth_n: the same search with the sweep's depth-filled llama-bench probe.
"""

from __future__ import annotations

import itertools
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.config import BenchSettings, Device, DeviceTarget
from ..core.records import Row
from ..model.memory import Workload
from ..model.meta import ModelMeta
from ..plan.budget import BudgetRow, plan, reserved_compute
from ..plan.devices import Attached, MultiPlan, plan_args, reserved_plan
from ..plan.offload import expert_tensors, matching_tensors
from ..runtime.allocation import fitted_placement, load_probe
from ..runtime.build import Build
from ..runtime.cpus import split_cpus
from ..runtime.device import DeviceSetup, attached, device_setup, margin_on, rpc_device
from ..runtime.llamacpp_args import UNSUPPORTED, refusal
from .bench import BenchJob, Rig, run_bench
from .tune import search


def grid(contexts: list[int], ubatches: list[int], cache_types: list[str], flash_attn: list[str]) -> list[Workload]:
    return [
        Workload(ctx, ub, fa, kv, kv)
        for ctx, ub, kv, fa in itertools.product(contexts, ubatches, cache_types, flash_attn)
    ]


def fitted_host_experts(meta: ModelMeta, ngl: int, overrides: str | None) -> set[str]:
    """The expert tensors llama-fit-params keeps on the host: those of the layers below its -ngl (llama.cpp
    offloads the last -ngl layers, the output counting as one) and those its -ot value sends there."""
    n_layer = meta.n_layer
    first_on_device = 0 if ngl < 0 else max(n_layer + 1 - ngl, 0)
    below = expert_tensors(meta, list(range(min(first_on_device, n_layer))))
    return below | matching_tensors(overrides, sorted(expert_tensors(meta, list(range(n_layer)))))


def fitted_n(meta: ModelMeta, ngl: int | None, overrides: str | None) -> int | None:
    """Layers with experts that llama-fit-params keeps on the host (it may keep part of a layer's)."""
    if ngl is None:
        return None
    host = fitted_host_experts(meta, ngl, overrides)
    return sum(1 for layer in meta.layers if host & set(layer.expert_tensors))


@dataclass(frozen=True)
class CheckedModel:
    """What every grid cell of one model's check shares: the model's name and file, its header, the llama.cpp
    build (its manifest) and the log its runs write to."""

    name: str
    path: str
    meta: ModelMeta
    manifest: Build
    log_path: Path


def check_model(
    model: CheckedModel,
    workloads: list[Workload],
    *,
    target: DeviceTarget,
    memory: Device,
    depth_checks: int = 0,
    threads: int = 2,
) -> list[Row]:
    """One row per grid cell; the deep checks' runs carry the revision of the pipeline in the working folder."""

    setup = device_setup(target, model.manifest)
    device = Device(setup.cap_bytes, margin_on(setup, model.manifest, memory))
    rows = []
    with attached(setup, model.manifest, split_cpus(setup.kind == "emulated"), model.log_path) as rpc:
        compute = reserved_compute(model.manifest, model.path, rpc, model.log_path)

        for i, w in enumerate(workloads):
            row = _cell(model, setup, w, device.kept_free)
            if refusal(w.flash_attn, w.type_v):
                rows.append({**row, "status": UNSUPPORTED})
                continue
            p = plan(model.meta, device, w, compute)
            start = model.meta.n_layer if p["n_cpu_moe"] is None else p["n_cpu_moe"]
            row |= _measured(model, p, w, start, rpc)
            if i < depth_checks and w.ubatch == 512:  # llama-bench's default batch: the sweep's own runs
                row["depth_n"] = _depth_n(model, setup, w, start, threads)
            rows.append(row)
    return rows


def _cell(model: CheckedModel, setup: DeviceSetup, w: Workload, margin_bytes: int) -> Row:
    """The columns that name a grid cell of check_model: the model, the workload and the device."""
    return {
        "model": model.name,
        "n_layer": model.meta.n_layer,
        "ctx": w.ctx,
        "ubatch": w.ubatch,
        "type_k": w.type_k,
        "flash_attn": w.flash_attn,
        "device": setup.label,
        "vram_bytes": setup.cap_bytes,
        "margin_bytes": margin_bytes,
    }


def _measured(model: CheckedModel, p: BudgetRow, w: Workload, start: int, rpc: str | None) -> Row:
    """The budget's plan `p` for one cell beside the lowest n whose load probe runs (searched from `start`) and
    llama-fit-params' own placement."""

    def probe(n: int) -> tuple[str, None]:
        return load_probe(model.manifest, model.path, w.llama_args(), n, rpc, model.log_path)[0], None

    measured = search(start, model.meta.n_layer, probe, spill_ratio=0.0)
    ngl, overrides, _ = fitted_placement(model.manifest, model.path, w.llama_args(), rpc, model.log_path)
    compute = p["compute_bytes"]
    assert compute is not None  # the plan's: llama.cpp's reserve
    return {
        "predicted_n": p["n_cpu_moe"],
        "measured_n": measured.lowest_n,
        "fit_params_n": fitted_n(model.meta, ngl, overrides),
        "fit_params_ngl": ngl,
        "load_probes": measured.loads,
        "compute_mib": compute / 2**20,
        "kv_mib": p["kv_bytes"] / 2**20,
        "status": "ok",
    }


def _depth_n(model: CheckedModel, setup: DeviceSetup, w: Workload, start: int, threads: int) -> int | None:
    """The lowest n, searched from `start`, at which the sweep's own depth-filled llama-bench probe runs."""
    settings = BenchSettings(
        prompt=0,
        gen=4,
        repetitions=1,
        threads=threads,
        timeout_s=3600,
        type_k=w.type_k,
        type_v=w.type_v,
        flash_attn=w.flash_attn,
    )

    def deep(n: int) -> tuple[str, float | None]:
        job = BenchJob(model.name, model.path, model.meta.file_records(), w.ctx, n, "budget-check")
        (r,) = run_bench(job, Rig(settings, setup, model.manifest, model.log_path, Path.cwd()))
        return r["status"], r["avg_ts"]

    return search(start, model.meta.n_layer, deep, spill_ratio=0.0).lowest_n


def check_devices(model: CheckedModel, workloads: list[Workload], caps: list[int]) -> list[Row]:
    """The plan over several devices (plan/devices.py) on emulated devices capped to `caps` (one RPC server each),
    one row per grid cell: the plan with each device's compute buffer as llama.cpp reserves it, loaded at the full
    context; each device's logged buffers beside the plan's; and `exact` where the load agrees with the plan (a
    plan that fits loads, one that does not fit runs out of memory) and the plan keeps no expert on the host that a
    device could hold: each device that leaves some of its layers' experts on the host runs out of memory with one
    more of them. A cell llama.cpp refuses (runtime/llamacpp_args.refusal) is recorded UNSUPPORTED, not run."""

    with ExitStack() as stack:
        endpoints = [
            stack.enter_context(rpc_device(model.manifest, cap, (i % 2,), model.log_path.with_suffix(f".rpc{i}.log")))
            for i, cap in enumerate(caps)
        ]
        return [_devices_cell(model, w, caps, endpoints) for w in workloads]


def _devices_cell(model: CheckedModel, w: Workload, caps: list[int], endpoints: list[str]) -> Row:
    """check_devices' row for one workload: planned, reserved and loaded on the `endpoints`, and each device that
    leaves experts on the host loaded with one more of them."""
    cell: Row = {
        "ctx": w.ctx,
        "ubatch": w.ubatch,
        "type_k": w.type_k,
        "flash_attn": w.flash_attn,
        "caps_mib": "/".join(f"{c / 2**20:.2f}" for c in caps),
    }
    if refusal(w.flash_attn, w.type_v):  # llama-fit-params would abort on it
        return {**cell, "status": UNSUPPORTED}
    devices = [Device(c, 0) for c in caps]
    at = Attached(endpoints, model.manifest, model.path, ",".join(endpoints), model.log_path)
    p = reserved_plan(model.meta, w, devices, at)
    status, buffers = _load(model, p, w, endpoints)
    one_more = _one_more(model, p, w, endpoints) if p.fits and status == "ok" else []
    logged = [sum(buffers.device(e).values()) if buffers else None for e in endpoints]
    return {
        **cell,
        "tensor_split": "/".join(map(str, p.tensor_split)),
        "host_expert_layers": len(p.host_expert_layers),
        "fits": p.fits,
        "status": status,
        "one_more": "/".join(one_more),
        "exact": (status == "ok") == p.fits and all(s != "ok" for s in one_more),
        "planned_mib": "/".join(f"{(d.weights + d.kv + d.compute) / 2**20:.2f}" for d in p.devices),
        "logged_mib": "/".join("-" if b is None else f"{b / 2**20:.2f}" for b in logged),
    }


def _load(model: CheckedModel, p: MultiPlan, w: Workload, endpoints: list[str]) -> tuple[str, Any]:
    """The load probe of plan `p` on the `endpoints`: its status and the buffers llama.cpp logged."""
    args, rule = plan_args(model.meta, p, w)
    return load_probe(
        model.manifest, model.path, args + (["-ot", rule] if rule else []), 0, ",".join(endpoints), model.log_path
    )


def _one_more(model: CheckedModel, p: MultiPlan, w: Workload, endpoints: list[str]) -> list[str]:
    """The load statuses, one per device that leaves some of its layers' experts on the host, with one more of
    them (its last) on that device."""
    statuses = []
    for d in p.devices:
        host_here = [il for il in p.host_expert_layers if d.first <= il < d.end]
        if host_here:
            kept = tuple(il for il in p.host_expert_layers if il != max(host_here))
            statuses.append(_load(model, replace(p, host_expert_layers=kept), w, endpoints)[0])
    return statuses


COLUMNS = [
    "model",
    "ctx",
    "ubatch",
    "type_k",
    "flash_attn",
    "predicted_n",
    "measured_n",
    "fit_params_n",
    "depth_n",
    "status",
    "n_layer",
    "fit_params_ngl",
    "load_probes",
    "compute_mib",
    "kv_mib",
    "vram_bytes",
    "margin_bytes",
    "device",
]


def check_table(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS).astype({c: "Int64" for c in COLUMNS[5:9]})


def summary(table: pd.DataFrame) -> dict[str, int]:
    """The bars: exact on how many cells, and never below the measured minimum (an out-of-memory answer)."""
    cells = table[table.status == "ok"]
    nothing_fits = cells.n_layer + 1  # "does not fit at any n" compares as one more than the last layer

    def n(column: str) -> pd.Series:
        return cells[column].astype("Float64").fillna(nothing_fits).astype(int)

    return {
        "cells": len(cells),
        "exact": int((n("predicted_n") == n("measured_n")).sum()),
        "below_measured": int((n("predicted_n") < n("measured_n")).sum()),
        "fit_params_exact": int((n("fit_params_n") == n("measured_n")).sum()),
        "depth_agrees": int((cells.depth_n == cells.measured_n).sum()),
        "depth_cells": int(cells.depth_n.notna().sum()),
    }


DEVICE_COLUMNS = [
    "model",
    "ctx",
    "ubatch",
    "type_k",
    "flash_attn",
    "tensor_split",
    "host_expert_layers",
    "fits",
    "status",
    "one_more",
    "exact",
    "planned_mib",
    "logged_mib",
    "caps_mib",
]


def devices_table(rows: list[Row], model: str | None = None) -> pd.DataFrame:
    """check_devices' rows (or a table of them read back) as the stage writes them; `exact` empty where the cell
    was not run (UNSUPPORTED)."""
    table = pd.DataFrame([r if model is None else {"model": model, **r} for r in rows], columns=DEVICE_COLUMNS)
    return table.astype({"exact": "boolean", "fits": "boolean", "host_expert_layers": "Int64"})


def devices_summary(table: pd.DataFrame) -> str:
    """On how many of the cells llama.cpp ran the per-device plan was exact, and how many it refuses."""
    run = table[table.status != UNSUPPORTED]
    text = f"the per-device plan exact on {int(run.exact.fillna(False).sum())} of {len(run)} cells"
    return text + (f"; {len(table) - len(run)} {UNSUPPORTED} (not run)" if len(run) < len(table) else "")
