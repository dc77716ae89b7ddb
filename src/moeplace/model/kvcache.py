"""KV-cache bytes for a context, as llama.cpp allocates them.

Per layer with a cache: cells x (row_size(type_k, k_dim) + row_size(type_v, v_dim)).
Full-attention layers hold the whole (padded) context; sliding-window layers hold only
their window plus one ubatch, padded the same way (llama.cpp's iSWA cache).
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..core.errors import MoeplaceError
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_UBATCH
from .meta import Model, SeedModel

CACHE_TYPES = ("f16", "bf16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
KV_PAD = 256  # llama.cpp pads cache sizes to 256 cells


def pad(n: int, to: int = KV_PAD) -> int:
    return -(-n // to) * to


def row_size(cache_type: str, n: int) -> int:
    if cache_type not in CACHE_TYPES:
        raise MoeplaceError(f"unknown KV cache type {cache_type!r}; use one of {', '.join(CACHE_TYPES)}.")
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[cache_type.upper()]]
    if n % block:
        raise MoeplaceError(f"KV cache type {cache_type} needs rows divisible by {block}; this model's are {n}.")
    return n // block * size


def cells(ctx: int, window: int = 0, n_ubatch: int = DEFAULT_UBATCH, n_seq: int = 1) -> int:
    """Cells one layer's cache holds for a context of ctx tokens."""
    full = pad(ctx)
    if not window:
        return full
    return min(full, pad(window * n_seq + n_ubatch))


def layer_kv_bytes(
    meta: Model,
    ctx: int,
    type_k: str = DEFAULT_CACHE_TYPE,
    type_v: str = DEFAULT_CACHE_TYPE,
    n_ubatch: int = DEFAULT_UBATCH,
) -> list[int]:
    """KV bytes of every layer at a context (0 for layers without a cache)."""
    if isinstance(meta, SeedModel):
        # Constants mode: the seed's f16 figure, rescaled for other cache types.
        per_layer = meta.kv_bytes_per_token * ctx / meta.n_layer
        scale = (row_size(type_k, 256) + row_size(type_v, 256)) / (2 * row_size("f16", 256))
        return [round(per_layer * scale)] * meta.n_layer
    window = meta.attention.sliding_window
    out = []
    for layer in meta.layers:
        if not layer.has_kv:
            out.append(0)
            continue
        n = cells(ctx, window if layer.swa else 0, n_ubatch)
        v = row_size(type_v, layer.v_dim) if layer.v_dim else 0
        out.append(n * (row_size(type_k, layer.k_dim) + v))
    return out


def kv_bytes(
    meta: Model,
    ctx: int,
    type_k: str = DEFAULT_CACHE_TYPE,
    type_v: str = DEFAULT_CACHE_TYPE,
    n_ubatch: int = DEFAULT_UBATCH,
) -> int:
    return sum(layer_kv_bytes(meta, ctx, type_k, type_v, n_ubatch))


def kv_bytes_per_token(meta: Model, type_k: str = DEFAULT_CACHE_TYPE, type_v: str = DEFAULT_CACHE_TYPE) -> float:
    """Bytes per token of context for full-attention layers (windowed layers excluded)."""
    if isinstance(meta, SeedModel):
        return kv_bytes(meta, 1, type_k, type_v)
    return sum(
        row_size(type_k, layer.k_dim) + (row_size(type_v, layer.v_dim) if layer.v_dim else 0)
        for layer in meta.layers
        if layer.has_kv and not layer.swa
    )
