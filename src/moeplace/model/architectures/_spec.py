"""What every architecture module reads and writes: a twin spec, its family's own hyperparameters, its GGUF keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

from gguf import GGUFValueType

Scalar: TypeAlias = bool | int | float | str
# A GGUF key a twin writes: a value of the type its Python type says (int: uint32, float: float32; a sequence: an
# array), a (value, GGUFValueType) pair for another type, or None to leave a common key out.
GGUFKeys: TypeAlias = dict[str, Scalar | Sequence[Scalar] | tuple[Scalar, GGUFValueType] | None]


@dataclass(frozen=True)
class ArchParams:
    """An architecture family's own hyperparameters beyond TwinSpec's common fields, with their defaults (a spec
    may set them): each module's `Params` subclasses it; a family with none uses it as it is."""


P = TypeVar("P", bound=ArchParams, covariant=True)


@dataclass(frozen=True)
class TwinSpec(Generic[P]):
    """Published hyperparameters of a model (see config/models/*.yaml); its architecture's own ones in `params`."""

    name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_vocab: int
    context_length: int = 32768
    tied_output: bool = False
    ftype: str = "Q4_K_M"
    rope_freq_base: float = 10000.0
    # leading dense layers, shared experts (deepseek2, ernie, glm4moe, kimi-linear, lfm2moe, llama4, nemotron ...)
    n_layer_dense_lead: int = 0
    n_ff: int = 0
    n_expert_shared: int = 0
    # MLA (deepseek2, kimi-linear)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # sliding-window attention (gpt-oss)
    sliding_window: int = 0
    # ordered regex -> type name, first match wins (llama-quantize's --tensor-type): a published file's own mix
    tensor_types: dict[str, str] = field(default_factory=dict)
    params: P = field(kw_only=True)  # the architecture module's Params
