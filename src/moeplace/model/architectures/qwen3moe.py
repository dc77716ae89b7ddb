"""Qwen3-MoE (qwen3moe) and its dense sibling Qwen3 (qwen3: the ceilings stage's compute model)."""

from __future__ import annotations

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, dense_ffn, globals_, layer, moe_ffn

ARCHS = ("qwen3moe", "qwen3")
Params = ArchParams  # no hyperparameters of its own


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, hd = s.n_embd, s.head_dim
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *attention(E, hd * s.n_head, hd * s.n_head_kv),
            ("attn_q_norm.weight", (hd,)),
            ("attn_k_norm.weight", (hd,)),
            ("ffn_norm.weight", (E,)),
        ]
        if s.architecture == "qwen3moe":
            block += moe_ffn(E, s.n_ff_exp, s.n_expert)
        else:
            block += dense_ffn(E, s.n_ff)
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    return {}
