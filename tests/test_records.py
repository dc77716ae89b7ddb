"""The typed records say what the files hold: every key a stage writes is declared, and every declared key is
written (the ones only some records carry aside)."""

from __future__ import annotations

from test_bench_unit import fake_bench

from moeplace.core.config import Device
from moeplace.core.records import BenchRecord
from moeplace.model.memory import Workload
from moeplace.model.metadata import inspect_model
from moeplace.plan.budget import BudgetRow, plan

# Keys only some bench records have: a paired sweep's baseline, nvidia-smi's view of the GPU, the placement
# stage's check of an -ot variant.
SOMETIMES = {
    "baseline_samples_ts",
    "gpu_processes",
    "gpus",
    "host_expert_bytes",
    "placement_match",
    "placement_missing",
    "placement_unexpected",
}


def test_a_bench_record_has_exactly_the_keys_benchrecord_declares(tmp_path):
    records = fake_bench(tmp_path, tg="50.0, 50.5, 49.5", copies=3, end="TERM", precision=0.05)
    declared = set(BenchRecord.__annotations__)
    for record in records:
        assert set(record) - declared == set()
        assert declared - set(record) <= SOMETIMES


def test_a_budget_row_has_exactly_the_keys_budgetrow_declares(small_moe):
    row = plan(inspect_model(small_moe), Device(8 * 2**30, 2**28), Workload(4096, 512, "auto", "f16", "f16"))
    # a draft's buffers and a unified-memory pool's figures only where the plan has them (tests/test_draft.py)
    beside = {"spec_type", "draft_weights_bytes", "draft_kv_bytes", "draft_compute_bytes", "pool_ram_bytes",
              "pool_used_bytes"}  # fmt: skip
    assert set(row) == set(BudgetRow.__annotations__) - beside


def test_the_published_sqlite_keeps_llama_benchs_columns():
    from moeplace.report.bench_sqlite import LLAMA_BENCH_FIELDS

    # an optional field (a pasted table's row may lack its spread) keeps its column, as llama-bench's own table has it
    assert LLAMA_BENCH_FIELDS["stddev_ts"] == "REAL" and LLAMA_BENCH_FIELDS["avg_ns"] == "INTEGER"
    assert "samples_ts" not in LLAMA_BENCH_FIELDS and len(LLAMA_BENCH_FIELDS) == 38  # the per-sample arrays stay out
