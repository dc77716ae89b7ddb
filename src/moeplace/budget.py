"""Stage 'budget': the smallest --n-cpu-moe that fits the device at each context (seed 000 §5.4).

budget = VRAM - non-expert bytes - KV(ctx) - overhead. The resident layers are the last ones
(--n-cpu-moe moves the first n to the host), counted with each layer's real expert bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .kvcache import kv_bytes
from .units import GB

FITS = "ok"
DOES_NOT_FIT = "does_not_fit"


@dataclass(frozen=True)
class Device:
    vram_bytes: int
    overhead_bytes: int


def resident_layers(meta: dict[str, Any], budget_bytes: float) -> int:
    """How many of the last layers keep their experts on the device within the budget."""
    used, resident = 0.0, 0
    for layer in reversed(meta["layers"]):
        used += layer["expert_bytes"]
        if used > budget_bytes:
            break
        resident += 1
    return resident


def plan(meta: dict[str, Any], device: Device, ctx: int, type_k: str = "f16", type_v: str = "f16") -> dict[str, Any]:
    """One context's budget: KV bytes, room left for experts, and the minimum n_cpu_moe."""
    kv = kv_bytes(meta, ctx, type_k, type_v)
    budget = device.vram_bytes - meta["non_expert_bytes"] - kv - device.overhead_bytes
    fits = budget >= 0
    resident = resident_layers(meta, budget) if fits else 0
    return {
        "ctx": ctx,
        "cache_type_k": type_k,
        "cache_type_v": type_v,
        "kv_bytes": kv,
        "budget_bytes": budget,
        "resident_layers": resident,
        "n_cpu_moe": meta["n_layer"] - resident if fits else None,
        "status": FITS if fits else DOES_NOT_FIT,
    }


def does_not_fit_message(p: dict[str, Any], vram_bytes: int) -> str:
    return (
        f"context {p['ctx']} does not fit in {vram_bytes / GB:.2f} GB: its KV cache ({p['kv_bytes'] / GB:.2f} GB) "
        f"plus non-expert weights and overhead exceed the card by {-p['budget_bytes'] / GB:.2f} GB; "
        "reduce the context or quantize the KV cache (--cache-type-k/--cache-type-v q8_0)."
    )


def budget_table(
    meta: dict[str, Any], device: Device, contexts: list[int], type_k: str = "f16", type_v: str = "f16"
) -> pd.DataFrame:
    """Memory only (speeds are the predict stage's): a new bandwidth never reruns what depends on the budget."""
    rows = []
    for ctx in contexts:
        p = plan(meta, device, ctx, type_k, type_v)
        p["kv_gb"] = p["kv_bytes"] / GB
        p["budget_gb"] = p["budget_bytes"] / GB
        rows.append(p)
    columns = [
        "ctx",
        "kv_gb",
        "budget_gb",
        "resident_layers",
        "n_cpu_moe",
        "status",
        "kv_bytes",
        "budget_bytes",
        "cache_type_k",
        "cache_type_v",
    ]
    return pd.DataFrame(rows, columns=columns).astype({"n_cpu_moe": "Int64"})
