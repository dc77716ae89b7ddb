"""Llama (llama): dense Llama/Mistral, and Mixtral, which llama.cpp's converter also writes as arch llama with
expert_count > 0 (conversion/llama.py LlamaModel stacks block_sparse_moe.experts.N.w1/w2/w3 into
ffn_gate_exps/ffn_down_exps/ffn_up_exps).

In llama.cpp (src/models/llama.cpp) the experts' width is feed_forward_length (n_ff; no
expert_feed_forward_length is written or read); the converter adds vocab_size and rope.dimension_count
(head_dim), and key/value length only when config.json has a head_dim (Mixtral's has none: n_embd / n_head).
"""

from __future__ import annotations

from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, dense_ffn, globals_, layer, moe_ffn

ARCHS = ("llama",)
Params = ArchParams  # no hyperparameters of its own


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, hd = s.n_embd, s.head_dim
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *attention(E, hd * s.n_head, hd * s.n_head_kv),
            ("ffn_norm.weight", (E,)),
        ]
        if s.n_expert:
            block += moe_ffn(E, s.n_ff_exp, s.n_expert)
        else:
            block += dense_ffn(E, s.n_ff)
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a = s.architecture
    default_dim = s.head_dim * s.n_head == s.n_embd
    return {
        f"{a}.feed_forward_length": s.n_ff_exp if s.n_expert else s.n_ff,
        f"{a}.expert_feed_forward_length": None,
        f"{a}.attention.key_length": None if default_dim else s.head_dim,
        f"{a}.attention.value_length": None if default_dim else s.head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{a}.vocab_size": s.n_vocab,
        f"{a}.rope.dimension_count": s.head_dim,
    }
