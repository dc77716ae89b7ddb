"""GLM-4.5 / GLM-4.5-Air (glm4moe): leading dense layer(s), MoE layers with one shared expert and a sigmoid router
with an expert-probability bias (exp_probs_b), attention with q/k/v biases and partial RoPE, and NextN/MTP layer(s)
appended at the end.

As llama.cpp's converter (conversion/glm.py Glm4MoeModel) writes it, block_count counts the NextN layers too
(num_hidden_layers + num_nextn_predict_layers), so a spec's n_layer is that block count and the last
`nextn_predict_layers` of them are the MTP block(s): a full MoE layer plus the nextn.* tensors, which llama.cpp
loads but does not run (or cache) for the main context (models/glm4-moe.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, dense_ffn, globals_, layer, moe_ffn, nextn

ARCHS = ("glm4moe",)


@dataclass(frozen=True)
class Params(ArchParams):
    nextn_predict_layers: int = 1  # NextN/MTP blocks at the end of n_layer
    partial_rotary_factor: float = 0.5  # rope.dimension_count = head_dim * this
    qk_norm: bool = False  # attn_q_norm/attn_k_norm (GLM-4.5 355B has them, GLM-4.5-Air not)
    expert_group_count: int = 1  # n_group
    expert_group_used_count: int = 1  # topk_group
    expert_weights_scale: float = 1.0  # routed_scaling_factor
    expert_weights_norm: bool = True  # norm_topk_prob
    rms_norm_eps: float = 1e-5


def _attention(s: TwinSpec[Params]) -> Tensors:
    E, hd = s.n_embd, s.head_dim
    q, kv = hd * s.n_head, hd * s.n_head_kv
    out: Tensors = [
        ("attn_norm.weight", (E,)),
        *attention(E, q, kv, bias=True),
    ]
    if s.params.qk_norm:
        out += [("attn_q_norm.weight", (hd,)), ("attn_k_norm.weight", (hd,))]
    return out + [("post_attention_norm.weight", (E,))]


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, X = s.n_embd, s.n_expert
    n_main = s.n_layer - s.params.nextn_predict_layers
    if not 0 < n_main <= s.n_layer:
        raise MoeplaceError(f"twin spec {s.name}: nextn_predict_layers must leave a trunk layer of the {s.n_layer}.")
    out = globals_(s)
    for il in range(s.n_layer):
        block = _attention(s)
        if il < s.n_layer_dense_lead:
            block += dense_ffn(E, s.n_ff)
        else:
            block += moe_ffn(E, s.n_ff_exp, X, s.n_ff_exp * s.n_expert_shared, (X,))
        if il >= n_main:  # the NextN/MTP block (HF model.layers.{n_main}.eh_proj/enorm/hnorm/shared_head/...)
            block += nextn(E, s.n_vocab)
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a, p = s.architecture, s.params
    return {
        f"{a}.attention.layer_norm_rms_epsilon": float(p.rms_norm_eps),
        f"{a}.expert_group_count": p.expert_group_count,
        f"{a}.expert_group_used_count": p.expert_group_used_count,
        f"{a}.rope.dimension_count": int(s.head_dim * p.partial_rotary_factor),
        f"{a}.expert_shared_count": s.n_expert_shared,
        f"{a}.leading_dense_block_count": s.n_layer_dense_lead,
        f"{a}.expert_gating_func": int(gguf.ExpertGatingFuncType.SIGMOID),
        f"{a}.expert_weights_scale": float(p.expert_weights_scale),
        f"{a}.expert_weights_norm": bool(p.expert_weights_norm),
        f"{a}.nextn_predict_layers": p.nextn_predict_layers,
    }
