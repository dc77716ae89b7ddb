"""Precision machinery without llama.cpp: intervals, detectable effects, the CPU split, the quiet check,
and the variants and precision tables built from paired samples."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from moeplace.core.stats import (
    fewest_for_median_interval,
    median_halfwidth,
    median_interval,
    min_detectable_effect,
    outlying,
    repetitions_for,
)
from moeplace.measure.bench import next_batch
from moeplace.measure.placement import variants_table
from moeplace.report.aggregate import precision_table
from moeplace.runtime import cpus


def test_the_median_interval_is_the_order_statistics_of_the_binomial_table():
    # Coverage of (x(k), x(n+1-k)) is 1 - 2 P(Binomial(n, 1/2) <= k-1): n = 6, k = 1: 1 - 2/64 = 96.9%;
    # n = 8, k = 2 would be 1 - 2*9/256 = 93.0% (< 95%, so k = 1); n = 9, k = 2: 1 - 2*10/512 = 96.1%;
    # n = 12, k = 3: 1 - 2*79/4096 = 96.1%.
    assert median_interval([5.0, 1.0, 3.0, 2.0, 6.0, 4.0]) == (3.5, 1.0, 6.0)
    assert median_interval([float(v) for v in range(1, 9)])[1:] == (1.0, 8.0)
    assert median_interval([float(v) for v in range(1, 10)]) == (5.0, 2.0, 8.0)
    assert median_interval([float(v) for v in range(1, 13)]) == (6.5, 3.0, 10.0)
    low, high = median_interval([10.0, 10.0, 10.0, 10.0, 10.0])[1:]  # no pair reaches 95% below 6 samples
    assert math.isnan(low) and math.isnan(high)
    assert median_halfwidth([10.0] * 5) == math.inf


def test_the_fewest_repetitions_are_those_whose_interval_spares_the_extremes():
    """At 95%: 6 give an interval at all (x(1)..x(6), 1 - 2/64); sparing one each side, 9 (x(2)..x(8),
    1 - 2 * 10/512 = 96.1%, where 8 reach only 93.0%); sparing two, 12 (x(3)..x(10), 96.1%): the binomial table."""
    assert [fewest_for_median_interval(spared=s) for s in (0, 1, 2)] == [6, 9, 12]
    assert fewest_for_median_interval(0.9, spared=1) == 8  # x(2)..x(7) of 8: 1 - 2 * 9/256 = 93.0%


def test_a_slow_repetition_moves_neither_the_value_nor_its_interval():
    steady = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9]
    spell = [*steady[:-1], 40.0]  # one repetition caught by a slow spell of the host
    assert median_interval(spell)[0] == pytest.approx(100.0, abs=0.11)
    assert median_halfwidth(steady) == pytest.approx(0.005)  # (99.5, 100.5)
    assert median_halfwidth(spell) == pytest.approx(0.0075)  # (99.0, 100.5); the mean's t interval: +-16%
    assert outlying(spell, 0.05) == [40.0]
    assert outlying(steady, 0.05) == []


def test_repetitions_for_a_target_grow_with_the_noise():
    quiet, noisy = [100.0, 101.0, 99.0], [100.0, 110.0, 90.0]
    assert repetitions_for(quiet, 0.05) == 3  # already there
    assert repetitions_for(noisy, 0.05) > 10
    assert repetitions_for([100.0, 100.0, 100.0], 0.05) == 3


def test_a_batch_gets_what_its_fixed_cost_is_worth_within_the_budget():
    # At 32K on this CPU: ~40 s to start, load, warm up and fill the depth, ~2.5 s per repetition of both tests.
    assert next_batch(wanted=2, allowed=17, fixed_s=40, repetition_s=2.5, left_s=100) == 16  # not 2 per depth fill
    assert next_batch(wanted=30, allowed=17, fixed_s=40, repetition_s=2.5, left_s=100) == 17  # the most allowed
    assert next_batch(wanted=2, allowed=17, fixed_s=40, repetition_s=2.5, left_s=90) == 16  # what the budget pays
    assert next_batch(wanted=2, allowed=17, fixed_s=40, repetition_s=2.5, left_s=50) == 0  # 4: mostly a new fill
    assert next_batch(wanted=2, allowed=3, fixed_s=40, repetition_s=2.5, left_s=50) == 3  # the last allowed
    assert next_batch(wanted=2, allowed=17, fixed_s=40, repetition_s=2.5, left_s=42) == 0  # not even one
    assert next_batch(wanted=2, allowed=0, fixed_s=1, repetition_s=1, left_s=100) == 0
    assert next_batch(wanted=5, allowed=17, fixed_s=0.5, repetition_s=1, left_s=100) == 5  # cheap batches: as wanted


def test_min_detectable_effect_is_welch_plus_power():
    a, b = [10.0, 11.0, 12.0, 11.0], [10.0, 11.0, 12.0, 11.0]
    mde = min_detectable_effect(a, b)
    se = math.sqrt(2 * (2 / 3) / 4)  # equal variances 2/3, n 4 each: dof 6
    assert mde == pytest.approx((2.447 + 0.906) * se / 11, rel=1e-3)
    assert math.isnan(min_detectable_effect([1.0], b))


def test_cpus_split_into_disjoint_halves_on_the_emulated_device_only():
    assert cpus.split_cpus(True, (0, 1)) == cpus.CpuSplit((0,), (1,))
    assert cpus.split_cpus(True, (0, 1, 2)) == cpus.CpuSplit((0,), (1, 2))
    assert cpus.split_cpus(True, (3,)) == cpus.CpuSplit((3,), None)  # nothing to split: shared, said so
    assert cpus.split_cpus(False, (0, 1)) == cpus.CpuSplit((0, 1), None)


def test_the_quiet_check_counts_other_runnable_tasks(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    monkeypatch.setattr(cpus, "PROC_STAT", stat)
    stat.write_text("cpu 1 2 3\nprocs_running 4\nprocs_blocked 0\n")
    seen = cpus.wait_for_quiet(0)
    assert seen["others_running"] == 3.0 and seen["contended"] is True
    assert 0 <= seen["quiet_wait_s"] < 5  # it waited at most its limit, 0 s, and the 1 s sampling
    stat.write_text("procs_running 1\n")
    assert cpus.wait_for_quiet(5) == {
        "others_running": 0.0,
        "quiet_wait_s": pytest.approx(1, abs=0.5),
        "contended": False,
    }
    stat.unlink()  # unreadable: unknown, not quiet
    assert cpus.wait_for_quiet(5) == {"others_running": None, "quiet_wait_s": 0.0, "contended": None}


def record(variant: str, test: str, samples: list[float], baseline: list[float] | None = None) -> dict:
    r = {"model": "m", "ctx": 4096, "variant": variant, "test": test, "status": "ok", "overrides": "",
         "avg_ts": sum(samples) / len(samples), "stddev_ts": 0.0, "samples_ts": samples,
         "repetitions": len(samples), "device": "emulated device"}  # fmt: skip
    return {**r, "baseline_samples_ts": baseline} if baseline else r


def test_variants_table_compares_with_the_interleaved_baseline():
    records = [
        record("first_n", "tg", [50.0, 51.0, 49.0]),
        record("last_n", "tg", [60.0, 61.0, 59.0, 60.0], baseline=[40.0, 41.0, 39.0, 40.0]),  # paired: drifted
        record("up_down", "tg", [40.0, 41.0, 39.0, 40.0], baseline=[40.5, 39.5, 40.0, 40.0]),
    ]
    table = variants_table(records).set_index("variant")
    assert table.loc["last_n", "paired"] and table.loc["last_n", "baseline_ts"] == 40.0  # not first_n's 50
    assert table.loc["last_n", "delta_pct"] == pytest.approx(50.0)
    assert table.loc["last_n", "distinguishable"]
    assert not table.loc["up_down", "distinguishable"]
    assert 0 < table.loc["up_down", "mde_pct"] < 10
    assert pd.isna(table.loc["first_n", "mde_pct"])


def test_precision_table_summarises_the_sweep_and_the_variants():
    measured = pd.DataFrame(
        {
            "model": "m", "ctx": 4096, "variant": "ncmoe", "test": "tg", "status": "ok",
            "n_cpu_moe": [0, 4, 8, 12], "cv": [0.01, 0.02, 0.03, 0.2], "ci95_halfwidth_pct": [1.0, 2.0, 3.0, 20.0],
            "repetitions": [3, 3, 5, 10], "target_reached": [True, True, True, False], "contended": False,
            "outlying": [0, 0, 1, 2],
        }
    )  # fmt: skip
    variants = variants_table([record("up_down", "tg", [40.0, 41.0, 39.0, 40.0], baseline=[40.5, 39.5, 40.0, 40.0])])
    table = precision_table(measured, variants).set_index("stage")
    bench = table.loc["bench"]
    assert bench.configurations == 4 and bench.median_cv_pct == pytest.approx(2.5)
    assert bench.reached_target_pct == 75.0 and bench.median_repetitions == 4.0 and bench.outlying == 3
    assert table.loc["variants", "median_mde_pct"] == pytest.approx(variants.mde_pct.iloc[0])


def test_the_first_prompt_run_after_a_depth_fill_is_a_warm_up():
    """At a depth, pp's first repetition of each llama-bench benchmark is left out (5-20% slow in every pass of
    the default sweep); decode's and a depth-0 prompt's are kept."""
    from moeplace.measure.repetitions import samples_of, warmed_up

    pp = {"n_prompt": 128, "n_gen": 0, "n_depth": 32640, "samples_ts": [700.0, 860.0, 850.0], "avg_ts": 803.3}
    assert samples_of(pp) == [860.0, 850.0] and warmed_up(pp) == 1
    assert samples_of({**pp, "n_gen": 32, "n_prompt": 0}) == [700.0, 860.0, 850.0]
    assert samples_of({**pp, "n_depth": 0}) == [700.0, 860.0, 850.0]
    assert samples_of({**pp, "samples_ts": [700.0]}) == [700.0]  # a single repetition is all there is
