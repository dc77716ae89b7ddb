"""MiniMax-M2 (minimax-m2): every layer MoE (no shared expert), sigmoid routing with an expert-score correction
bias (exp_probs_b), whole-width Q/K RMS norms (over all heads, not per head) and partial RoPE (rotary_dim of
head_dim).

Shapes from llama.cpp src/models/minimax-m2.cpp; keys from conversion/minimax.py MiniMaxM2Model: the experts'
width as both feed_forward_length and expert_feed_forward_length, rope.dimension_count = rotary_dim, and
expert_gating_func sigmoid (config.json's scoring_func).
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, globals_, layer, moe_ffn

ARCHS = ("minimax-m2",)


@dataclass(frozen=True)
class Params(ArchParams):
    rotary_dim: int = 64


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, hd, X = s.n_embd, s.head_dim, s.n_expert
    q, kv = hd * s.n_head, hd * s.n_head_kv
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *attention(E, q, kv),
            ("attn_q_norm.weight", (q,)),
            ("attn_k_norm.weight", (kv,)),
            ("ffn_norm.weight", (E,)),
            *moe_ffn(E, s.n_ff_exp, X, probs_bias=(X,)),
        ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a = s.architecture
    return {
        f"{a}.rope.dimension_count": s.params.rotary_dim,
        f"{a}.expert_gating_func": int(gguf.ExpertGatingFuncType.SIGMOID),
    }
