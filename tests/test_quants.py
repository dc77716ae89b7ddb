"""The quant comparison table: exact bytes, ratios in the seed's directions, empty where unmeasured."""

from __future__ import annotations

import math

import pytest

from moeplace.measure.quants import quant_row, quants_table
from moeplace.model.meta import Layer, ModelFile, ModelMeta
from moeplace.report.figures.quants import quants_figure


def meta(expert_bytes: int, non_expert: int) -> ModelMeta:
    """A one-file model of 64 experts, 8 used, with these bytes (its layers play no part in the row)."""
    return ModelMeta(
        name="m",
        architecture="qwen3moe",
        n_layer=1,
        n_expert=64,
        n_expert_used=8,
        n_expert_shared=0,
        n_ctx_train=0,
        expert_bytes=expert_bytes,
        non_expert_bytes=non_expert,
        total_bytes=expert_bytes + non_expert,
        global_bytes={},
        quant_types={},
        layers=[Layer(0, expert_bytes)],
        files=[ModelFile("m.gguf", expert_bytes + non_expert, "")],
        attention=None,
    )


def records(tok_s: float | None, capped: float | None, faults: float | None) -> list[dict]:
    ok = {"status": "ok", "faults_per_token": 0.0}
    rows = [{**ok, "cap_pct": None, "tok_s": tok_s}] if tok_s else []
    if capped:
        rows.append({**ok, "cap_pct": 50, "tok_s": capped, "faults_per_token": faults})
    return rows or [{"cap_pct": None, "status": "skipped", "error": "no memory cgroup"}]


def test_ratios_read_like_seed_004():
    # Seed 004: Q4_K_M reads 1.67x the bytes of Q2_K and is 1.92x slower; 9.3x the faults.
    q4 = quant_row("Q4_K_M", meta(3_200_000_000, 300_000_000), records(10.0, 0.091, 385.56), 50)
    q2 = quant_row("Q2_K", meta(1_800_000_000, 300_000_000), records(15.0, 0.175, 41.47), 50)
    table = quants_table([q4, q2]).set_index("quant")
    assert table.loc["Q4_K_M", "active_mb_per_token"] == pytest.approx(300 + 3200 / 8)
    assert table.loc["Q2_K", "bytes_ratio"] == pytest.approx(700 / 525)
    assert table.loc["Q2_K", "tok_s_capped_ratio"] == pytest.approx(0.175 / 0.091)
    assert table.loc["Q2_K", "faults_ratio_capped"] == pytest.approx(385.56 / 41.47)
    assert table.loc["Q4_K_M", ["bytes_ratio", "tok_s_ratio"]].tolist() == [1.0, 1.0]


def test_unmeasured_speeds_stay_empty(tmp_path):
    rows = [
        quant_row(q, meta(b, 10**8), records(None, None, None), 50) for q, b in (("Q4_K_M", 10**9), ("Q2_K", 6 * 10**8))
    ]
    table = quants_table(rows)
    assert math.isnan(table.tok_s_ratio.iloc[1]) and "no memory cgroup" in table.problems.iloc[0]
    quants_figure(table, tmp_path / "q.png", "no cgroups here")
    assert (tmp_path / "q.png").stat().st_size > 10_000
