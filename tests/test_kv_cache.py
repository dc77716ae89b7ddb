"""The KV cache's bytes against llama.cpp's layout by hand: cache types and 256-cell padding, sliding-window
layers holding only their window, MLA caching only the latent, and a hybrid model's recurrent state per sequence."""

from __future__ import annotations

import pytest
from conftest import ROOT, write_gguf
from gguf import GGMLQuantizationType as Q

from moeplace.core.errors import MoeplaceError
from moeplace.model.kvcache import cells, kv_bytes, layer_kv_bytes, row_size
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin


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
    assert [layer.swa for layer in meta.layers] == [True, False] * (spec.n_layer // 2)
    per_layer = layer_kv_bytes(meta, 32768)
    row = 2 * spec.n_head_kv * spec.head_dim * 2
    assert per_layer[0] == cells(32768, spec.sliding_window) * row == 768 * row  # pad(128 + 512, 256)
    assert per_layer[1] == 32768 * row


def test_mla_caches_only_the_latent(tmp_path):
    spec = load_spec(ROOT / "config/models/tiny-deepseek2.yaml")
    meta = inspect_model(write_twin(spec, tmp_path / "mla.gguf"))
    assert meta.attention.mla
    assert kv_bytes(meta, 4096) == spec.n_layer * 4096 * (spec.kv_lora_rank + spec.qk_rope_head_dim) * 2
    assert meta.layers[0].bytes["dense_ffn"] > 0 and meta.layers[0].expert_bytes == 0
    assert meta.layers[1].bytes["shared_expert"] > 0


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
    assert [layer.state_bytes for layer in meta.layers] == [state, 0]
    assert [layer.has_kv for layer in meta.layers] == [False, True]
    one, two = (device_need(meta, Workload(4096, parallel=n), 0).kv for n in (1, 2))
    assert one == kv_bytes(meta, 4096) + state and two == 2 * one
