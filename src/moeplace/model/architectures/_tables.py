"""Building blocks of the architectures' tensor tables (names and shapes as llama.cpp's converter writes them)."""

from __future__ import annotations

from ._spec import ArchParams, TwinSpec

Shape = tuple[int, ...]
Tensors = list[tuple[str, Shape]]


def routed_experts(n_embd: int, n_ff: int, n_expert: int) -> Tensors:
    """The routed experts' three stacked matrices, as llama.cpp's converter merges them."""
    return [
        ("ffn_gate_exps.weight", (n_embd, n_ff, n_expert)),
        ("ffn_up_exps.weight", (n_embd, n_ff, n_expert)),
        ("ffn_down_exps.weight", (n_ff, n_embd, n_expert)),
    ]


def dense_ffn(n_embd: int, n_ff: int, suffix: str = "") -> Tensors:
    """A dense (or, with suffix "_shexp", a shared expert's) gated feed-forward block."""
    return [
        (f"ffn_gate{suffix}.weight", (n_embd, n_ff)),
        (f"ffn_up{suffix}.weight", (n_embd, n_ff)),
        (f"ffn_down{suffix}.weight", (n_ff, n_embd)),
    ]


def layer(il: int, tensors: Tensors) -> Tensors:
    return [(f"blk.{il}.{name}", shape) for name, shape in tensors]


def globals_(s: TwinSpec[ArchParams]) -> Tensors:
    """Embedding, final norm and (unless tied) output matrix."""
    out: Tensors = [("token_embd.weight", (s.n_embd, s.n_vocab)), ("output_norm.weight", (s.n_embd,))]
    if not s.tied_output:
        out.append(("output.weight", (s.n_embd, s.n_vocab)))
    return out


def attention(n_embd: int, q_dim: int, kv_dim: int, bias: bool = False) -> Tensors:
    """Grouped-query attention's projections: q_dim = heads x head_dim, kv_dim = KV heads x head_dim."""
    out: Tensors = [
        ("attn_q.weight", (n_embd, q_dim)),
        ("attn_k.weight", (n_embd, kv_dim)),
        ("attn_v.weight", (n_embd, kv_dim)),
    ]
    if bias:
        out += [("attn_q.bias", (q_dim,)), ("attn_k.bias", (kv_dim,)), ("attn_v.bias", (kv_dim,))]
    return [*out, ("attn_output.weight", (q_dim, n_embd))]


def mla(s: TwinSpec[ArchParams]) -> Tensors:
    """Multi-head latent attention (deepseek2-style), with a low-rank query when q_lora_rank is set."""
    E, H = s.n_embd, s.n_head
    k_mla = s.qk_nope_head_dim + s.qk_rope_head_dim
    if s.q_lora_rank:
        query: Tensors = [
            ("attn_q_a_norm.weight", (s.q_lora_rank,)),
            ("attn_q_a.weight", (E, s.q_lora_rank)),
            ("attn_q_b.weight", (s.q_lora_rank, H * k_mla)),
        ]
    else:
        query = [("attn_q.weight", (E, H * k_mla))]
    return [
        *query,
        ("attn_kv_a_norm.weight", (s.kv_lora_rank,)),
        ("attn_kv_a_mqa.weight", (E, s.kv_lora_rank + s.qk_rope_head_dim)),
        ("attn_k_b.weight", (s.qk_nope_head_dim, s.kv_lora_rank, H)),
        ("attn_v_b.weight", (s.kv_lora_rank, s.v_head_dim, H)),
        ("attn_output.weight", (H * s.v_head_dim, E)),
    ]


def mamba2(n_embd: int, d_inner: int, d_state: int, d_conv: int, n_head: int, n_group: int, conv_bias: bool) -> Tensors:
    """A Mamba-2 mixer as llama.cpp loads it (granitehybrid, nemotron_h)."""
    conv_dim = d_inner + 2 * n_group * d_state
    return [
        ("ssm_in.weight", (n_embd, 2 * d_inner + 2 * n_group * d_state + n_head)),
        ("ssm_conv1d.weight", (d_conv, conv_dim)),
        *([("ssm_conv1d.bias", (conv_dim,))] if conv_bias else []),
        ("ssm_dt.bias", (n_head,)),
        ("ssm_a", (1, n_head)),
        ("ssm_d", (1, n_head)),
        ("ssm_norm.weight", (d_inner // n_group, n_group)),
        ("ssm_out.weight", (d_inner, n_embd)),
    ]


def nextn(n_embd: int, n_vocab: int = 0) -> Tensors:
    """A NextN/MTP block's own tensors (beside a full layer's), with its own embedding and head where the
    converter writes them (glm4moe); llama.cpp does not load them unless asked to."""
    out: Tensors = [
        ("nextn.eh_proj.weight", (2 * n_embd, n_embd)),
        ("nextn.enorm.weight", (n_embd,)),
        ("nextn.hnorm.weight", (n_embd,)),
        ("nextn.shared_head_norm.weight", (n_embd,)),
    ]
    if n_vocab:
        out += [("nextn.embed_tokens.weight", (n_embd, n_vocab)), ("nextn.shared_head_head.weight", (n_embd, n_vocab))]
    return out


def gated_attention(n_embd: int, head_dim: int, n_head: int, n_head_kv: int) -> Tensors:
    """Qwen3-Next/3.5's gated full attention: Q carries each head's output gate (2 x head_dim), Q/K RMS norms."""
    return [
        ("attn_q.weight", (n_embd, head_dim * n_head * 2)),
        ("attn_k.weight", (n_embd, head_dim * n_head_kv)),
        ("attn_v.weight", (n_embd, head_dim * n_head_kv)),
        ("attn_output.weight", (head_dim * n_head, n_embd)),
        ("attn_q_norm.weight", (head_dim,)),
        ("attn_k_norm.weight", (head_dim,)),
    ]


def moe_ffn(
    n_embd: int, n_ff_exp: int, n_expert: int, n_ff_shared: int = 0, probs_bias: Shape | None = None
) -> Tensors:
    """A routed-expert FFN: the router, the expert-score bias where the model has one (shape as its converter
    writes it), the experts, and a shared expert n_ff_shared wide (none at 0)."""
    out: Tensors = [("ffn_gate_inp.weight", (n_embd, n_expert))]
    if probs_bias:
        out.append(("exp_probs_b.bias", probs_bias))
    out += routed_experts(n_embd, n_ff_exp, n_expert)
    return out + (dense_ffn(n_embd, n_ff_shared, "_shexp") if n_ff_shared else [])
