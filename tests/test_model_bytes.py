"""Extract, KV, predict and budget against hand-computed bytes and the seed's numbers (seed 000 §5.3-5.4)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, SEED_CONSTANTS, write_gguf
from gguf import GGMLQuantizationType as Q

from moeplace.core.config import Bandwidths, Device
from moeplace.core.errors import MoeplaceError
from moeplace.core.units import GB, parse_size
from moeplace.model.kvcache import cells, kv_bytes, kv_bytes_per_token, layer_kv_bytes, row_size
from moeplace.model.memory import Workload
from moeplace.model.metadata import from_constants, inspect_model, tensor_role
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.budget import DOES_NOT_FIT, budget_table
from moeplace.plan.predict import predict_table

SEED_TOK_S = {0: 323, 8: 168, 16: 113, 18: 105, 24: 86, 32: 69, 48: 49}


@pytest.fixture(scope="module")
def qwen3_twin(tmp_path_factory) -> Path:
    return write_twin(
        load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml"), tmp_path_factory.mktemp("twin") / "qwen3-coder.gguf"
    )


def test_sizes_parse_units():
    assert parse_size("16GB") == 16 * 10**9
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("512 MiB") == 512 * 2**20
    for bad in ("16", "sixteen GB", "16 parsecs", 16):
        with pytest.raises(MoeplaceError, match="16GB"):
            parse_size(bad)


@pytest.mark.parametrize(
    "suffix,role",
    [
        ("ffn_up_exps.weight", "expert"),
        ("ffn_gate_up_exps.weight", "expert"),
        ("ffn_down_chexps.weight", "expert"),
        ("ffn_gate_exps.bias", "expert"),
        ("ffn_gate_inp.weight", "router"),
        ("exp_probs_b.bias", "router"),
        ("ffn_up_shexp.weight", "shared_expert"),
        ("ffn_gate_inp_shexp.weight", "shared_expert"),
        ("ffn_down.weight", "dense_ffn"),
        ("attn_q_norm.weight", "norm"),
        ("ffn_norm.weight", "norm"),
        ("attn_kv_a_mqa.weight", "attention"),
        ("attn_sinks.weight", "attention"),
        ("ssm_conv1d.weight", "other"),
    ],
)
def test_tensor_roles(suffix, role):
    assert tensor_role(suffix) == role


def test_inspect_counts_exact_bytes(small_moe):
    meta = inspect_model(small_moe)
    # Q4_K: 144 B per 256; Q6_K: 210 B per 256; Q8_0: 34 B per 32; F32: 4 B.
    expert_layer = 2 * (256 * 4 * 144) + 256 * 4 * 210  # gate+up rows of 256, down rows of 256
    assert [layer["expert_bytes"] for layer in meta["layers"]] == [expert_layer] * 2
    assert meta["layers"][0]["bytes"]["attention"] == 256 * 144 + 64 * 144 + 64 * 210 + 256 * 144
    assert meta["layers"][0]["bytes"]["router"] == 256 * 4 * 4
    assert meta["layers"][0]["bytes"]["norm"] == 2 * 256 * 4
    assert meta["global_bytes"] == {"token_embd": 1000 * 8 * 34, "output": 1000 * 210, "output_norm": 1024, "other": 0}
    assert meta["expert_bytes"] == 2 * expert_layer
    assert meta["non_expert_bytes"] == meta["total_bytes"] - meta["expert_bytes"]
    assert (meta["n_expert"], meta["n_expert_used"], meta["n_ctx_train"]) == (4, 2, 4096)


def test_split_model_reads_every_shard(tmp_path, small_moe):
    keys = {
        "block_count": 1,
        "embedding_length": 256,
        "attention.head_count": 4,
        "expert_count": 4,
        "expert_used_count": 2,
    }
    exps = [("blk.0.ffn_up_exps.weight", (256, 256, 4), Q.Q4_K)]
    rest = [("token_embd.weight", (256, 10), Q.F16), ("blk.0.attn_k.weight", (256, 64), Q.F16)]
    write_gguf(
        tmp_path / "m-00001-of-00002.gguf",
        "qwen3moe",
        keys,
        rest,
        {"split.no": 0, "split.count": 2, "split.tensors.count": 3},
    )
    write_gguf(
        tmp_path / "m-00002-of-00002.gguf",
        "qwen3moe",
        {},
        exps,
        {"split.no": 1, "split.count": 2, "split.tensors.count": 3},
    )
    meta = inspect_model(tmp_path / "m-00002-of-00002.gguf")
    assert meta["expert_bytes"] == 256 * 4 * 144
    assert len(meta["files"]) == 2
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(MoeplaceError, match="missing shard"):
        inspect_model(tmp_path / "m-00001-of-00002.gguf")


def test_dense_model_is_dense_not_an_error(tmp_path):
    keys = {"block_count": 1, "embedding_length": 256, "attention.head_count": 4}
    tensors = [
        ("token_embd.weight", (256, 10), Q.F16),
        ("blk.0.attn_k.weight", (256, 256), Q.F16),
        ("blk.0.ffn_up.weight", (256, 512), Q.F16),
    ]
    meta = inspect_model(write_gguf(tmp_path / "dense.gguf", "llama", keys, tensors))
    assert (meta["n_expert"], meta["expert_bytes"]) == (0, 0)
    assert meta["layers"][0]["bytes"]["dense_ffn"] == 256 * 512 * 2


def test_qwen3_twin_matches_seed_split_and_kv(qwen3_twin):
    meta = inspect_model(qwen3_twin)
    assert (meta["architecture"], meta["n_layer"], meta["n_expert"], meta["n_expert_used"]) == ("qwen3moe", 48, 128, 8)
    assert meta["expert_bytes"] / GB == pytest.approx(17.41, rel=0.03)
    # The whole file equals a real Q4_K_M of this model (18.56 GB); the seed's 0.89 GB non-expert
    # figure is a uniform ~4.8 bpw estimate: the real recipe keeps the router F32 and output Q6_K.
    assert meta["total_bytes"] / GB == pytest.approx(18.55, rel=0.01)
    assert kv_bytes_per_token(meta) == 98_304  # seed 000 §4.1
    assert kv_bytes(meta, 32768) == 98_304 * 32768
    assert qwen3_twin.stat().st_blocks * 512 < 50_000_000  # sparse: the weights are not written


def test_kv_cache_types_and_padding(qwen3_twin):
    meta = inspect_model(qwen3_twin)
    assert row_size("q8_0", 512) == 16 * 34 and row_size("q4_0", 512) == 16 * 18
    assert kv_bytes(meta, 32768, "q8_0", "q8_0") == 48 * 32768 * 2 * 16 * 34
    assert kv_bytes(meta, 1000) == kv_bytes(meta, 1024)  # llama.cpp pads to 256 cells
    with pytest.raises(MoeplaceError, match="unknown KV cache type"):
        kv_bytes(meta, 1000, "q3_k")


def test_sliding_window_layers_hold_only_their_window(tmp_path):
    spec = load_spec(ROOT / "tests/specs/tiny-gpt-oss.yaml")
    meta = inspect_model(write_twin(spec, tmp_path / "swa.gguf"))
    assert [layer["swa"] for layer in meta["layers"]] == [True, False] * (spec.n_layer // 2)
    per_layer = layer_kv_bytes(meta, 32768)
    row = 2 * spec.n_head_kv * spec.head_dim * 2
    assert per_layer[0] == cells(32768, spec.sliding_window) * row == 768 * row  # pad(128 + 512, 256)
    assert per_layer[1] == 32768 * row


def test_mla_caches_only_the_latent(tmp_path):
    spec = load_spec(ROOT / "config/models/tiny-deepseek2.yaml")
    meta = inspect_model(write_twin(spec, tmp_path / "mla.gguf"))
    assert meta["attention"]["mla"]
    assert kv_bytes(meta, 4096) == spec.n_layer * 4096 * (spec.kv_lora_rank + spec.qk_rope_head_dim) * 2
    assert meta["layers"][0]["bytes"]["dense_ffn"] > 0 and meta["layers"][0]["expert_bytes"] == 0
    assert meta["layers"][1]["bytes"]["shared_expert"] > 0


def test_hybrid_layers_keep_a_recurrent_state_per_sequence(tmp_path):
    """Nemotron-H-like shape: one attention layer, one Mamba-2 layer (d_conv 4, d_inner 8192, d_state 128,
    8 groups): llama.cpp's state is f32 (d_conv-1)(d_inner + 2 groups d_state) + d_state d_inner per sequence."""
    from moeplace.model.memory import Workload, device_need

    keys = {"block_count": 2, "embedding_length": 4096, "attention.head_count": 32, "attention.head_count_kv": [0, 8],
            "ssm.conv_kernel": 4, "ssm.inner_size": 8192, "ssm.state_size": 128, "ssm.group_count": 8}  # fmt: skip
    tensors = [
        ("token_embd.weight", (4096, 16), Q.F16),
        ("blk.0.ssm_in.weight", (4096, 64), Q.F16),
        ("blk.1.attn_k.weight", (4096, 1024), Q.F16),
    ]
    meta = inspect_model(write_gguf(tmp_path / "hybrid.gguf", "nemotron_h", keys, tensors))
    state = 4 * (3 * (8192 + 2 * 8 * 128) + 128 * 8192)
    assert [layer["state_bytes"] for layer in meta["layers"]] == [state, 0]
    assert [layer["has_kv"] for layer in meta["layers"]] == [False, True]
    one, two = (device_need(meta, Workload(4096, parallel=n), 0).kv for n in (1, 2))
    assert one == kv_bytes(meta, 4096) + state and two == 2 * one


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
    meta = from_constants("m", {**SEED_CONSTANTS, "layers": 4, "expert": "4GB"})
    for layer, size in zip(meta["layers"], [4e9, 1e9, 1e9, 1e9]):  # a heavy first layer
        layer["expert_bytes"] = size
    table = budget_table(meta, Device(5 * GB, 0), [Workload(1)])
    assert table.resident_layers[0] == 3 and table.n_cpu_moe[0] == 1


def test_random_twin_f16_is_the_same_bytes_for_the_same_seed(tmp_path):
    """Quant types of one twin are made from one F16: the same spec and seed write the same file."""
    spec = load_spec(ROOT / "config/models/tiny-qwen3moe.yaml")
    a, b, c = (write_twin(spec, tmp_path / f"{n}.gguf", "random", seed) for n, seed in (("a", 0), ("b", 0), ("c", 1)))
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_dense_twin_is_reported_dense(tmp_path):
    meta = inspect_model(write_twin(load_spec(ROOT / "config/models/qwen3-1.7b.yaml"), tmp_path / "dense.gguf"))
    assert meta["n_expert"] == 0 and meta["expert_bytes"] == 0 and meta["n_layer"] == 28
