"""gpt-oss (gpt-oss): alternating sliding-window and full attention, attention sinks, biased experts."""

from __future__ import annotations

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, globals_, layer, routed_experts

ARCHS = ("gpt-oss",)
Params = ArchParams  # no hyperparameters of its own


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, X, F = s.n_embd, s.n_expert, s.n_ff_exp
    q, kv = s.head_dim * s.n_head, s.head_dim * s.n_head_kv
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            ("post_attention_norm.weight", (E,)),
            *attention(E, q, kv, bias=True),
            ("attn_output.bias", (E,)),
            ("attn_sinks.weight", (s.n_head,)),
            ("ffn_gate_inp.weight", (E, X)),
            ("ffn_gate_inp.bias", (X,)),
            *routed_experts(E, F, X),
            ("ffn_gate_exps.bias", (F, X)),
            ("ffn_up_exps.bias", (F, X)),
            ("ffn_down_exps.bias", (E, X)),
        ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    return {f"{s.architecture}.attention.sliding_window": s.sliding_window}
