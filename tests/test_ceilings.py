"""Measured ceilings and the disk term of the prediction (seed 004)."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import ROOT, SEED_CONSTANTS

from moeplace.core.config import Bandwidths, BenchSettings
from moeplace.core.units import GB
from moeplace.measure.ceilings import bound, disk_read_mbps
from moeplace.model.metadata import from_constants, inspect_model
from moeplace.model.reads import bytes_per_token
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.measured_prior import attention_costs, measured_bandwidths, measured_prior
from moeplace.plan.predict import predict_table, ram_tier_tok_s
from moeplace.runtime.native import ram_read_gbps

SEED = from_constants("seed", SEED_CONSTANTS)
BENCH = BenchSettings(prompt=512, gen=64, repetitions=3, threads=2, timeout_s=600)


def test_boundness_verdicts():
    assert bound(0.9, 1.0) == "bandwidth"  # at the RAM ceiling, whatever the scaling
    assert bound(0.55, 1.7) == "compute"  # seed 004's 2-core box: half the ceiling, cores help
    assert bound(0.4, 0.95) == "overhead"  # neither: fixed per-token costs
    assert bound(0.5, None) == "compute or overhead"


def test_measured_bandwidths_fill_the_corrected_column():
    table = pd.DataFrame(
        [
            {"ceiling": "ram_read", "threads": 1, "value": 12.0},
            {"ceiling": "ram_read", "threads": 2, "value": 20.0},
            {"ceiling": "disk_random_read", "threads": None, "value": 150.0},
        ]
    )
    # No GPU measured: the emulated device's memory is host RAM.
    assert measured_bandwidths(table) == {"bw_ddr_gbps": 20.0, "bw_vram_gbps": 20.0, "bw_disk_gbps": 0.15}
    # A GPU's dense-decode figure is only a lower bound: the configured bandwidth stays.
    gpu = pd.concat([table, pd.DataFrame([{"ceiling": "device_decode", "effective_gbps": 500.0}])])
    assert "bw_vram_gbps" not in measured_bandwidths(gpu)


def test_attention_costs_are_each_models_own_and_name_the_runs_they_took(tmp_path):
    tiny = inspect_model(write_twin(load_spec(ROOT / "config/models/tiny-qwen3moe.yaml"), tmp_path / "t.gguf", "none"))
    measured = (("a", "tg", 0.12, 0.02), ("a", "pp", 0.03, None), ("b", "tg", -0.01, 0.1))
    rows = [{"ceiling": f"attention_{test}", "subject": model, "value": value, "value_sd": sd, "n_cpu_moe": 8,
             "depths": "3584 32256"} for model, test, value, sd in measured]  # fmt: skip
    table = pd.DataFrame([{"ceiling": "ram_read", "subject": "host RAM", "threads": 1, "value": 12.0}, *rows])
    assert attention_costs(table, "a") == ({"tg": 0.12, "pp": 0.03}, {"tg": 0.02}, {(8, 3584), (8, 32256)})
    # Decode no slower deeper in the context is noise, not a cost; its runs were still taken.
    assert attention_costs(table, "b") == ({}, {}, {(8, 3584), (8, 32256)})
    assert attention_costs(table, "c") == ({}, {}, set())
    # A table written before the spread was measured has no value_sd column.
    assert attention_costs(table.drop(columns="value_sd"), "a")[1] == {}
    # The prior a stage builds on: the measured RAM bandwidth and the model's own attention cost and spread.
    base, probed, anchors = measured_prior(Bandwidths(20, 20), table, "a", tiny, BENCH)
    assert {t: m.coef["kv_gb"] for t, m in base.tests.items()} == {"tg": 0.12, "pp": 0.03}
    assert base.tests["tg"].se == {"kv_gb": 0.02} and base.tests["pp"].se == {}
    assert base.tests["tg"].coef["host_gb"] == 1 / 12.0 and probed == {(8, 3584), (8, 32256)} and anchors == set()
    assert base.tests["tg"].source["layers"] == "default" and "layers" not in base.tests["pp"].coef
    assert measured_prior(Bandwidths(20, 20), None, "a", tiny, BENCH)[0].tests["tg"].coef["kv_gb"] == 1 / 20
    # The probe's times at its first depth, all experts on the host and none: the fixed time and host cost.
    times = [{"ceiling": f"time_{test}", "subject": "a", "value": value, "n_cpu_moe": n, "depths": 3584}
             for test, n, value in (("tg", 8, 0.04), ("tg", 0, 0.02), ("pp", 8, 0.004), ("pp", 0, 0.001))]  # fmt: skip
    base, probed, anchors = measured_prior(
        Bandwidths(20, 20), pd.concat([table, pd.DataFrame(times)]), "a", tiny, BENCH
    )
    assert (
        anchors == {(0, 3584), (8, 3584)}
        and base.tests["tg"].coef["layers"] > 0
        and base.tests["pp"].coef["link_gb"] > 0
    )
    assert {k for m in base.tests.values() for k, s in m.source.items() if s == "ceilings"} >= {"hops", "link_gb"}


def test_disk_term_pages_what_ram_cannot_hold():
    # 8 GB of RAM for the CPU-side experts; at n=48 they are 17.41 GB: 54% is read from disk.
    bw = Bandwidths(640, 57.6, disk_gbps=0.15, ram_bytes=8 * GB)
    table = predict_table(SEED, bw).set_index("n_cpu_moe")
    d = 17.41 * 8 / 128
    missing = 1 - 8 / 17.41
    assert table.loc[48, "s_gb"] == pytest.approx(d * missing, rel=1e-6)
    expected = 1 / (0.89 / 640 + d * (1 - missing) / 57.6 + d * missing / 0.15)
    assert table.loc[48, "tok_s"] == pytest.approx(expected, rel=1e-6)
    assert table.loc[12, "s_gb"] == 0  # 12 layers' experts (4.35 GB) fit in 8 GB
    assert (predict_table(SEED, Bandwidths(640, 57.6)).s_gb == 0).all()


def test_ram_tier_prediction():
    per_token = bytes_per_token(SEED)
    assert per_token == pytest.approx(0.89e9 + 17.41e9 / 16)
    assert ram_tier_tok_s(SEED, None, 20, 0.15) == pytest.approx(20e9 / per_token)
    # Half the experts resident: half the active expert bytes come from disk.
    half = int(0.89e9 + 17.41e9 / 2)
    s = 17.41e9 / 16 / 2
    assert ram_tier_tok_s(SEED, half, 20, 0.15) == pytest.approx(1 / ((per_token - s) / 20e9 + s / 0.15e9))


def test_ram_probe_and_disk_reads(tmp_path):
    assert ram_read_gbps(tmp_path / "probe.log", 1, 64 * 2**20, 0.2) > 0.5
    f = tmp_path / "file.bin"
    f.write_bytes(b"\1" * (4 * 2**20))
    for random_order in (False, True):
        mbps = disk_read_mbps(f, block=2**17, random_order=random_order, seconds=0.1)
        assert mbps is None or mbps > 1  # None: this file system refuses O_DIRECT
