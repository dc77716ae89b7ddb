"""The predicted and budget tables: seed 000's predicted tok/s and minimum --n-cpu-moe (§5.3-5.4) from its
constants, the speed model's decode column against the twin's bytes by hand, and per-layer bytes in the budget."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import SEED_CONSTANTS

from moeplace.core.config import Bandwidths, Device
from moeplace.core.units import GB
from moeplace.model.memory import Workload
from moeplace.model.metadata import from_constants, inspect_model
from moeplace.plan.budget import DOES_NOT_FIT, budget_table
from moeplace.plan.predict import predict_table

SEED_TOK_S = {0: 323, 8: 168, 16: 113, 18: 105, 24: 86, 32: 69, 48: 49}


def test_predicted_table_reproduces_the_seed():
    table = predict_table(from_constants("seed", SEED_CONSTANTS), Bandwidths(640, 57.6)).set_index("n_cpu_moe")
    for n, tok_s in SEED_TOK_S.items():
        assert table.loc[n, "tok_s"] == pytest.approx(tok_s, rel=0.01)
    assert table.loc[18, "d_gb"] == pytest.approx(0.408, abs=0.001)
    assert table.loc[18, "v_gb"] == pytest.approx(1.570, abs=0.002)
    assert table.loc[0, "dense_tok_s"] == pytest.approx(3.15, abs=0.01)  # 18.30 GB / 57.6 GB/s
    assert table.loc[18, "moe_vs_dense"] == pytest.approx(33, rel=0.02)
    assert "tok_s_corrected" not in table


def test_speed_model_column_before_calibration(qwen3_twin):
    """tg_tok_s: the seed's bandwidth terms with measured RAM where known, plus a fixed cost per layer and the
    KV cache read; its interval is wide (a datasheet is 1.4-2.8x off on real cards) and holds tok_s."""
    table = predict_table(inspect_model(qwen3_twin), Bandwidths(640, 57.6, measured_ddr_gbps=40.0))
    row = table.set_index("n_cpu_moe").loc[18]
    # The bytes by hand, from llama.cpp's Q4_K_M recipe for this shape (48 layers, 128 experts of 2048 x 768, 8
    # used; Q4_K 144 B and Q6_K 210 B per 256 values): ffn_gate/up_exps are Q4_K, 113,246,208 B each a layer;
    # ffn_down_exps is Q6_K (165,150,720 B) on use_more_bits' layers (i < 6, i >= 42, (i - 6) % 3 == 2) else Q4_K.
    # The first 18 layers' experts on the host: 18 x 2 x 113,246,208 + 10 x 165,150,720 + 8 x 113,246,208
    # = 6,634,340,352 B, of which a token reads 8/128: 414,646,272 B.
    d = 414_646_272 / 1e9
    # On the card, per token: the other 30 layers' experts (17,553,162,240 - 6,634,340,352) x 8/128 = 682,426,368 B
    # and every non-expert tensor but token_embd (one row of it is read): per layer q, k, o in Q4_K (4,718,592 +
    # 589,824 + 4,718,592), the router in F32 (1,048,576), norms (17,408), v in Q6_K on 24 layers (860,160) and
    # Q4_K on 24 (589,824); output in Q6_K (255,252,480) and output_norm (8,192): 822,523,904 B.
    per_layer = 4_718_592 + 589_824 + 4_718_592 + 1_048_576 + 17_408  # q, k, o, router, norms
    v = (682_426_368 + 48 * per_layer + 24 * (860_160 + 589_824) + 255_252_480 + 8_192) / 1e9
    assert (row.d_gb, row.v_gb) == pytest.approx((d, v), rel=1e-12)
    # A fixed 50 us a layer, the card's 640 GB/s, the measured 40 GB/s of RAM, and the KV cache of a token generated
    # on an empty cache: half a cell on average of 98,304 B (seed 000 §4.1: 48 x 2 x 4 heads x 128 x 2 B).
    seconds = 48 * 50e-6 + v / 640 + d / 40 + 98_304 * 0.5 / 1e9 / 640
    assert row.tg_tok_s == pytest.approx(1 / seconds, rel=1e-6)  # 66.15 tok/s
    assert (table.tg_low < table.tg_tok_s).all() and (table.tg_tok_s < table.tg_high).all()


def test_budget_reproduces_seed_minimum_n():
    table = budget_table(
        from_constants("seed", SEED_CONSTANTS),
        Device(16 * GB, GB),
        [Workload(c) for c in (8192, 32768, 65536, 200_000)],
    )
    assert table.n_cpu_moe.tolist()[:3] == [12, 18, 27]
    assert table.kv_gb.round(2).tolist()[:3] == [0.81, 3.22, 6.44]
    assert table.budget_gb.round(2).tolist()[:3] == [13.30, 10.89, 7.67]
    assert table.status.tolist()[3] == DOES_NOT_FIT


def test_budget_counts_real_per_layer_bytes():
    even = from_constants("m", {**SEED_CONSTANTS, "layers": 4, "expert": "4GB"})
    heavy_first = [replace(layer, expert_bytes=size) for layer, size in zip(even.layers, [4e9, 1e9, 1e9, 1e9])]
    meta = replace(even, layers=heavy_first)
    table = budget_table(meta, Device(5 * GB, 0), [Workload(1)])
    assert table.resident_layers[0] == 3 and table.n_cpu_moe[0] == 1
