"""Nemotron-H MoE (nemotron_h_moe, e.g. NVIDIA Nemotron-3-Nano-30B-A3B): a per-layer pattern of Mamba-2 layers,
attention layers and MoE FFN layers, each block one kind.

llama.cpp (models/nemotron-h.cpp) tells the kinds apart by two per-layer arrays the converter writes
(conversion/nemotron.py NemotronHModel, granite.py GraniteHybridModel): attention.head_count_kv is non-zero only
on attention layers, feed_forward_length only on MoE layers; a layer with both zero is a Mamba-2 layer. Every
block has its own pre-norm (attn_norm); the MoE layers have sigmoid routing with a score-correction bias
(exp_probs_b), ungated squared-ReLU experts (up/down only) and one ungated shared expert. No RoPE.

The pattern is the published config's hybrid_override_pattern: M = Mamba-2, * = attention, E = MoE.
The optional MTP head (num_nextn_predict_layers) and MoE latent projections (moe_latent_size) of larger
Nemotron 3 models are not written: Nemotron-3-Nano-30B-A3B has neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, globals_, layer, mamba2

ARCHS = ("nemotron_h_moe",)


@dataclass(frozen=True)
class Params(ArchParams):
    layer_pattern: str = ""  # hybrid_override_pattern, one character per layer (M, *, E)
    ssm_conv_kernel: int = 4  # conv_kernel
    ssm_state_size: int = 128  # ssm_state_size
    ssm_group_count: int = 8  # n_groups
    ssm_head_count: int = 64  # mamba_num_heads (the GGUF's ssm.time_step_rank)
    ssm_head_dim: int = 64  # mamba_head_dim (ssm.inner_size = heads x head_dim)
    ssm_conv_bias: bool = True  # use_conv_bias
    n_ff_shexp: int = 0  # moe_shared_expert_intermediate_size
    expert_weights_norm: bool = True  # norm_topk_prob
    expert_weights_scale: float = 1.0  # routed_scaling_factor
    expert_group_count: int = 1  # n_group
    expert_group_used_count: int = 1  # topk_group
    layer_norm_epsilon: float = 1e-5  # layer_norm_epsilon (and norm_eps, the RMS epsilon)


# Mamba/Kimi conv1d weights: written F32 by the converter, never quantized by llama-quantize (llama-quant.cpp).

_KINDS = {"M": "mamba", "*": "attention", "E": "moe"}


def layer_kinds(s: TwinSpec[Params]) -> list[str]:
    pattern = s.params.layer_pattern
    if len(pattern) != s.n_layer or set(pattern) - set(_KINDS):
        raise MoeplaceError(
            f"twin spec {s.name}: layer_pattern {pattern!r} must have one of M, *, E for each of the "
            f"{s.n_layer} layers."
        )
    return [_KINDS[c] for c in pattern]


def _ssm(s: TwinSpec[Params]) -> tuple[int, int, int, int, int]:
    p = s.params
    d_inner = p.ssm_head_count * p.ssm_head_dim
    return p.ssm_conv_kernel, d_inner, p.ssm_state_size, p.ssm_group_count, p.ssm_head_count


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, hd, X = s.n_embd, s.head_dim, s.n_expert
    d_conv, d_inner, d_state, n_group, n_ssm_head = _ssm(s)
    out = globals_(s)
    for il, kind in enumerate(layer_kinds(s)):
        block: Tensors = [("attn_norm.weight", (E,))]
        if kind == "mamba":
            block += mamba2(E, d_inner, d_state, d_conv, n_ssm_head, n_group, s.params.ssm_conv_bias)
        elif kind == "attention":
            block += attention(E, hd * s.n_head, hd * s.n_head_kv)
        else:
            F, S = s.n_ff_exp, s.params.n_ff_shexp
            block += [
                ("ffn_gate_inp.weight", (E, X)),
                ("exp_probs_b.bias", (X,)),
                ("ffn_up_exps.weight", (E, F, X)),
                ("ffn_down_exps.weight", (F, E, X)),
                ("ffn_up_shexp.weight", (E, S)),
                ("ffn_down_shexp.weight", (S, E)),
            ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a, p = s.architecture, s.params
    kinds = layer_kinds(s)
    d_conv, d_inner, d_state, n_group, n_ssm_head = _ssm(s)
    return {
        # Per layer: KV heads only on attention layers, an FFN length only on MoE layers (llama.cpp's is_recr).
        f"{a}.feed_forward_length": [s.n_ff_exp if k == "moe" else 0 for k in kinds],
        f"{a}.attention.head_count_kv": [s.n_head_kv if k == "attention" else 0 for k in kinds],
        f"{a}.attention.layer_norm_rms_epsilon": float(p.layer_norm_epsilon),
        f"{a}.attention.layer_norm_epsilon": float(p.layer_norm_epsilon),
        f"{a}.expert_group_count": p.expert_group_count,
        f"{a}.expert_group_used_count": p.expert_group_used_count,
        f"{a}.vocab_size": s.n_vocab,
        f"{a}.rope.dimension_count": s.head_dim,
        f"{a}.ssm.conv_kernel": d_conv,
        f"{a}.ssm.state_size": d_state,
        f"{a}.ssm.group_count": n_group,
        f"{a}.ssm.inner_size": d_inner,
        f"{a}.ssm.time_step_rank": n_ssm_head,
        f"{a}.rope.scaling.finetuned": False,
        f"{a}.expert_shared_feed_forward_length": p.n_ff_shexp,
        f"{a}.expert_shared_count": s.n_expert_shared,
        f"{a}.expert_weights_norm": bool(p.expert_weights_norm),
        f"{a}.expert_weights_scale": float(p.expert_weights_scale),
    }
