"""Stage 'predict': decode speed for every --n-cpu-moe value from exact per-layer bytes (seed 000 §5.3).

t_token(n) = V(n)/BW_vram + D(n)/BW_ddr, where D(n) is the active (top-k of E) share of the
expert bytes of the first n layers, read from host RAM, and V(n) is everything else read per
token: all non-expert bytes plus the active share of the resident layers' experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .units import GB


@dataclass(frozen=True)
class Bandwidths:
    """Theoretical bandwidths in GB/s, and what the corrected column uses when known."""

    vram_gbps: float
    ddr_gbps: float
    measured_vram_gbps: float | None = None
    measured_ddr_gbps: float | None = None
    eta: float | None = None

    @property
    def has_correction(self) -> bool:
        return any(x is not None for x in (self.measured_vram_gbps, self.measured_ddr_gbps, self.eta))


def active_fraction(meta: dict[str, Any]) -> float:
    return meta["n_expert_used"] / meta["n_expert"] if meta["n_expert"] else 1.0


def read_bytes(meta: dict[str, Any], n_cpu_moe: int) -> tuple[float, float]:
    """(D, V): bytes read per token from host RAM and from the device, with n layers' experts on the host."""
    n = min(max(n_cpu_moe, 0), meta["n_layer"])
    expert = [layer["expert_bytes"] for layer in meta["layers"]]
    frac = active_fraction(meta)
    d = frac * sum(expert[:n])
    v = meta["non_expert_bytes"] + frac * sum(expert[n:])
    return d, v


def token_seconds(d: float, v: float, vram_gbps: float, ddr_gbps: float) -> float:
    return v / (vram_gbps * GB) + d / (ddr_gbps * GB)


def predict_table(meta: dict[str, Any], bw: Bandwidths) -> pd.DataFrame:
    dense_tok_s = bw.ddr_gbps * GB / meta["total_bytes"]
    rows = []
    for n in range(meta["n_layer"] + 1):
        d, v = read_bytes(meta, n)
        t = token_seconds(d, v, bw.vram_gbps, bw.ddr_gbps)
        row = {
            "n_cpu_moe": n,
            "d_gb": d / GB,
            "v_gb": v / GB,
            "t_token_ms": t * 1e3,
            "tok_s": 1 / t,
        }
        if bw.has_correction:
            t_c = token_seconds(d, v, bw.measured_vram_gbps or bw.vram_gbps, bw.measured_ddr_gbps or bw.ddr_gbps)
            row["tok_s_corrected"] = (bw.eta or 1.0) / t_c
        row["dense_tok_s"] = dense_tok_s
        row["moe_vs_dense"] = row["tok_s"] / dense_tok_s
        rows.append(row)
    return pd.DataFrame(rows)


def predicted_tok_s(meta: dict[str, Any], bw: Bandwidths, n_cpu_moe: int) -> float:
    d, v = read_bytes(meta, n_cpu_moe)
    return 1 / token_seconds(d, v, bw.vram_gbps, bw.ddr_gbps)
