"""Qwen3.5/3.6 MoE (qwen35moe): gated-delta-net (linear attention) layers with every k-th layer gated full
attention, routed experts plus one sigmoid-gated shared expert in every layer, and optionally a NextN/MTP block at
the end.

Text model only: the published checkpoints carry a vision tower, which llama.cpp's converter leaves to a
separate mmproj file. Shapes follow llama.cpp's load_arch_tensors (src/models/qwen35moe.cpp), keys and types the
converter (conversion/qwen.py: Qwen3_5MoeTextModel <- Qwen3NextModel <- _QwenMtpMixin <- Qwen2MoeModel).

The spec's n_layer is the GGUF's block_count: the trunk's num_hidden_layers plus nextn_predict_layers MTP blocks.
The published GGUFs have none (the converter drops the checkpoint's mtp.* tensors unless its config names
mtp_num_hidden_layers; config/models/qwen3.6-35b-a3b.yaml), so 0 is the default; files made for speculative decoding
append one (block_count 41 for Qwen3.6-35B-A3B). llama.cpp loads the MTP block's tensors only for speculative decoding
(load_mtp), keeps no KV or recurrent state for it in the main context, and llama-quantize sees it as layer n_layer - 1
of n_layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, dense_ffn, gated_attention, globals_, layer, nextn, routed_experts

ARCHS = ("qwen35moe",)


@dataclass(frozen=True)
class Params(ArchParams):
    nextn_predict_layers: int = 0  # MTP blocks at the end of block_count (published GGUFs: none; MTP files: 1)
    full_attention_interval: int = 4  # layer il of the trunk is full attention when (il + 1) % interval == 0
    n_ff_shexp: int = 512  # shared_expert_intermediate_size
    rope_dimension_count: int = 64  # head_dim * partial_rotary_factor
    # rope_parameters.mrope_section, padded to 4
    rope_sections: list[int] = field(default_factory=lambda: [11, 11, 10, 0])
    ssm_conv_kernel: int = 4  # linear_conv_kernel_dim
    linear_key_head_dim: int = 128  # ssm.state_size (llama.cpp takes the value head dim to be the same)
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16  # ssm.group_count
    linear_num_value_heads: int = 32  # ssm.time_step_rank


def _check(s: TwinSpec[Params]) -> None:
    p = s.params
    if p.linear_key_head_dim != p.linear_value_head_dim:
        raise MoeplaceError(f"twin spec {s.name}: qwen35moe needs linear_key_head_dim == linear_value_head_dim.")
    if p.linear_num_value_heads % p.linear_num_key_heads:
        raise MoeplaceError(f"twin spec {s.name}: linear_num_value_heads must be a multiple of linear_num_key_heads.")
    if not 0 <= p.nextn_predict_layers < s.n_layer:
        raise MoeplaceError(f"twin spec {s.name}: nextn_predict_layers must leave a trunk layer of the {s.n_layer}.")


def recurrent_layers(s: TwinSpec[Params]) -> list[bool]:
    """Which blocks are gated-delta-net layers (the converter's attention.recurrent_layers): the trunk's, except
    every full_attention_interval-th; MTP blocks are full attention."""
    n_trunk = s.n_layer - s.params.nextn_predict_layers
    k = s.params.full_attention_interval
    return [il < n_trunk and (il + 1) % k != 0 for il in range(s.n_layer)]


def _moe(s: TwinSpec[Params]) -> Tensors:
    """Routed experts, router, gated shared expert (HF mlp.*, in the checkpoint's name order)."""
    E = s.n_embd
    gate, up, down = routed_experts(E, s.n_ff_exp, s.n_expert)
    shared_gate, shared_up, shared_down = dense_ffn(E, s.params.n_ff_shexp, "_shexp")
    return [
        down,
        gate,
        up,
        ("ffn_gate_inp.weight", (E, s.n_expert)),
        shared_down,
        shared_gate,
        shared_up,
        ("ffn_gate_inp_shexp.weight", (E, 1)),  # HF shared_expert_gate: Linear(n_embd, 1), not squeezed
    ]


def _linear_attention(s: TwinSpec[Params]) -> Tensors:
    """Gated delta net: fused QKV input projection feeding a short convolution, output gate z, decay (alpha, A,
    dt) and beta projections, gated RMS norm over a value head, output projection."""
    p, E = s.params, s.n_embd
    head_dim, n_v = p.linear_key_head_dim, p.linear_num_value_heads
    key_dim, value_dim = head_dim * p.linear_num_key_heads, head_dim * n_v
    return [
        ("ssm_a", (n_v,)),  # -exp(A_log); no .weight suffix
        ("ssm_conv1d.weight", (p.ssm_conv_kernel, 2 * key_dim + value_dim)),
        ("ssm_dt.bias", (n_v,)),
        ("ssm_alpha.weight", (E, n_v)),
        ("ssm_beta.weight", (E, n_v)),
        ("attn_qkv.weight", (E, 2 * key_dim + value_dim)),
        ("attn_gate.weight", (E, value_dim)),
        ("ssm_norm.weight", (head_dim,)),
        ("ssm_out.weight", (value_dim, E)),
    ]


def tensors(s: TwinSpec[Params]) -> Tensors:
    _check(s)
    E = s.n_embd
    attention = gated_attention(E, s.head_dim, s.n_head, s.n_head_kv)
    recurrent = recurrent_layers(s)
    n_trunk = s.n_layer - s.params.nextn_predict_layers
    out = globals_(s)
    for il in range(s.n_layer):
        if il >= n_trunk:
            # MTP block (HF mtp.*): fc, the decoder layer (full attention + MoE), norm, pre-fc norms.
            block = [
                ("attn_norm.weight", (E,)),
                *_moe(s),
                ("post_attention_norm.weight", (E,)),
                *attention,
                *nextn(E),
            ]
        elif recurrent[il]:
            block = [("attn_norm.weight", (E,)), *_linear_attention(s), *_moe(s), ("post_attention_norm.weight", (E,))]
        else:
            block = [("attn_norm.weight", (E,)), *_moe(s), ("post_attention_norm.weight", (E,)), *attention]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    _check(s)
    a, p = s.architecture, s.params
    keys: GGUFKeys = {
        # No intermediate_size in the config: the converter writes no feed_forward_length.
        f"{a}.feed_forward_length": None,
        f"{a}.rope.dimension_sections": list(p.rope_sections),
        f"{a}.expert_shared_feed_forward_length": p.n_ff_shexp,
        f"{a}.ssm.conv_kernel": p.ssm_conv_kernel,
        f"{a}.ssm.state_size": p.linear_key_head_dim,
        f"{a}.ssm.group_count": p.linear_num_key_heads,
        f"{a}.ssm.time_step_rank": p.linear_num_value_heads,
        f"{a}.ssm.inner_size": p.linear_value_head_dim * p.linear_num_value_heads,
        f"{a}.attention.recurrent_layers": recurrent_layers(s),
        f"{a}.full_attention_interval": p.full_attention_interval,
        f"{a}.rope.dimension_count": p.rope_dimension_count,
    }
    if p.nextn_predict_layers:
        keys[f"{a}.nextn_predict_layers"] = p.nextn_predict_layers
    return keys
