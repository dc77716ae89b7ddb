"""DeepSeek-V2/V3/R1 (deepseek2): MLA attention, leading dense layers, shared experts; V3's sigmoid router with
an expert-score bias (exp_probs_b)."""

from __future__ import annotations

from dataclasses import dataclass

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, dense_ffn, globals_, layer, mla, moe_ffn

ARCHS = ("deepseek2",)


@dataclass(frozen=True)
class Params(ArchParams):
    expert_probs_bias: bool = False  # V3/R1: e_score_correction_bias, written as blk.N.exp_probs_b.bias
    expert_gating_func: int | None = None  # V3/R1: 2 (sigmoid); unset: llama.cpp's softmax (V2)
    expert_weights_norm: bool = False
    expert_weights_scale: float = 1.0


def tensors(s: TwinSpec[Params]) -> Tensors:
    E = s.n_embd
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *mla(s),
            ("ffn_norm.weight", (E,)),
        ]
        if il < s.n_layer_dense_lead:
            block += dense_ffn(E, s.n_ff)
        else:
            bias = (s.n_expert,) if s.params.expert_probs_bias else None
            block += moe_ffn(E, s.n_ff_exp, s.n_expert, s.n_ff_exp * s.n_expert_shared, bias)
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a = s.architecture
    return {
        f"{a}.attention.head_count_kv": 1,
        f"{a}.attention.key_length": s.kv_lora_rank + s.qk_rope_head_dim,
        f"{a}.attention.value_length": s.kv_lora_rank,
        f"{a}.attention.key_length_mla": s.qk_nope_head_dim + s.qk_rope_head_dim,
        f"{a}.attention.value_length_mla": s.v_head_dim,
        f"{a}.attention.q_lora_rank": s.q_lora_rank,
        f"{a}.attention.kv_lora_rank": s.kv_lora_rank,
        f"{a}.rope.dimension_count": s.qk_rope_head_dim,
        f"{a}.leading_dense_block_count": s.n_layer_dense_lead,
        f"{a}.expert_shared_count": s.n_expert_shared,
        f"{a}.expert_weights_scale": float(s.params.expert_weights_scale),
        f"{a}.expert_weights_norm": s.params.expert_weights_norm or None,
        f"{a}.expert_gating_func": s.params.expert_gating_func,
        f"{a}.vocab_size": s.n_vocab,
    }
