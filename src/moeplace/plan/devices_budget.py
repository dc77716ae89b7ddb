"""The budget stage over several devices (device.vram a list): per context the lowest --n-cpu-moe under llama.cpp's
own split, and beside it moeplace's per-device plan (plan/devices.py), each compute buffer as llama.cpp reserves it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.config import Device, DeviceTarget
from ..core.errors import MoeplaceError
from ..model.kvcache import pad
from ..model.memory import Workload
from ..model.meta import ModelMeta
from ..runtime.build import Build
from ..runtime.cpus import split_cpus
from ..runtime.device import attached, device_setup, margin_on
from .budget import DOES_NOT_FIT, FITS, BudgetRow, budget_frame
from .devices import Attached, MultiPlan, reserved_ncmoe, reserved_plan


class DevicesBudgetRow(BudgetRow, total=False):
    """A budget row over several devices: beside llama.cpp's split at n_cpu_moe, moeplace's per-device plan."""

    devices_mib: str  # each device's size, "/"-separated
    ncmoe_free_mib: str
    device_plan_fits: bool
    tensor_split: str
    device_plan_override: str
    device_plan_host_layers: str


# The columns a budget table over several devices adds, in this order.
DEVICE_COLUMNS = tuple(k for k in DevicesBudgetRow.__annotations__ if k not in BudgetRow.__annotations__)


def budget_row(
    meta: ModelMeta,
    devices: list[Device],
    w: Workload,
    ncmoe: tuple[int | None, MultiPlan],
    plan: MultiPlan,
    compute_source: str,
) -> DevicesBudgetRow:
    """One context's budget over several devices: the lowest --n-cpu-moe under llama.cpp's own split (what the
    sweep's n means) with its buffers summed over the devices, and beside it moeplace's per-device plan (-ts,
    its host rule), which the placement stage runs as a variant."""
    n, at_n = ncmoe
    kept = sum(meta.layers[il].bytes["expert"] for d in at_n.devices for il in d.expert_layers)
    return {
        "ctx": w.ctx,
        "cells": pad(w.ctx) * w.parallel,
        "ubatch": w.ubatch,
        "flash_attn": w.flash_attn,
        "cache_type_k": w.type_k,
        "cache_type_v": w.type_v,
        "kv_bytes": sum(d.kv for d in at_n.devices),
        "weights_bytes": sum(d.weights for d in at_n.devices),
        "compute_bytes": sum(d.compute for d in at_n.devices),
        "compute_source": compute_source,
        "margin_bytes": devices[0].kept_free,
        "budget_bytes": sum(d.free_bytes for d in at_n.devices) + kept,
        "n_cpu_moe": n,
        "resident_layers": meta.n_layer - n if n is not None else 0,
        "status": FITS if n is not None else DOES_NOT_FIT,
        "devices_mib": "/".join(f"{d.vram_bytes / 2**20:.0f}" for d in devices),
        "ncmoe_free_mib": "/".join(f"{d.free_bytes / 2**20:.1f}" for d in at_n.devices),
        "device_plan_fits": plan.fits,
        "tensor_split": "/".join(map(str, plan.tensor_split)),
        "device_plan_override": plan.host_rule(meta, ";"),
        "device_plan_host_layers": " ".join(map(str, plan.host_expert_layers)),
    }


def devices_budget_table(
    meta: ModelMeta,
    model_path: str,
    manifest: Build,
    target: DeviceTarget,
    memory: Device,
    workloads: list[Workload],
    log_path: Path,
) -> pd.DataFrame:
    """The budget stage over several devices (device.vram a list): per workload, budget_row with every compute
    buffer as llama.cpp reserves it on the devices, started for the duration."""
    if model_path is None:
        raise MoeplaceError(
            "device.vram lists several devices, which needs a model file (gguf or twin) to plan "
            "their layers; the seed's constants have none: give one device."
        )
    setup = device_setup(target, manifest)
    devices = [Device(cap, margin_on(setup, manifest, memory)) for cap in setup.caps]
    with attached(setup, manifest, split_cpus(setup.kind == "emulated"), log_path) as rpc:
        names = rpc.split(",") if rpc else [g.split(":")[0] for g in manifest.gpu_devices[: len(devices)]]
        at = Attached(names, manifest, model_path, rpc, log_path)
        rows = [
            budget_row(
                meta,
                devices,
                w,
                reserved_ncmoe(meta, w, devices, at),
                reserved_plan(meta, w, devices, at),
                "llama.cpp",
            )
            for w in workloads
        ]
    return budget_frame(rows, DEVICE_COLUMNS)
