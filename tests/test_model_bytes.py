"""The bytes moeplace reads from a GGUF header, against bytes by hand: sizes as users write them, each tensor's
role, exact per-tensor bytes of quantized layers, split files read shard by shard, dense models, and the twins
(the Qwen3-30B-A3B twin against the seed's weight split, the same random weights for the same seed)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, SEED_CONSTANTS, write_gguf
from gguf import GGMLQuantizationType as Q

from moeplace.core.errors import MoeplaceError
from moeplace.core.units import GB, parse_size
from moeplace.model.kvcache import kv_bytes, kv_bytes_per_token
from moeplace.model.meta import from_json, is_seed, to_json
from moeplace.model.metadata import from_constants, inspect_model, tensor_role
from moeplace.model.twin import load_spec, write_twin


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
    assert [layer.expert_bytes for layer in meta.layers] == [expert_layer] * 2
    assert meta.layers[0].bytes["attention"] == 256 * 144 + 64 * 144 + 64 * 210 + 256 * 144
    assert meta.layers[0].bytes["router"] == 256 * 4 * 4
    assert meta.layers[0].bytes["norm"] == 2 * 256 * 4
    assert meta.global_bytes == {"token_embd": 1000 * 8 * 34, "output": 1000 * 210, "output_norm": 1024, "other": 0}
    assert meta.expert_bytes == 2 * expert_layer
    assert meta.non_expert_bytes == meta.total_bytes - meta.expert_bytes
    assert (meta.n_expert, meta.n_expert_used, meta.n_ctx_train) == (4, 2, 4096)


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
    assert meta.expert_bytes == 256 * 4 * 144
    assert len(meta.files) == 2
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
    assert (meta.n_expert, meta.expert_bytes) == (0, 0)
    assert meta.layers[0].bytes["dense_ffn"] == 256 * 512 * 2


def test_qwen3_twin_matches_seed_split_and_kv(qwen3_twin):
    meta = inspect_model(qwen3_twin)
    assert (meta.architecture, meta.n_layer, meta.n_expert, meta.n_expert_used) == ("qwen3moe", 48, 128, 8)
    assert meta.expert_bytes / GB == pytest.approx(17.41, rel=0.03)
    # The whole file equals a real Q4_K_M of this model (18.56 GB); the seed's 0.89 GB non-expert
    # figure is a uniform ~4.8 bpw estimate: the real recipe keeps the router F32 and output Q6_K.
    assert meta.total_bytes / GB == pytest.approx(18.55, rel=0.01)
    assert kv_bytes_per_token(meta) == 98_304  # seed 000 §4.1
    assert kv_bytes(meta, 32768) == 98_304 * 32768
    assert qwen3_twin.stat().st_blocks * 512 < 50_000_000  # sparse: the weights are not written


def test_random_twin_f16_is_the_same_bytes_for_the_same_seed(tmp_path):
    """Quant types of one twin are made from one F16: the same spec and seed write the same file."""
    spec = load_spec(ROOT / "config/models/tiny-qwen3moe.yaml")
    a, b, c = (write_twin(spec, tmp_path / f"{n}.gguf", "random", seed) for n, seed in (("a", 0), ("b", 0), ("c", 1)))
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_dense_twin_is_reported_dense(tmp_path):
    meta = inspect_model(write_twin(load_spec(ROOT / "config/models/qwen3-1.7b.yaml"), tmp_path / "dense.gguf"))
    assert meta.n_expert == 0 and meta.expert_bytes == 0 and meta.n_layer == 28


def test_the_stored_metadata_reads_back_as_the_model_it_describes(tmp_path):
    """results/metadata/{model}.json (to_json) reads back equal (from_json), for a GGUF model and the seed's."""
    gguf = inspect_model(write_twin(load_spec(ROOT / "config/models/tiny-gpt-oss.yaml"), tmp_path / "t.gguf", "none"))
    seed = from_constants("seed", SEED_CONSTANTS)
    for meta in (gguf.named("tiny"), seed):
        stored = json.loads(json.dumps(to_json(meta)))
        assert from_json(stored) == meta and stored["source"] == meta.source
    assert is_seed(from_json(to_json(seed))) and not is_seed(gguf)
    assert from_json(to_json(gguf)).rope_yarn == gguf.rope_yarn and gguf.layers[0].has_kv
