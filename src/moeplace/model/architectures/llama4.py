"""Llama 4 text model (llama4): MoE layers (one shared expert, top-k sigmoid router) every
`interleave_moe_layer_step`-th layer, dense FFN layers between them; iRoPE attention: chunked attention (8192-token
chunks) in three of every four layers, the fourth global and without RoPE.

As llama.cpp's converter (conversion/llama.py Llama4Model) writes it: no sliding_window key (llama.cpp then sets
chunked attention with an 8192 window and the 3-chunked/1-full pattern itself, models/llama4.cpp), and with
llama3-style RoPE scaling a global rope_freqs tensor (LlamaModel.generate_extra_tensors), written first.
A layer il is MoE when (il + 1) % interleave_moe_layer_step == 0 (Scout: 1, every layer; Maverick: 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, dense_ffn, globals_, layer, moe_ffn

ARCHS = ("llama4",)


@dataclass(frozen=True)
class Params(ArchParams):
    interleave_moe_layer_step: int = 1
    rope_freqs: bool = True  # rope_scaling of type llama3: the converter writes rope_freqs.weight (head_dim/2 factors)
    rms_norm_eps: float = 1e-5


def is_moe_layer(s: TwinSpec[Params], il: int) -> bool:
    step = s.params.interleave_moe_layer_step
    return step > 0 and (il + 1) % step == 0


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, X, hd = s.n_embd, s.n_expert, s.head_dim
    q, kv = hd * s.n_head, hd * s.n_head_kv
    out: Tensors = [("rope_freqs.weight", (hd // 2,))] if s.params.rope_freqs else []
    out += globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *attention(E, q, kv),
            ("ffn_norm.weight", (E,)),
        ]
        if is_moe_layer(s, il):
            block += moe_ffn(E, s.n_ff_exp, X, s.n_ff_exp)  # the shared expert is n_ff_exp wide
        else:
            block += dense_ffn(E, s.n_ff)
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a = s.architecture
    return {
        f"{a}.attention.layer_norm_rms_epsilon": float(s.params.rms_norm_eps),
        f"{a}.vocab_size": s.n_vocab,
        f"{a}.rope.dimension_count": s.head_dim,
        f"{a}.interleave_moe_layer_step": s.params.interleave_moe_layer_step,
    }
