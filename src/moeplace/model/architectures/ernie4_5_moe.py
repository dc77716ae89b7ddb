"""ERNIE-4.5 MoE (ernie4_5-moe): leading dense layer(s), then MoE layers with shared experts and an expert-score
correction bias (exp_probs_b), softmax routing, tied or untied output.

llama.cpp (src/models/ernie4-5.cpp) gives every layer from leading_dense_block_count on the MoE tensors; only
the graph consults interleave_moe_layer_step ((il + 1) % step == 0), so a twin llama.cpp loads and runs has
step 1, as the published models do (moe_layer_interval 1). The converter (conversion/ernie.py
Ernie4_5MoeModel) writes the shared experts' width as intermediate_size // num_key_value_heads, which for the
published models equals moe_intermediate_size x moe_num_shared_experts, the tensors' real width used here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, dense_ffn, globals_, layer, moe_ffn

ARCHS = ("ernie4_5-moe",)


@dataclass(frozen=True)
class Params(ArchParams):
    moe_layer_step: int = 1


def _check(s: TwinSpec[Params]) -> None:
    if s.params.moe_layer_step != 1:
        raise MoeplaceError(
            f"twin spec {s.name}: ernie4_5-moe with moe_layer_step {s.params.moe_layer_step} does not load in "
            "llama.cpp (its loader expects MoE tensors in every layer after the leading dense ones); use 1."
        )


def tensors(s: TwinSpec[Params]) -> Tensors:
    _check(s)
    E, hd, X = s.n_embd, s.head_dim, s.n_expert
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *attention(E, hd * s.n_head, hd * s.n_head_kv),
            ("ffn_norm.weight", (E,)),
        ]
        if il < s.n_layer_dense_lead:
            block += dense_ffn(E, s.n_ff)
        else:
            # e_score_correction_bias is [1, n_expert] in the checkpoint; the converter keeps both dims.
            block += moe_ffn(E, s.n_ff_exp, X, s.n_ff_exp * s.n_expert_shared, (X, 1))
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a = s.architecture
    return {
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{a}.interleave_moe_layer_step": s.params.moe_layer_step,
        f"{a}.leading_dense_block_count": s.n_layer_dense_lead,
        f"{a}.expert_shared_count": s.n_expert_shared,
        f"{a}.expert_shared_feed_forward_length": s.n_ff_exp * s.n_expert_shared if s.n_expert_shared else None,
    }
