"""IBM Granite-4.0-H (granitehybrid): Mamba-2 layers interleaved with a few attention layers, every layer with a
MoE FFN (routed experts plus one shared expert), granite's muP multipliers as GGUF keys.

What llama.cpp's converter writes (conversion/granite.py GraniteHybridModel, via GraniteMoeModel, GraniteModel,
LlamaModel, TextModel) and what llama.cpp loads (src/models/granite-hybrid.cpp):
  - a layer is recurrent iff its entry in the per-layer `attention.head_count_kv` array is 0;
  - recurrent layers: ssm_in {n_embd, 2*d_inner + 2*n_group*d_state + n_ssm_head}, ssm_conv1d {d_conv, d_inner +
    2*n_group*d_state} (+ bias), ssm_dt.bias {n_ssm_head}, ssm_a and ssm_d {1, n_ssm_head} (no ".weight"),
    ssm_norm {d_inner/n_group, n_group}, ssm_out {d_inner, n_embd}; llama.cpp supports only d_inner = 2*n_embd;
  - attention layers: separate attn_q/k/v, attn_output, no biases; head_dim = n_embd / n_head (granite drops the
    config's head_dim, so no key_length/value_length keys);
  - every layer: attn_norm, ffn_norm, ffn_gate_inp, the routed experts {n_embd, n_ff, n_expert} with n_ff the
    `feed_forward_length` key (no expert_feed_forward_length), and the shared expert when
    `expert_shared_feed_forward_length` is set;
  - NoPE hybrids: `rope.scaling.finetuned` false and `context_length` 2**20 (the converter's override).
The recurrent state per sequence and layer (llama-hparams.cpp n_embd_r/n_embd_s, f32) is
(d_conv-1)*(d_inner + 2*n_group*d_state) + d_state*d_inner, which metadata.py reads from the ssm.* keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, attention, globals_, layer, mamba2, moe_ffn

ARCHS = ("granitehybrid",)


@dataclass(frozen=True)
class Params(ArchParams):
    # indices of the attention layers (config.json layer_types == "attention")
    attention_layers: list[int] = field(default_factory=list)
    n_ff_shexp: int = 0  # shared_intermediate_size (0: no shared expert)
    ssm_d_conv: int = 4  # mamba_d_conv
    ssm_d_state: int = 128  # mamba_d_state
    ssm_n_head: int = 0  # mamba_n_heads (the converter's ssm.time_step_rank); 0: d_inner / 64
    ssm_n_group: int = 1  # mamba_n_groups
    ssm_conv_bias: bool = True  # mamba_conv_bias
    rms_norm_eps: float = 1e-5
    embedding_scale: float = 0.0  # embedding_multiplier (0: key not written)
    residual_scale: float = 0.0  # residual_multiplier
    attention_scale: float = 0.0  # attention_multiplier
    logit_scale: float = 0.0  # logits_scaling


# llama-quantize leaves the small conv1d weights in their source type (F32 from the converter).


def _ssm(s: TwinSpec[Params]) -> tuple[int, int, int, int, int]:
    p = s.params
    d_inner = 2 * s.n_embd  # llama.cpp: "only an expansion factor of 2 is supported for now"
    n_head = p.ssm_n_head or d_inner // 64
    n_group = p.ssm_n_group
    if not n_head or not n_group or d_inner % n_head or d_inner % n_group:
        raise MoeplaceError(
            f"twin spec {s.name}: d_inner {d_inner} (2 x n_embd) must divide into ssm_n_head {n_head} heads "
            f"and ssm_n_group {n_group} groups."
        )
    return d_inner, p.ssm_d_state, p.ssm_d_conv, n_head, n_group


def _attention_layers(s: TwinSpec[Params]) -> set[int]:
    layers = set(s.params.attention_layers)
    if any(not isinstance(i, int) or not 0 <= i < s.n_layer for i in layers):
        raise MoeplaceError(f"twin spec {s.name}: attention_layers must be layer indices below n_layer {s.n_layer}.")
    if layers and s.head_dim * s.n_head != s.n_embd:
        raise MoeplaceError(
            f"twin spec {s.name}: granitehybrid's head_dim is n_embd / n_head = {s.n_embd // max(s.n_head, 1)}, "
            f"not {s.head_dim}."
        )
    return layers


def tensors(s: TwinSpec[Params]) -> Tensors:
    E, hd = s.n_embd, s.head_dim
    d_inner, d_state, d_conv, n_ssm_head, n_group = _ssm(s)
    attention_layers = _attention_layers(s)
    out = globals_(s)
    for il in range(s.n_layer):
        block: Tensors = [("attn_norm.weight", (E,))]
        if il in attention_layers:
            block += attention(E, hd * s.n_head, hd * s.n_head_kv)
        else:
            block += mamba2(E, d_inner, d_state, d_conv, n_ssm_head, n_group, s.params.ssm_conv_bias)
        block += [
            ("ffn_norm.weight", (E,)),
            *moe_ffn(E, s.n_ff_exp, s.n_expert, s.params.n_ff_shexp),
        ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    a, p = s.architecture, s.params
    d_inner, d_state, d_conv, n_ssm_head, n_group = _ssm(s)
    attention_layers = _attention_layers(s)
    scales = {
        f"{a}.attention.scale": p.attention_scale,
        f"{a}.embedding_scale": p.embedding_scale,
        f"{a}.residual_scale": p.residual_scale,
        f"{a}.logit_scale": p.logit_scale,
    }
    return {
        f"{a}.feed_forward_length": s.n_ff_exp,  # the routed experts' n_ff (llama.cpp's n_ff())
        # a recurrent layer is one whose KV head count is 0
        f"{a}.attention.head_count_kv": [s.n_head_kv if il in attention_layers else 0 for il in range(s.n_layer)],
        f"{a}.attention.key_length": None,
        f"{a}.attention.value_length": None,
        f"{a}.attention.layer_norm_rms_epsilon": float(p.rms_norm_eps),
        f"{a}.expert_feed_forward_length": None,
        f"{a}.vocab_size": s.n_vocab,
        f"{a}.rope.dimension_count": s.head_dim,
        **{key: float(value) if value else None for key, value in scales.items()},
        f"{a}.expert_shared_feed_forward_length": p.n_ff_shexp or None,
        f"{a}.ssm.conv_kernel": d_conv,
        f"{a}.ssm.state_size": d_state,
        f"{a}.ssm.group_count": n_group,
        f"{a}.ssm.inner_size": d_inner,
        f"{a}.ssm.time_step_rank": n_ssm_head,
        f"{a}.rope.scaling.finetuned": False,  # NoPE: granite's switch for rope
    }
