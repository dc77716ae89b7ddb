"""Building blocks of the architectures' tensor tables (names and shapes as llama.cpp's converter writes them)."""

from __future__ import annotations

from typing import Any

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


def globals_(s: Any) -> Tensors:
    """Embedding, final norm and (unless tied) output matrix."""
    out: Tensors = [("token_embd.weight", (s.n_embd, s.n_vocab)), ("output_norm.weight", (s.n_embd,))]
    if not s.tied_output:
        out.append(("output.weight", (s.n_embd, s.n_vocab)))
    return out
