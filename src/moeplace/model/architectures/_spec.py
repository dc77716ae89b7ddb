"""What every architecture module reads and writes: a twin spec, its own hyperparameters, its GGUF keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from gguf import GGUFValueType

from ..gguf_file import GGUFValue

# An architecture's own hyperparameter (its PARAMS): a number, a flag, a name, a list of layer indices, or unset.
Param: TypeAlias = bool | int | float | str | list[int] | None
Params: TypeAlias = dict[str, Param]
# A GGUF key a twin writes: a value of the type its Python type says (int: uint32, float: float32), a
# (value, GGUFValueType) pair for another type, or None to leave a common key out.
GGUFKeys: TypeAlias = dict[str, GGUFValue | tuple[GGUFValue, GGUFValueType] | None]


@dataclass
class TwinSpec:
    """Published hyperparameters of a model (see config/models/*.yaml); an architecture's own ones in `params`."""

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
    params: Params = field(default_factory=dict)  # the architecture module's PARAMS, defaults filled
