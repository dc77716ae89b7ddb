"""Qwen3-Next (qwen3next): gated-delta-net linear-attention layers with one full gated-attention layer every
`full_attention_interval` layers, every layer MoE with a gated shared expert; an optional MTP (NextN) block.

Names and shapes are llama.cpp's (src/models/qwen3next.cpp load_arch_tensors), as its converter writes them
(conversion/qwen.py Qwen3NextModel): in_proj_qkvz split into attn_qkv + attn_gate, in_proj_ba as ssm_ba, A_log
as ssm_a, dt_bias as ssm_dt.bias, the squeezed conv1d as ssm_conv1d (kept F32), shared_expert_gate (1 x n_embd)
as ffn_gate_inp_shexp. The recurrent state sizes follow from the ssm.* keys the converter derives from the
linear_* hyperparameters (llama-hparams.cpp n_embd_r/n_embd_s).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, dense_ffn, gated_attention, globals_, layer, nextn, routed_experts

ARCHS = ("qwen3next",)


# Hyperparameters under their config.json names (the converter's sources).
@dataclass(frozen=True)
class Params(ArchParams):
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4  # linear_conv_kernel_dim
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    n_ff_shexp: int = 512  # shared_expert_intermediate_size
    partial_rotary_factor: float = 0.25
    # MTP blocks appended after the main layers: the pinned converter writes Qwen3-Next's one unless run with
    # --no-mtp; llama.cpp skips them unless asked to load MTP (--mtp / load_mtp), and GGUFs converted before
    # MTP export (the published ones) have none, hence 0.
    nextn_predict_layers: int = 0


# llama-quantize leaves the small convolution in its source type (llama-quant.cpp: "ssm_conv1d"); the shared
# expert's gate is 1 x n_embd (one dimension to ggml_n_dims), F32 from the converter.


def is_recurrent(s: TwinSpec[Params], il: int) -> bool:
    """llama.cpp's default layer pattern (load_arch_hparams): the last of every interval is full attention."""
    return il < s.n_layer - s.params.nextn_predict_layers and (il + 1) % s.params.full_attention_interval != 0


def _linear_dims(s: TwinSpec[Params]) -> tuple[int, int]:
    p = s.params
    if p.linear_key_head_dim != p.linear_value_head_dim:
        # llama.cpp sizes both head kinds from ssm.state_size (the key head dim).
        raise MoeplaceError(
            f"twin spec {s.name}: qwen3next needs linear_key_head_dim == linear_value_head_dim "
            f"({p.linear_key_head_dim} != {p.linear_value_head_dim})."
        )
    if p.linear_num_value_heads % p.linear_num_key_heads:
        raise MoeplaceError(f"twin spec {s.name}: linear_num_value_heads must be a multiple of linear_num_key_heads.")
    if not 0 <= p.nextn_predict_layers < s.n_layer:
        raise MoeplaceError(f"twin spec {s.name}: nextn_predict_layers must leave a trunk layer of the {s.n_layer}.")
    key_dim = p.linear_key_head_dim * p.linear_num_key_heads
    value_dim = p.linear_value_head_dim * p.linear_num_value_heads
    return key_dim, value_dim


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, hd, p = s.n_embd, s.head_dim, s.params
    key_dim, value_dim = _linear_dims(s)
    n_v_heads = p.linear_num_value_heads
    moe = [
        ("ffn_gate_inp.weight", (E, s.n_expert)),
        *routed_experts(E, s.n_ff_exp, s.n_expert),
        ("ffn_gate_inp_shexp.weight", (E, 1)),
        *dense_ffn(E, p.n_ff_shexp, "_shexp"),
    ]
    attention = gated_attention(E, hd, s.n_head, s.n_head_kv)
    linear = [
        ("attn_qkv.weight", (E, 2 * key_dim + value_dim)),
        ("attn_gate.weight", (E, value_dim)),
        ("ssm_conv1d.weight", (p.ssm_conv_kernel, 2 * key_dim + value_dim)),
        ("ssm_dt.bias", (n_v_heads,)),
        ("ssm_a", (n_v_heads,)),
        ("ssm_ba.weight", (E, 2 * n_v_heads)),
        ("ssm_norm.weight", (p.linear_value_head_dim,)),
        ("ssm_out.weight", (value_dim, E)),
    ]
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *(linear if is_recurrent(s, il) else attention),
            ("post_attention_norm.weight", (E,)),
            *moe,
        ]
        if il >= s.n_layer - p.nextn_predict_layers:  # an MTP block: a full-attention layer and its projection
            block += nextn(E)
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a, p = s.architecture, s.params
    _, value_dim = _linear_dims(s)
    n_nextn = p.nextn_predict_layers
    keys: GGUFKeys = {
        f"{a}.expert_shared_feed_forward_length": p.n_ff_shexp,
    }
    if n_nextn:
        keys[f"{a}.nextn_predict_layers"] = n_nextn
    keys.update(
        {
            f"{a}.ssm.conv_kernel": p.ssm_conv_kernel,
            f"{a}.ssm.state_size": p.linear_key_head_dim,
            f"{a}.ssm.group_count": p.linear_num_key_heads,
            f"{a}.ssm.time_step_rank": p.linear_num_value_heads,
            f"{a}.ssm.inner_size": value_dim,
            # transformers fills config.layer_types, so the converter writes the per-layer array (MTP blocks False)
            f"{a}.attention.recurrent_layers": [is_recurrent(s, il) for il in range(s.n_layer)],
            f"{a}.full_attention_interval": p.full_attention_interval,
            f"{a}.rope.dimension_count": int(s.head_dim * p.partial_rotary_factor),
        }
    )
    return keys
