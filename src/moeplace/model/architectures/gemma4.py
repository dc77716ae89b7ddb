"""Gemma 4 (gemma4), the MoE model (gemma-4-26B-A4B): interleaved sliding-window and full attention with their
own head sizes and KV-head counts, and in every layer a dense GeGLU MLP beside 128 routed experts.

Text model only: the published checkpoint carries a vision tower, which llama.cpp's converter leaves to a separate
mmproj file. Shapes follow llama.cpp's load_arch_tensors (src/models/gemma4.cpp), keys the converter
(conversion/gemma.py Gemma4Model <- Gemma3Model):
  - layer_types: a layer is full attention when (il + 1) % sliding_window_pattern == 0, else sliding-window
    (attention.sliding_window_pattern, one bool per layer, true = sliding);
  - sliding layers have head_dim-wide heads and n_head_kv KV heads, full layers global_head_dim-wide heads and
    num_global_key_value_heads KV heads (attention.key_length is the full layers', key_length_swa the sliding
    ones'; head_count_kv a per-layer array); with attention_k_eq_v the full layers have no v_proj (V is K);
  - Q/K RMS norms, and V normed without a weight; per-layer output scale (layer_scalar);
  - the dense MLP (mlp.*, n_ff wide: ffn_gate/up/down, llama.cpp's "shared expert", not named _shexp) and the
    experts (experts.gate_up_proj fused: ffn_gate_up_exps, 2 x n_ff_exp rows; ffn_down_exps) with the router
    (router.proj: ffn_gate_inp, router.scale: ffn_gate_inp.scale, router.per_expert_scale: ffn_down_exps.scale),
    each branch with its own pre/post norms;
  - one global rope_freqs (global_head_dim / 2 factors: proportional RoPE on the full layers), written first;
  - the output tied to the token embedding.
The E2B/E4B models' per-layer embeddings and KV-sharing layers are not modelled (embedding_length_per_layer_input 0,
attention.shared_kv_layers 0, as the 26B's converter writes them).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import MoeplaceError
from ._spec import ArchParams, GGUFKeys, TwinSpec
from ._tables import Tensors, layer

ARCHS = ("gemma4",)


@dataclass(frozen=True)
class Params(ArchParams):
    global_head_dim: int = 512  # full-attention layers' head size (head_dim is the sliding layers')
    num_global_key_value_heads: int = 2  # full-attention layers' KV heads (n_head_kv is the sliding layers')
    sliding_window_pattern: int = 6  # layer il is full attention when (il + 1) % pattern == 0
    attention_k_eq_v: bool = True  # full-attention layers have no attn_v (V = K)
    rope_freq_base_swa: float = 10000.0  # rope_parameters.sliding_attention.rope_theta
    final_logit_softcapping: float = 30.0


def _check(s: TwinSpec[Params]) -> None:
    if s.params.sliding_window_pattern < 1:
        raise MoeplaceError(f"twin spec {s.name}: gemma4 needs sliding_window_pattern >= 1.")
    if not s.sliding_window:
        raise MoeplaceError(f"twin spec {s.name}: gemma4 needs a sliding_window (llama.cpp requires the key).")
    if not s.n_ff:
        raise MoeplaceError(f"twin spec {s.name}: gemma4 needs n_ff, the dense MLP beside the experts.")
    if s.n_layer < 2:
        raise MoeplaceError(f"twin spec {s.name}: gemma4 needs at least 2 layers (llama.cpp's KV-reuse check).")


def swa_layers(s: TwinSpec[Params]) -> list[bool]:
    """Which layers are sliding-window (the converter's attention.sliding_window_pattern)."""
    k = s.params.sliding_window_pattern
    return [(il + 1) % k != 0 for il in range(s.n_layer)]


def tensors(s: TwinSpec[Params]) -> Tensors:
    _check(s)
    p, E, X = s.params, s.n_embd, s.n_expert
    out: Tensors = [
        ("rope_freqs.weight", (p.global_head_dim // 2,)),
        ("token_embd.weight", (E, s.n_vocab)),
        ("output_norm.weight", (E,)),
    ]
    if not s.tied_output:
        out.append(("output.weight", (E, s.n_vocab)))
    for il, swa in enumerate(swa_layers(s)):
        hd, kv = (s.head_dim, s.n_head_kv) if swa else (p.global_head_dim, p.num_global_key_value_heads)
        has_v = swa or not p.attention_k_eq_v
        # In the checkpoint's (alphabetical) order: experts.*, input_layernorm, layer_scalar, mlp.*, the norms,
        # router.*, self_attn.*.
        block: Tensors = [
            ("ffn_down_exps.weight", (s.n_ff_exp, E, X)),
            ("ffn_gate_up_exps.weight", (E, 2 * s.n_ff_exp, X)),
            ("attn_norm.weight", (E,)),
            ("layer_output_scale.weight", (1,)),
            ("ffn_down.weight", (s.n_ff, E)),
            ("ffn_gate.weight", (E, s.n_ff)),
            ("ffn_up.weight", (E, s.n_ff)),
            ("post_attention_norm.weight", (E,)),
            ("post_ffw_norm.weight", (E,)),
            ("post_ffw_norm_1.weight", (E,)),
            ("post_ffw_norm_2.weight", (E,)),
            ("ffn_norm.weight", (E,)),
            ("pre_ffw_norm_2.weight", (E,)),
            ("ffn_down_exps.scale", (X,)),
            ("ffn_gate_inp.weight", (E, X)),
            ("ffn_gate_inp.scale", (E,)),
            ("attn_k_norm.weight", (hd,)),
            ("attn_k.weight", (E, hd * kv)),
            ("attn_output.weight", (hd * s.n_head, E)),
            ("attn_q_norm.weight", (hd,)),
            ("attn_q.weight", (E, hd * s.n_head)),
            *([("attn_v.weight", (E, hd * kv))] if has_v else []),
        ]
        out += layer(il, block)
    return out


def metadata(s: TwinSpec[Params]) -> GGUFKeys:
    _check(s)
    a, p = s.architecture, s.params
    swa = swa_layers(s)
    return {
        f"{a}.attention.head_count_kv": [s.n_head_kv if w else p.num_global_key_value_heads for w in swa],
        f"{a}.attention.key_length": p.global_head_dim,
        f"{a}.attention.value_length": p.global_head_dim,
        f"{a}.attention.key_length_swa": s.head_dim,
        f"{a}.attention.value_length_swa": s.head_dim,
        f"{a}.attention.sliding_window": s.sliding_window,
        f"{a}.attention.sliding_window_pattern": swa,
        f"{a}.attention.shared_kv_layers": 0,
        f"{a}.embedding_length_per_layer_input": 0,
        f"{a}.final_logit_softcapping": float(p.final_logit_softcapping),
        f"{a}.rope.freq_base_swa": float(p.rope_freq_base_swa),
        # The full layers rotate all global_head_dim dims, rope_freqs masking the unrotated ones (the converter's).
        f"{a}.rope.dimension_count": p.global_head_dim,
        f"{a}.rope.dimension_count_swa": s.head_dim,
    }
