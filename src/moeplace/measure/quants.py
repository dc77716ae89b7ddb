"""Stage 'quants': one model at several quant types, bytes per token against decode speed (seed 004, finding 4).

Every type is quantized from the same F16 twin. Bytes are exact (tensor sizes x top-k/E); speeds
come from the RAM-tier runner with plenty of RAM and under one cap. Ratios compare each type with
the first, in the seed's directions: bytes_ratio and faults_ratio_capped are first / this (how many
times fewer), the tok/s ratios this / first (how many times faster). If decode were purely
bytes-bound, tok_s_ratio would equal bytes_ratio. Speeds a machine could not measure (no memory
cgroup, a failed run) are empty, and so are their ratios.
"""

from __future__ import annotations

import pandas as pd

from ..core.records import Row
from ..core.units import GB
from ..model.meta import ModelMeta
from ..model.reads import active_fraction, bytes_per_token
from .ram_tier_table import RamTierRecord


def quant_row(quant: str, meta: ModelMeta, records: list[RamTierRecord], cap_pct: int) -> Row:
    def ok(cap: int | None) -> RamTierRecord | None:
        return next((r for r in records if r.get("cap_pct") == cap and r["status"] == "ok"), None)

    free, capped = ok(None), ok(cap_pct)
    problems = sorted({f"{r['status']}: {r.get('error', '')}"[:300] for r in records if r["status"] != "ok"})
    return {
        "quant": quant,
        "file_gb": sum(f.size for f in meta.files) / GB,
        "expert_mb_per_token": active_fraction(meta) * meta.expert_bytes / 1e6,
        "active_mb_per_token": bytes_per_token(meta) / 1e6,
        "tok_s": free["tok_s"] if free else None,
        "faults_per_token": free["faults_per_token"] if free else None,
        "cap_pct": cap_pct,
        "tok_s_capped": capped["tok_s"] if capped else None,
        "faults_per_token_capped": capped["faults_per_token"] if capped else None,
        "problems": " | ".join(problems),
    }


def quants_table(rows: list[Row]) -> pd.DataFrame:
    """The rows with their ratios to the first (reference) type."""
    table = pd.DataFrame(rows)
    for column in ("tok_s", "faults_per_token", "tok_s_capped", "faults_per_token_capped"):
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    ref = table.iloc[0]
    table["bytes_ratio"] = ref.active_mb_per_token / table.active_mb_per_token
    table["tok_s_ratio"] = table.tok_s / ref.tok_s
    table["tok_s_capped_ratio"] = table.tok_s_capped / ref.tok_s_capped
    table["faults_ratio_capped"] = ref.faults_per_token_capped / table.faults_per_token_capped
    return table
