"""Liquid LFM2-MoE (lfm2moe): gated short-convolution layers interleaved with grouped-query attention layers,
leading dense feed-forward layers, then sigmoid-routed experts with a per-expert routing bias.

llama.cpp (src/models/lfm2moe.cpp, conversion/lfm2.py LFM2MoeModel): a layer is attention where
attention.head_count_kv[il] > 0, a short convolution (shortconv.conv/in_proj/out_proj, state of
shortconv.l_cache - 1 columns) where it is 0. The final norm is named token_embd_norm; the output matrix is
tied to the embedding. The converter writes no key/value length (llama.cpp derives n_embd / n_head).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, dense_ffn, layer, moe_ffn

ARCHS = ("lfm2moe",)


@dataclass(frozen=True)
class Params(ArchParams):
    # indices of the full-attention layers (layer_types == "full_attention"); others conv
    attention_layers: list[int] = field(default_factory=list)
    conv_l_cache: int = 3  # conv_L_cache: the short convolution's kernel length
    norm_eps: float = 1e-5  # norm_eps


# llama-quantize never quantizes the short convolution's (l_cache x n_embd) kernel (llama-quant.cpp).


def _check(s: TwinSpec[Params]) -> None:
    bad = [il for il in s.params.attention_layers if not 0 <= il < s.n_layer]
    if bad:
        raise MoeplaceError(f"twin spec {s.name}: attention_layers {bad} outside 0..{s.n_layer - 1}")
    if s.head_dim * s.n_head != s.n_embd:
        raise MoeplaceError(f"twin spec {s.name}: lfm2moe needs head_dim x n_head == n_embd (llama.cpp derives it)")


def tensors(s: TwinSpec[Params]) -> Tensors:
    _check(s)
    E, X = s.n_embd, s.n_expert
    kv = s.head_dim * s.n_head_kv
    attention_layers = set(s.params.attention_layers)
    out: Tensors = [("token_embd.weight", (E, s.n_vocab)), ("token_embd_norm.weight", (E,))]
    if not s.tied_output:
        out.append(("output.weight", (E, s.n_vocab)))
    for il in range(s.n_layer):
        block: Tensors = [("attn_norm.weight", (E,))]  # operator_norm, before either mixer
        if il in attention_layers:
            block += [
                ("attn_q_norm.weight", (s.head_dim,)),
                ("attn_k_norm.weight", (s.head_dim,)),
                *attention(E, E, kv),
            ]
        else:
            block += [
                ("shortconv.conv.weight", (s.params.conv_l_cache, E)),
                ("shortconv.in_proj.weight", (E, 3 * E)),
                ("shortconv.out_proj.weight", (E, E)),
            ]
        block.append(("ffn_norm.weight", (E,)))
        if il < s.n_layer_dense_lead:
            block += dense_ffn(E, s.n_ff)
        else:
            block += moe_ffn(E, s.n_ff_exp, X, probs_bias=(X,))
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    _check(s)
    a = s.architecture
    attention_layers = set(s.params.attention_layers)
    return {
        # per layer: the KV heads of an attention layer, 0 for a convolution layer (the converter's array)
        f"{a}.attention.head_count_kv": [s.n_head_kv if il in attention_layers else 0 for il in range(s.n_layer)],
        f"{a}.attention.key_length": None,
        f"{a}.attention.value_length": None,
        f"{a}.attention.layer_norm_rms_epsilon": float(s.params.norm_eps),
        f"{a}.leading_dense_block_count": s.n_layer_dense_lead,
        f"{a}.expert_gating_func": 2,  # sigmoid (gguf ExpertGatingFuncType.SIGMOID)
        f"{a}.vocab_size": s.n_vocab,
        f"{a}.shortconv.l_cache": s.params.conv_l_cache,
    }
