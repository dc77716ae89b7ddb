"""Stage 'ram_tier's record (what measure/ram_tier.py writes per run) and its table: one row per record, and the
speed the model predicts beside it (its figure: report/figures/ram_tier.py)."""

from __future__ import annotations

import math

import pandas as pd

from ..core.errors import MoeplaceError
from ..core.records import Provenance
from ..model.meta import ModelMeta
from ..plan.predict import ram_tier_tok_s


class RamTierRecord(Provenance, total=False):
    """One RAM-tier run (a line of results/ram_tier/*.jsonl): the model, the cap and lock mode, what both
    generation lengths saw, and the derived faults per token and speeds; a failed or skipped run says why."""

    # the model and how it was run
    model: str
    model_bytes: int
    non_expert_bytes: int
    expert_bytes: int
    gen: list[int]  # the two generation lengths
    threads: int
    load_mode: str
    repack: bool
    slack_bytes: int
    readahead: str
    readahead_kb: int | None
    readahead_effective_kib: int | None
    readahead_note: str
    madvise: str  # random or none
    cgroup: str | None
    command: list[str]
    # the cap and lock mode
    cap_pct: int | None  # None: the uncapped reference
    lock: str | None
    cap_bytes: int
    cap_model_bytes: int
    model_room_pct: float | None
    other_charged_bytes: int | None
    lock_expected_bytes: int
    # what the runs saw
    status: str
    error: str
    evict: str | None
    evict_left_bytes: int | None
    majflt: list[int | None]  # None: a run whose resource usage was not read
    wall_s: list[float]
    anon_peak_bytes: int | None
    cgroup_peak_bytes: int | None
    oom_kills: int
    locked_bytes: int | None
    faults_per_token: float | None
    tok_s: float | None
    tok_s_marginal: float | None


TABLE_COLUMNS = [
    "model",
    "cap_pct",
    "cap_gb",
    "model_room_pct",
    "lock",
    "tok_s",
    "tok_s_marginal",
    "faults_per_token",
    "locked_mb",
    "readahead",
    "readahead_effective_kib",
    "status",
    "error",
]
_NUMERIC = ["cap_pct", "cap_gb", "model_room_pct", "tok_s", "tok_s_marginal", "faults_per_token", "locked_mb"]


def ram_tier_table(records: list[RamTierRecord]) -> pd.DataFrame:
    """One row per record, in run_ram_tier's order: the uncapped reference (cap_pct NaN) first."""
    table = pd.DataFrame(
        [
            {
                **{c: r.get(c) for c in TABLE_COLUMNS},
                "cap_gb": None if (cap := r.get("cap_bytes")) is None else cap / 1e9,
                "locked_mb": None if (locked := r.get("locked_bytes")) is None else locked / 1e6,
                "error": r.get("error") or "",
            }
            for r in records
        ],
        columns=TABLE_COLUMNS,
    )
    table[_NUMERIC] = table[_NUMERIC].apply(pd.to_numeric, errors="coerce").astype(float)
    table["readahead_effective_kib"] = pd.to_numeric(table.readahead_effective_kib, errors="coerce").astype("Int64")
    return table


def predicted_column(
    table: pd.DataFrame, meta: ModelMeta, ddr_gbps: float | None, disk_gbps: float | None
) -> pd.DataFrame:
    """The table with tok_s_predicted: predict.ram_tier_tok_s with the share of the model's file bytes the
    cap left it (model_room_pct where known, else cap_pct) as the weights' page cache (all of it uncapped);
    NaN where a bandwidth it needs is unknown."""
    model_bytes = sum(f.size for f in meta.files) or meta.total_bytes

    def one(cap_pct: float, room_pct: float) -> float:
        pct = room_pct if pd.notna(room_pct) else cap_pct
        if not ddr_gbps:
            return math.nan
        weight_ram = None if pd.isna(pct) else round(max(pct, 0) / 100 * model_bytes)
        try:
            return ram_tier_tok_s(meta, weight_ram, ddr_gbps, disk_gbps)
        except MoeplaceError:  # pages from disk, but no disk bandwidth
            return math.nan

    return table.assign(tok_s_predicted=[one(c, r) for c, r in zip(table.cap_pct, table.model_room_pct)])
