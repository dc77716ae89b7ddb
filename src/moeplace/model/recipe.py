"""llama-quantize's choice of type for every tensor of a model, for any of its presets (llama-quant.cpp at the
pinned build: llama_ftype_get_default_type, tensor_allows_quantization, llama_tensor_get_type_impl,
tensor_type_fallback), without an imatrix; Falcon-, GLM-5- and 70B-specific rules are left out (no MoE twin has
those architectures). A header-only twin takes its types from here, so its bytes are the quantized file's.
"""

from __future__ import annotations

import re

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

# Each preset's default type (llama_ftype_get_default_type).
PRESETS: dict[str, Q] = {
    "F32": Q.F32,
    "F16": Q.F16,
    "BF16": Q.BF16,
    "Q4_0": Q.Q4_0,
    "Q4_1": Q.Q4_1,
    "Q5_0": Q.Q5_0,
    "Q5_1": Q.Q5_1,
    "Q8_0": Q.Q8_0,
    "MXFP4_MOE": Q.MXFP4,
    "Q2_K_S": Q.Q2_K,
    "Q2_K": Q.Q2_K,
    "IQ3_XS": Q.IQ3_S,
    "Q3_K_S": Q.Q3_K,
    "Q3_K_M": Q.Q3_K,
    "Q3_K_L": Q.Q3_K,
    "Q4_K_S": Q.Q4_K,
    "Q4_K_M": Q.Q4_K,
    "Q5_K_S": Q.Q5_K,
    "Q5_K_M": Q.Q5_K,
    "Q6_K": Q.Q6_K,
    "TQ1_0": Q.TQ1_0,
    "TQ2_0": Q.TQ2_0,
    "IQ2_XXS": Q.IQ2_XXS,
    "IQ2_XS": Q.IQ2_XS,
    "IQ2_S": Q.IQ2_XS,
    "IQ2_M": Q.IQ2_S,
    "IQ3_XXS": Q.IQ3_XXS,
    "IQ1_S": Q.IQ1_S,
    "IQ1_M": Q.IQ1_M,
    "IQ4_NL": Q.IQ4_NL,
    "IQ4_XS": Q.IQ4_XS,
    "IQ3_S": Q.IQ3_S,
    "IQ3_M": Q.IQ3_S,
}
UNQUANTIZED = {Q.F32, Q.F16, Q.BF16}
# Names llama-quantize never quantizes (tensor_allows_quantization), beyond 1-D tensors and non-weights.
NEVER_QUANTIZED = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    *(f"time_mix_{n}.weight" for n in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2")),
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
)
NEVER_QUANTIZED_NAMES = ("position_embd.weight", "token_types.weight")  # whole names
_FALLBACK = {
    Q.Q4_K: Q.Q5_0,
    Q.Q5_K: Q.Q5_1,
    Q.Q6_K: Q.Q8_0,
    **dict.fromkeys((Q.Q2_K, Q.Q3_K, Q.TQ1_0, Q.TQ2_0), Q.Q4_0),
    **dict.fromkeys((Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_XS), Q.IQ4_NL),
}
_IQ12 = {"IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"}
_ATTN_OUT_Q5K_8EXP = {
    "Q2_K",
    "IQ3_XS",
    "IQ3_XXS",
    "Q3_K_S",
    "Q3_K_M",
    "IQ4_NL",
    "Q4_K_S",
    "Q4_K_M",
    "IQ3_S",
    "IQ3_M",
    "IQ4_XS",
}


def n_dims(shape: tuple[int, ...]) -> int:
    """Dimensions as ggml counts them: trailing 1s do not count (an (n_embd, 1) gate is 1-D)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return n


def keeps_source_type(name: str, shape: tuple[int, ...]) -> bool:
    """True for the tensors llama-quantize leaves as they are."""
    return (
        n_dims(shape) < 2
        or not name.endswith("weight")
        or name in NEVER_QUANTIZED_NAMES
        or any(k in name for k in NEVER_QUANTIZED)
    )


def override(name: str, overrides: dict[str, str]) -> Q | None:
    """The type of the first --tensor-type pattern that matches `name` (re.search), or None."""
    return next((GGMLQuantizationType[t] for p, t in overrides.items() if re.search(p, name)), None)


def quantize_order(name: str) -> tuple[int, str]:
    """The order llama-quantize visits tensors in (the loader's weights_map): by block, non-block ones first,
    then by name. Its attn_v and ffn counters count in this order."""
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m[1]) if m else -1, name)


def fit(qtype: Q, row: int) -> Q:
    """llama.cpp's fallback when a row is not a whole number of blocks (tensor_type_fallback)."""
    if row % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    fallback = _FALLBACK.get(qtype, qtype if GGML_QUANT_SIZES[qtype][0] <= 32 else Q.F16)
    return fallback if row % GGML_QUANT_SIZES[fallback][0] == 0 else Q.F16


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for fragment, cat in (
        ("attn_qkv.weight", "attn_qkv"),
        ("attn_kv_b.weight", "attn_kv_b"),
        ("attn_v.weight", "attn_v"),
        ("attn_k.weight", "attn_k"),
        ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"),
        ("ffn_up", "ffn_up"),
        ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):
        if fragment in name:
            return cat
    return "other"


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def quantized_types(
    tensors: list[tuple[str, tuple[int, ...]]],
    preset: str,
    *,
    n_layer: int,
    n_expert: int,
    n_gqa: float,
    overrides: dict[str, str] | None = None,
) -> dict[str, Q]:
    """Every tensor's type after `llama-quantize MODEL OUT preset` (with `--tensor-type` overrides), from the
    F16/F32 source the converter writes: tensors are (name, ggml-order shape)."""
    default = PRESETS[preset]
    tensors = sorted(tensors, key=lambda t: quantize_order(t[0]))
    names = [name for name, _ in tensors]
    tied = "output.weight" not in names
    n_attention_wv = sum(category(n) in ("attn_v", "attn_qkv", "attn_kv_b") for n in names)
    counters = {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0}
    out = {}
    for name, shape in tensors:
        if keeps_source_type(name, shape):
            out[name] = Q.F32
            continue
        if default in UNQUANTIZED:
            out[name] = default
            continue
        chosen = override(name, overrides or {})
        if chosen is None:
            chosen = _choose(
                name, shape, preset, default, category(name), counters, tied, n_attention_wv, n_layer, n_expert, n_gqa
            )
        out[name] = fit(chosen, shape[0])
    return out


def _layer(name: str, counter: int, n_expert: int) -> int:
    """The layer llama-quantize's ffn rules use: the tensor's count so far, or with experts its block number."""
    return quantize_order(name)[0] if n_expert > 1 else counter


# A marked port of llama.cpp's own code (src/llama-quant.cpp, llama_tensor_get_type_impl at the pinned build): it
# keeps its original's shape, one function with the C function's state as arguments, so it can be read beside it.
def _choose(  # noqa: C901, PLR0912 (llama_tensor_get_type_impl, branch for branch)
    name: str,
    shape: tuple[int, ...],
    preset: str,
    new_type: Q,
    cat: str,
    counters: dict[str, int],
    tied: bool,
    n_attention_wv: int,
    n_layer: int,
    n_expert: int,
    n_gqa: float,
) -> Q:
    """The type llama-quantize gives one tensor: a port of llama-quant.cpp's llama_tensor_get_type_impl at the
    pinned build, branch for branch (so it stays one long function, in llama.cpp's own order)."""
    if cat == "output" or (tied and cat == "token_embd"):
        if preset == "MXFP4_MOE" or shape[0] % GGML_QUANT_SIZES[new_type][0]:
            return Q.Q8_0
        if preset in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
            return Q.Q5_K
        return new_type if new_type == Q.Q8_0 else Q.Q6_K
    if preset == "MXFP4_MOE":
        return Q.MXFP4 if len(shape) > 2 and shape[2] > 1 else Q.Q8_0
    if cat == "token_embd":
        if preset in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
            return Q.Q2_K
        if preset in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
            return Q.IQ3_S
        if preset in ("TQ1_0", "TQ2_0"):
            return Q.Q4_K
        return new_type
    attn_v = cat in ("attn_v", "attn_qkv", "attn_kv_b")
    if preset in _IQ12:
        if attn_v:
            counters["attn_v"] += 1
            if n_gqa >= 4 or n_expert >= 4:
                return Q.Q4_K
            return Q.IQ3_S if preset in ("IQ2_S", "IQ2_M") else Q.Q2_K
        if n_expert == 8 and cat == "attn_k":
            return Q.Q4_K
        if cat == "ffn_down":
            i = counters["ffn_down"]
            counters["ffn_down"] += 1
            if i < n_layer // 8:
                return Q.IQ3_S if preset in ("IQ2_S", "IQ2_M") else Q.Q2_K
            return new_type
        if cat == "attn_output":
            if n_expert == 8:
                return Q.Q5_K
            if preset in ("IQ1_S", "IQ1_M"):
                return Q.IQ2_XXS
            if preset in ("IQ2_S", "IQ2_M"):
                return Q.IQ3_S
        return new_type
    if attn_v:
        i = counters["attn_v"]
        counters["attn_v"] += 1
        if preset == "Q2_K":
            new_type = Q.Q4_K if n_gqa >= 4 else Q.Q3_K
        elif preset == "Q2_K_S" and n_gqa >= 4:
            new_type = Q.Q4_K
        elif preset == "IQ3_XXS":
            new_type = Q.Q4_K if n_gqa >= 4 else Q.IQ3_S
        elif preset in ("IQ3_XS", "IQ3_S") and n_gqa >= 4:
            new_type = Q.Q4_K
        elif preset == "IQ3_M":
            new_type = Q.Q4_K
        elif preset == "Q3_K_M":
            new_type = Q.Q5_K if i < 2 else Q.Q4_K
        elif preset == "Q3_K_L":
            new_type = Q.Q5_K
        elif preset in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
            new_type = Q.Q5_K
        elif preset in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n_attention_wv):
            new_type = Q.Q6_K
        elif preset == "Q4_K_S" and i < 4:
            new_type = Q.Q5_K
        return Q.Q8_0 if n_expert == 8 else new_type
    if cat == "attn_k":
        if n_expert == 8:
            return Q.Q8_0
        return {"IQ3_XS": Q.IQ3_XXS, "IQ3_XXS": Q.IQ2_S}.get(preset, new_type)
    if cat == "attn_q":
        return {"IQ3_XS": Q.IQ3_XXS, "IQ3_XXS": Q.IQ2_S}.get(preset, new_type)
    if cat == "ffn_down":
        il, n = _layer(name, counters["ffn_down"], n_expert), n_layer
        counters["ffn_down"] += 1
        if preset == "Q2_K":
            return Q.Q3_K
        if preset == "Q2_K_S":
            return Q.Q4_K if il < n // 8 else new_type
        if preset == "IQ3_XXS":
            return Q.Q4_K if il < n // 8 else Q.Q3_K
        if preset == "Q3_K_M":
            return Q.Q5_K if il < n // 16 else Q.Q4_K
        if preset == "IQ3_M" and (il < n // 8 or (n_expert == 8 and _more_bits(il, n))):
            return Q.Q4_K
        if preset == "Q3_K_L":
            return Q.Q5_K
        if preset == "Q4_K_M":
            return Q.Q6_K if _more_bits(il, n) else new_type
        if il < n // 8 and preset in ("IQ4_NL", "IQ4_XS"):
            return Q.Q5_K
        if preset == "Q5_K_M" and _more_bits(il, n):
            return Q.Q6_K
        if preset == "Q4_K_S" and il < n // 8:
            return Q.Q5_K
        return new_type
    if cat == "attn_output":
        if n_expert == 8:
            return Q.Q5_K if preset in _ATTN_OUT_Q5K_8EXP else new_type
        bumped = {"Q2_K": Q.Q3_K, "IQ3_XXS": Q.IQ3_S, "Q3_K_M": Q.Q4_K, "Q3_K_L": Q.Q5_K, "IQ3_M": Q.Q4_K}
        return bumped.get(preset, new_type)
    if cat in ("ffn_gate", "ffn_up"):
        il, n = _layer(name, counters[cat], n_expert), n_layer
        counters[cat] += 1
        if preset == "IQ3_XS" and n // 8 <= il < 7 * n // 8:
            return Q.IQ3_XXS
    return new_type
