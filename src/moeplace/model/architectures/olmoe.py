"""OLMoE (olmoe): qwen3moe-like MoE layers with full-width (n_embd) Q/K norms and no shared expert.

llama.cpp (src/models/olmoe.cpp) sizes attn_q/attn_k/attn_v and attn_output by n_embd and both Q/K norms by
n_embd, so a spec needs n_head * head_dim == n_embd and n_head_kv == n_head (OLMoE-1B-7B's own shape). The
converter (conversion/olmo.py OlmoeModel) writes the experts' FFN width as feed_forward_length only, no
key/value length (config.json has no head_dim) and rms epsilon 1e-5.
"""

from __future__ import annotations

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, globals_, layer, moe_ffn

ARCHS = ("olmoe",)
Params = ArchParams  # no hyperparameters of its own


def tensors(s: TwinSpec[Params]) -> Tensors:
    E = s.n_embd
    if s.n_head * s.head_dim != E or s.n_head_kv != s.n_head:
        raise MoeplaceError(
            f"twin spec {s.name}: olmoe needs n_head x head_dim == n_embd and n_head_kv == n_head "
            "(llama.cpp sizes its attention and Q/K norms by n_embd)."
        )
    out = globals_(s)
    for il in range(s.n_layer):
        block = [
            ("attn_norm.weight", (E,)),
            *attention(E, E, E),
            ("attn_q_norm.weight", (E,)),
            ("attn_k_norm.weight", (E,)),
            ("ffn_norm.weight", (E,)),
            *moe_ffn(E, s.n_ff_exp, s.n_expert),
        ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a = s.architecture
    return {
        f"{a}.feed_forward_length": s.n_ff_exp,
        f"{a}.attention.key_length": None,
        f"{a}.attention.value_length": None,
        f"{a}.expert_feed_forward_length": None,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
    }
