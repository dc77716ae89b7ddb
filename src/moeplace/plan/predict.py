"""Stage 'predict': decode speed for every --n-cpu-moe value from exact per-layer bytes (seed 000 §5.3).

t_token(n) = V(n)/BW_vram + D(n)/BW_ddr + S(n)/BW_disk, where D(n) is the active (top-k of E)
share of the expert bytes of the first n layers, read from host RAM, V(n) is everything else read
per token: all non-expert bytes plus the active share of the resident layers' experts, and S(n)
is the part of D(n) that does not fit in the host RAM given (host.ram) and is paged from disk
(seed 004). Without host.ram, S is 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from ..core.config import Bandwidths
from ..core.errors import MoeplaceError
from ..core.units import GB
from ..model.meta import Model, ModelMeta, is_seed
from ..model.reads import active_fraction, bytes_per_token, disk_share, read_bytes, unread_bytes
from .speed import Run, prefill_run, prior

if TYPE_CHECKING:
    import pandas as pd

    from .speed import SpeedModel


def token_seconds(
    d: float, v: float, vram_gbps: float, ddr_gbps: float, s: float = 0.0, disk_gbps: float | None = None
) -> float:
    """V from the device, D from RAM, S from disk (S is a part of the CPU side's reads)."""
    t = v / (vram_gbps * GB) + (d - s) / (ddr_gbps * GB)
    if s:
        if not disk_gbps:
            raise MoeplaceError("host.ram is smaller than the CPU-side experts: set host.bw_disk_gbps or measure it.")
        t += s / (disk_gbps * GB)
    return t


def predict_table(meta: Model, bw: Bandwidths, model: SpeedModel | None = None) -> pd.DataFrame:
    """Seed 000's table (tok_s, from theoretical bandwidths) and the speed model's decode before any calibration
    (tg_tok_s with its interval, at an empty context): `model`, the prior the ceilings stage measured
    (measured_prior.measured_prior), else the prior of `bw`."""
    import pandas as pd  # here, not at the top: it is half a second of every CLI start

    model = model or prior(bw)
    dense_tok_s = bw.ddr_gbps * GB / meta.total_bytes
    rows = []
    for n in range(meta.n_layer + 1):
        d, v = read_bytes(meta, n)
        s = d * disk_share(meta, n, bw.ram_bytes)
        t = token_seconds(d, v, bw.vram_gbps, bw.ddr_gbps, s, bw.disk_gbps)
        tok_s = 1 / t
        row: dict[str, float | None] = {
            "n_cpu_moe": n,
            "d_gb": d / GB,
            "v_gb": v / GB,
            "s_gb": s / GB,
            "t_token_ms": t * 1e3,
            "tok_s": tok_s,
        }
        tg = model.predict(meta, Run(n, 0, "tg", 1)) if not is_seed(meta) else None
        row |= {f"tg_{k}": None if tg is None else tg[k] for k in ("tok_s", "low", "high")}
        row["dense_tok_s"] = dense_tok_s
        row["moe_vs_dense"] = tok_s / dense_tok_s
        rows.append(row)
    return pd.DataFrame(rows)


def ram_tier_tok_s(meta: ModelMeta, weight_ram_bytes: int | None, ddr_gbps: float, disk_gbps: float | None) -> float:
    """CPU-only decode with `weight_ram_bytes` of page cache for the weights (None: all of them).

    Non-expert tensors are read every token, so they stay resident (or are locked); the experts
    share what is left and miss uniformly: S = the active expert bytes times the missing share.
    """
    per_token = bytes_per_token(meta)
    hot = meta.non_expert_bytes - unread_bytes(meta)
    spare = None if weight_ram_bytes is None else weight_ram_bytes - hot
    missing = 0.0 if spare is None or meta.expert_bytes <= spare else 1 - max(spare, 0) / meta.expert_bytes
    s = active_fraction(meta) * meta.expert_bytes * missing
    return 1 / token_seconds(per_token, 0.0, 1.0, ddr_gbps, s, disk_gbps)


class PredictedSpeed(TypedDict):
    """Decode and prefill at one --n-cpu-moe and depth: tok/s with its ~95% interval (None: the model cannot say)."""

    n_cpu_moe: int
    depth: int
    ubatch: int
    tg_tok_s: float | None
    tg_low: float | None
    tg_high: float | None
    pp_tok_s: float | None
    pp_low: float | None
    pp_high: float | None


def predicted_speeds(
    meta: ModelMeta,
    model: SpeedModel,
    n_values: list[int],
    depths: tuple[int, ...],
    ubatch: int,
    kv: tuple[str, str],
) -> list[PredictedSpeed]:
    """`moeplace predict`'s rows: decode of 128 tokens and llama-bench's prefill at each depth and n."""
    rows = []
    for depth in depths:
        for n in n_values:
            tg = model.predict(meta, Run(n, depth, "tg", 128, ubatch, *kv))
            pp = model.predict(meta, prefill_run(n, depth, ubatch, *kv))
            rows.append(
                PredictedSpeed(
                    n_cpu_moe=n,
                    depth=depth,
                    ubatch=ubatch,
                    tg_tok_s=None if tg is None else tg["tok_s"],
                    tg_low=None if tg is None else tg["low"],
                    tg_high=None if tg is None else tg["high"],
                    pp_tok_s=None if pp is None else pp["tok_s"],
                    pp_low=None if pp is None else pp["low"],
                    pp_high=None if pp is None else pp["high"],
                )
            )
    return rows
