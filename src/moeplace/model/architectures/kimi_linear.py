"""Kimi-Linear (kimi-linear): Kimi Delta Attention (KDA, a recurrent linear-attention layer) interleaved with MLA
full-attention layers; leading dense layer(s), then routed experts with shared experts and a router bias.

What llama.cpp's converter writes (conversion/kimi_linear.py) and load_tensors expects (src/models/kimi-linear.cpp):
a KDA layer has its own q/k/v projections, three depthwise convolutions (kept F32), the f/g low-rank gates, beta,
A (-exp(A_log)), dt bias, an output norm; it keeps a recurrent state (llama-hparams.cpp n_embd_r/n_embd_s) and no
KV cache. An MLA layer is deepseek2's split k_b/v_b form, with an uncompressed query (attn_q) when the model has no
q_lora_rank (Kimi-Linear's is null); its cache holds only K rows of kv_lora_rank + qk_rope_head_dim. Which layers
are MLA is the per-layer head_count_kv array (1 for MLA, 0 for KDA), as the converter writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, dense_ffn, globals_, layer, mla, moe_ffn

ARCHS = ("kimi-linear",)


@dataclass(frozen=True)
class Params(ArchParams):
    # linear_attn_config.full_attn_layers: the MLA layers, 1-based as config.json has them
    full_attn_layers: list[int] = field(default_factory=list)
    kda_head_dim: int = 128  # linear_attn_config.head_dim (KDA heads are the model's num_attention_heads)
    ssm_conv_kernel: int = 4  # linear_attn_config.short_conv_kernel_size
    expert_weights_scale: float = 2.446  # routed_scaling_factor
    expert_gating_func: int = 2  # moe_router_activation_func sigmoid (llama.cpp LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)
    expert_group_used_count: int = 1  # topk_group (the converter writes it; one group, so no effect)
    rms_norm_eps: float = 1e-5


# Small depthwise convolutions: the converter writes them F32 and llama-quantize never quantizes "ssm_conv1d".


def _is_mla(s: TwinSpec[Params], il: int) -> bool:
    return il + 1 in s.params.full_attn_layers


def _kda(s: TwinSpec[Params]) -> Tensors:
    E, hd, H = s.n_embd, s.params.kda_head_dim, s.n_head
    inner, conv = hd * H, s.params.ssm_conv_kernel
    return [
        ("ssm_conv1d_q.weight", (conv, 1, inner, 1)),
        ("ssm_conv1d_k.weight", (conv, 1, inner, 1)),
        ("ssm_conv1d_v.weight", (conv, 1, inner, 1)),
        ("attn_q.weight", (E, inner)),
        ("attn_k.weight", (E, inner)),
        ("attn_v.weight", (E, inner)),
        ("ssm_f_a.weight", (E, hd)),
        ("ssm_f_b.weight", (hd, inner)),
        ("ssm_beta.weight", (E, H)),
        ("ssm_a", (1, H, 1, 1)),  # -exp(A_log), HF's (1, 1, H, 1); llama-quantize's copy drops the trailing 1s
        ("ssm_dt.bias", (inner,)),
        ("ssm_g_a.weight", (E, hd)),
        ("ssm_g_b.weight", (hd, inner)),
        ("ssm_norm.weight", (hd,)),
        ("attn_output.weight", (inner, E)),
    ]


def tensors(s: TwinSpec[Params]) -> Tensors:
    E = s.n_embd
    out = globals_(s)
    for il in range(s.n_layer):
        block = [("attn_norm.weight", (E,)), *(mla(s) if _is_mla(s, il) else _kda(s)), ("ffn_norm.weight", (E,))]
        if il < s.n_layer_dense_lead:
            block += dense_ffn(E, s.n_ff)
        else:
            block += [
                *moe_ffn(E, s.n_ff_exp, s.n_expert, s.n_ff_exp * max(s.n_expert_shared, 1), (s.n_expert,)),
            ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a, p = s.architecture, s.params
    keys: GGUFKeys = {
        # The converter turns MLA into MQA (one KV head) and marks KDA layers with 0 KV heads.
        f"{a}.attention.head_count_kv": [1 if _is_mla(s, il) else 0 for il in range(s.n_layer)],
        f"{a}.attention.layer_norm_rms_epsilon": float(p.rms_norm_eps),
        f"{a}.expert_group_used_count": p.expert_group_used_count,
        f"{a}.expert_gating_func": p.expert_gating_func,
        # key_length: the cached latent + rope row; value_length stays config.json's head_dim (V is a view of K).
        f"{a}.attention.key_length": s.kv_lora_rank + s.qk_rope_head_dim,
        f"{a}.vocab_size": s.n_vocab,
        f"{a}.ssm.conv_kernel": p.ssm_conv_kernel,
        f"{a}.kda.head_dim": p.kda_head_dim,
        f"{a}.attention.kv_lora_rank": s.kv_lora_rank,
        f"{a}.rope.dimension_count": s.qk_rope_head_dim,
        f"{a}.attention.key_length_mla": s.qk_nope_head_dim + s.qk_rope_head_dim,
        f"{a}.attention.value_length_mla": s.v_head_dim,
        f"{a}.expert_shared_count": s.n_expert_shared,
        f"{a}.leading_dense_block_count": s.n_layer_dense_lead,
        f"{a}.expert_weights_scale": float(p.expert_weights_scale),
    }
    if s.q_lora_rank:
        keys[f"{a}.attention.q_lora_rank"] = s.q_lora_rank
    return keys
