"""Stage 'metadata': a model's exact bytes by role and its attention/KV shape, from the GGUF header.

The result is a `ModelMeta` (model/meta.py; stored as results/metadata/{model}.json) that every later stage reads.
A model can also be described by the seed's constants (total non-expert/expert bytes, layers, KV bytes per token):
a `SeedModel`, which exists to reproduce the seed's tables.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..core.config import SeedConstants
from ..core.errors import MoeplaceError
from ..core.units import parse_size
from .gguf_file import GGUFHeader, quoted, read_header
from .meta import GLOBALS, ROLES, Attention, Layer, LayerKV, ModelFile, ModelMeta, RopeYarn, SeedModel

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
# Routed experts, as llama.cpp's --n-cpu-moe pattern sees them (weights, biases, scales).
# A routed expert tensor: the one answer to "is this an expert?" (plan/offload.py places them by this name).
_EXPERT_SUFFIX = r"ffn_(gate_up|gate|up|down)_(ch)?exps\."
_EXPERT = re.compile("^" + _EXPERT_SUFFIX)
EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\." + _EXPERT_SUFFIX)  # groups: layer, kind, "ch" of a chunked expert
_DENSE_FFN = re.compile(r"^ffn_(gate|up|down|gate_up)\.")

# Sliding-window patterns llama.cpp hard-codes per architecture (load_swa_pattern(ml, n, dense_first)),
# used when the GGUF has no sliding_window_pattern array. With pattern n, layer il is windowed when
# il % n < n - 1 (the last of each group is full), or when il % n != 0 if dense_first.
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gpt-oss": (2, False),
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "exaone4": (4, False),
    "exaone-moe": (4, False),
    "afmoe": (4, False),
    "llama4": (4, False),
    "olmo2": (4, False),
    "smallthinker": (4, True),
    "plamo3": (8, False),
}
# Windows llama.cpp's loader sets itself, whatever the GGUF says, unless its sliding_window key is 0: Llama 4's
# chunked attention (models/llama4.cpp: n_swa = 8192; its converter writes no sliding_window key). Its iSWA cache
# sizes chunked layers as sliding-window ones.
FIXED_WINDOWS: dict[str, int] = {"llama4": 8192}


def tensor_role(suffix: str) -> str:
    """Role of a per-layer tensor, by the part of its name after 'blk.N.'."""
    if _EXPERT.match(suffix):
        return "expert"
    if "_shexp" in suffix:
        return "shared_expert"
    if suffix.startswith("ffn_gate_inp") or suffix.startswith("exp_probs_b"):
        return "router"
    if "norm" in suffix.split(".")[0]:
        return "norm"
    if suffix.startswith("attn_"):
        return "attention"
    if _DENSE_FFN.match(suffix):
        return "dense_ffn"
    return "other"


def global_role(name: str) -> str:
    stem = name.split(".")[0]
    return stem if stem in GLOBALS else "other"


def _per_layer(value: Any, n_layer: int, key: str, path: Path | str) -> list[int]:
    """A key that is either one integer for all layers or a per-layer array."""
    if isinstance(value, list):
        if len(value) != n_layer or not all(isinstance(v, int) for v in value):
            raise MoeplaceError(f"{path}: {key} has {len(value)} entries, expected {n_layer} integers.")
        return list(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MoeplaceError(f"{path}: {key} must be an integer or per-layer array, got {quoted(value)}.")
    return [value] * n_layer


def _required_int(header: GGUFHeader, suffix: str) -> int:
    value = header.arch_key(suffix)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MoeplaceError(
            f"{header.paths[0]}: missing or invalid '{header.architecture}.{suffix}'; "
            "the model file is incomplete or from an unsupported converter."
        )
    return value


def _optional_int(header: GGUFHeader, suffix: str, default: int) -> int:
    value = header.arch_key(suffix, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MoeplaceError(
            f"{header.paths[0]}: '{header.architecture}.{suffix}' must be a whole number, not a "
            f"{type(value).__name__}; the model file is damaged or from an unsupported converter."
        )
    return value


def _sliding_window(header: GGUFHeader) -> int:
    window = header.arch_key("attention.sliding_window")
    fixed = FIXED_WINDOWS.get(header.architecture)
    if fixed and window != 0:
        return fixed
    return window or 0


def _swa_layers(header: GGUFHeader, n_layer: int) -> list[bool]:
    arch = header.architecture
    window = _sliding_window(header)
    if not window:
        return [False] * n_layer
    pattern = header.arch_key("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise MoeplaceError(
                f"{header.paths[0]}: {arch}.attention.sliding_window_pattern has {len(pattern)} entries, "
                f"expected {n_layer}."
            )
        return [bool(v) for v in pattern]
    n, dense_first = SWA_PATTERNS.get(arch, (1, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        n = pattern
    if n == 0:
        return [True] * n_layer
    return [il % n != 0 if dense_first else il % n < n - 1 for il in range(n_layer)]


def _recurrent_state_bytes(header: GGUFHeader, n_embd: int, n_head: int) -> int:
    """One sequence's state in a recurrent layer, as llama.cpp sizes it (llama-hparams.cpp n_embd_r + n_embd_s,
    f32). Mamba, Mamba-2 and gated delta nets (ssm.* keys): the convolution's last d_conv - 1 columns over the
    inner, B and C channels, and the d_state x d_inner SSM state. Kimi delta attention (kda.head_dim): q, k and v
    convolutions of n_head x head_dim channels (d_conv - 1 columns, 3 without the key) and a head_dim x head_dim
    state per head, n_head being the first layer's. LFM2's short convolution (shortconv.l_cache): n_embd x
    (l_cache - 1). Other recurrent kinds count 0."""
    d_conv = _optional_int(header, "ssm.conv_kernel", 0)
    kda = _optional_int(header, "kda.head_dim", 0)
    if kda:
        d_inner = n_head * kda
        return 4 * (3 * (d_conv - 1 if d_conv > 0 else 3) * d_inner + kda * d_inner)
    l_cache = _optional_int(header, "shortconv.l_cache", 0)
    if l_cache:
        return 4 * n_embd * (l_cache - 1)
    d_inner = _optional_int(header, "ssm.inner_size", 0)
    d_state = _optional_int(header, "ssm.state_size", 0)
    n_group = _optional_int(header, "ssm.group_count", 0)
    conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return 4 * (conv + d_state * d_inner)


# Tensors of a recurrent layer: Mamba/gated-delta-net (ssm_*) or LFM2's short convolution (shortconv.*).
_RECURRENT = ("ssm_", "shortconv.")


def _attention(
    header: GGUFHeader, n_layer: int, layer_names: list[set[str]], mtp: bool = False
) -> tuple[Attention, list[LayerKV]]:
    """Attention/KV parameters as llama.cpp's KV cache sees them (llama-hparams.cpp), globally and per layer; `mtp`:
    as an MTP context's cache sees them (the NextN layers' KV, the trunk's none)."""
    path = header.paths[0]
    arch = header.architecture
    n_embd = _required_int(header, "embedding_length")
    n_head = _per_layer(header.arch_key("attention.head_count", 0), n_layer, f"{arch}.attention.head_count", path)
    head_kv_raw = header.arch_key("attention.head_count_kv")
    n_head_kv = (
        n_head if head_kv_raw is None else _per_layer(head_kv_raw, n_layer, f"{arch}.attention.head_count_kv", path)
    )
    first_head = next((h for h in n_head if h), 0)
    default_dim = n_embd // first_head if first_head else 0
    key_length = _optional_int(header, "attention.key_length", default_dim)
    value_length = _optional_int(header, "attention.value_length", default_dim)
    key_length_swa = _optional_int(header, "attention.key_length_swa", key_length)
    value_length_swa = _optional_int(header, "attention.value_length_swa", value_length)
    # MLA (deepseek2-style): the cache holds only K rows of key_length (latent + rope); V is a view of K.
    mla = bool(header.arch_key("attention.key_length_mla", 0) and header.arch_key("attention.value_length_mla", 0))
    # NextN/MTP layers at the end are not part of the main context.
    n_layer_main = n_layer - (header.arch_key("nextn_predict_layers", 0) or 0)
    swa = _swa_layers(header, n_layer)
    state = _recurrent_state_bytes(header, n_embd, n_head[0])
    layers: list[LayerKV] = []
    for il in range(n_layer):
        # A layer without K/V projections keeps no KV cache. A recurrent layer (Mamba, gated delta net, short
        # convolution) keeps a fixed state instead; in a gated-delta-net layer attn_qkv is the recurrence's input.
        recurrent = any(n.startswith(_RECURRENT) for n in layer_names[il])
        has_kv = (
            (il >= n_layer_main if mtp else il < n_layer_main)
            and n_head_kv[il] > 0
            and any(n.startswith("attn_k") or (n.startswith("attn_qkv") and not recurrent) for n in layer_names[il])
        )
        k_len, v_len = (key_length_swa, value_length_swa) if swa[il] else (key_length, value_length)
        k_dim, v_dim = k_len * n_head_kv[il], 0 if mla else v_len * n_head_kv[il]
        layers.append(
            LayerKV(
                has_kv=has_kv,
                swa=has_kv and swa[il],
                k_dim=k_dim if has_kv else 0,
                v_dim=v_dim if has_kv else 0,
                state_bytes=state if recurrent else 0,
            )
        )
    attention = Attention(
        n_embd=n_embd,
        n_head=first_head,
        n_head_kv=n_head_kv[0] if len(set(n_head_kv)) == 1 else n_head_kv,
        key_length=key_length,
        value_length=value_length,
        sliding_window=_sliding_window(header),
        mla=mla,
        kv_lora_rank=header.arch_key("attention.kv_lora_rank", 0) or 0,
        rope_dimension_count=header.arch_key("rope.dimension_count", key_length),
    )
    return attention, layers


def file_identity(header: GGUFHeader) -> list[ModelFile]:
    """Size and header hash of every file: cheap, and changes when the model does."""
    return [ModelFile(str(p), s, h) for p, s, h in zip(header.paths, header.file_sizes, header.header_sha256)]


def _rope_yarn(header: GGUFHeader) -> RopeYarn | None:
    """YaRN already in the file (gpt-oss, DeepSeek): a longer context stretches it further, from its own origin."""
    if header.arch_key("rope.scaling.type") != "yarn":
        return None
    factor = float(header.arch_key("rope.scaling.factor", 1.0))
    return RopeYarn(factor, int(header.arch_key("rope.scaling.original_context_length", 0)))


@dataclass
class _TensorBytes:
    """The header's tensors summed: bytes by role per layer (and each layer's tensor names, its expert tensors),
    by global role, by quant type, and in the NextN layers (apart)."""

    layers: list[dict[str, int]]
    names: list[set[str]]
    expert_tensors: list[dict[str, int]]
    global_bytes: dict[str, int]
    quant: Counter[str]
    nextn_bytes: int = 0

    @classmethod
    def walk(cls, header: GGUFHeader, n_layer: int, n_nextn: int) -> _TensorBytes:
        out = cls(
            [dict.fromkeys(ROLES, 0) for _ in range(n_layer)],
            [set() for _ in range(n_layer)],
            [{} for _ in range(n_layer)],
            dict.fromkeys(GLOBALS, 0),
            Counter(),
        )
        for t in header.tensors:
            m = _LAYER.match(t.name)
            if m is None:
                out.quant[t.type_name] += t.n_bytes
                out.global_bytes[global_role(t.name)] += t.n_bytes
                continue
            il, suffix = int(m[1]), m[2]
            if il >= n_layer:
                raise MoeplaceError(
                    f"{header.paths[0]}: tensor {quoted(t.name)} names a layer past the model's {n_layer}."
                )
            out.names[il].add(suffix)
            if il >= n_layer - n_nextn:
                out.nextn_bytes += t.n_bytes
                continue
            out.quant[t.type_name] += t.n_bytes
            role = tensor_role(suffix)
            out.layers[il][role] += t.n_bytes
            if role == "expert":
                out.expert_tensors[il][t.name] = t.n_bytes
        return out


def from_header(header: GGUFHeader) -> ModelMeta:
    arch = header.architecture
    n_layer = _required_int(header, "block_count")
    if n_layer < 1:
        raise MoeplaceError(
            f"{header.paths[0]}: '{header.architecture}.block_count' is {n_layer}; a model has at "
            "least one layer: the file is damaged."
        )
    if n_layer > len(header.tensors):  # every layer has tensors of its own: the count lies
        raise MoeplaceError(
            f"{header.paths[0]}: '{header.architecture}.block_count' is {n_layer}, more layers than the file's "
            f"{len(header.tensors)} tensors could hold; the file is damaged."
        )
    n_expert = header.arch_key("expert_count", 0) or 0
    n_expert_used = header.arch_key("expert_used_count", 0) or 0
    # NextN/MTP layers at the end: llama.cpp skips their tensors ("unused tensor") unless a run asks for them
    # (--mtp, MTP drafting), so they are neither in memory nor read per token. Counted apart, not in the totals.
    n_nextn = min(_optional_int(header, "nextn_predict_layers", 0), n_layer)
    t = _TensorBytes.walk(header, n_layer, n_nextn)
    layers, names, expert_tensors, nextn_bytes = t.layers, t.names, t.expert_tensors, t.nextn_bytes
    global_bytes, quant = t.global_bytes, t.quant
    expert_bytes = sum(layer["expert"] for layer in layers)
    if expert_bytes and not (n_expert and n_expert_used):
        raise MoeplaceError(f"{header.paths[0]}: has expert tensors but no {arch}.expert_count/expert_used_count.")
    attention, kv_layers = _attention(header, n_layer, names)
    sizes = widths(header)
    total = sum(t.n_bytes for t in header.tensors) - nextn_bytes
    return ModelMeta(
        name=model_name(header),
        architecture=arch,
        n_layer=n_layer,
        n_expert=n_expert if expert_bytes else 0,
        n_expert_used=n_expert_used if expert_bytes else 0,
        # Converters that write no expert_shared_count (granitehybrid, qwen3next, llama4) still write one shared
        # expert's tensors.
        n_expert_shared=header.arch_key("expert_shared_count", 0)
        or int(bool(expert_bytes) and any(layer["shared_expert"] for layer in layers)),
        n_ctx_train=header.arch_key("context_length", 0) or 0,
        rope_yarn=_rope_yarn(header),
        n_vocab=sizes["n_vocab"],
        n_ff_exp=sizes["n_ff_exp"] if expert_bytes else 0,
        n_ff_dense=sizes["n_ff_dense"],
        expert_bytes=expert_bytes,
        non_expert_bytes=total - expert_bytes,
        total_bytes=total,
        n_layer_nextn=n_nextn,
        nextn_bytes=nextn_bytes,
        global_bytes=global_bytes,
        quant_types=dict(sorted(quant.items())),
        attention=attention,
        layers=[
            Layer(il, layer["expert"], layer, tensors, **kv)
            for il, (layer, kv, tensors) in enumerate(zip(layers, kv_layers, expert_tensors))
        ],
        files=file_identity(header),
    )


def widths(header: GGUFHeader) -> dict[str, int]:
    """The rows of the token embedding (the vocabulary), an expert's FFN width (an expert up/gate matrix is
    n_embd x n_ff_exp x n_expert) and the widest dense FFN a token passes (a dense layer's, or the shared
    experts'), whose intermediates the compute buffer holds."""
    shapes = {t.name: t.shape for t in header.tensors}
    up = next((s for name, s in shapes.items() if _LAYER.match(name) and "_up_exps" in name), None)
    dense_up = ("ffn_up.weight", "ffn_up_shexp.weight")
    dense = [s[1] for name, s in shapes.items() if _LAYER.match(name) and name.endswith(dense_up) and len(s) == 2]
    return {
        "n_vocab": shapes.get("token_embd.weight", (0, 0))[-1],
        "n_ff_exp": header.arch_key("expert_feed_forward_length", 0) or (up[1] if up and len(up) == 3 else 0),
        "n_ff_dense": max(dense, default=0),
    }


def model_name(header: GGUFHeader) -> str:
    """general.name where it is a short line of text (commands and configs quote it), else the file's name."""
    name = header.metadata.get("general.name")
    if isinstance(name, str) and 0 < len(name) <= 128 and name.isprintable():
        return name
    return PurePosixPath(str(header.paths[0]).split("?")[0]).stem


def nextn_head(header: GGUFHeader) -> list[Layer]:
    """The NextN/MTP block(s) at the end of block_count as llama.cpp loads them for --spec-type draft-mtp (load_mtp),
    each with its bytes, its routed experts and the KV the MTP context keeps for it (none: no head)."""
    n_layer = _required_int(header, "block_count")
    n_nextn = min(_optional_int(header, "nextn_predict_layers", 0), n_layer)
    t = _TensorBytes.walk(header, n_layer, 0)
    kv = _attention(header, n_layer, t.names, mtp=True)[1] if n_nextn else []
    heads = range(n_layer - n_nextn, n_layer)
    return [Layer(il, t.layers[il]["expert"], t.layers[il], t.expert_tensors[il], **kv[il]) for il in heads]


def inspect_model(path: str | Path) -> ModelMeta:
    """Header-only summary of a GGUF model (split models: pass any shard)."""
    return from_header(read_header(path))


def from_constants(name: str, constants: SeedConstants) -> SeedModel:
    """The seed's way: total non-expert/expert bytes spread evenly over the layers."""
    n_layer = int(constants["layers"])
    expert = parse_size(constants["expert"], f"models.{name}.constants.expert")
    non_expert = parse_size(constants["non_expert"], f"models.{name}.constants.non_expert")
    per_layer = expert / n_layer
    return SeedModel(
        name=name,
        architecture="unknown",  # the seed names no architecture
        n_layer=n_layer,
        n_expert=int(constants.get("n_expert", 0)),
        n_expert_used=int(constants.get("n_expert_used", 0)),
        n_expert_shared=0,
        n_ctx_train=0,
        expert_bytes=expert,
        non_expert_bytes=non_expert,
        total_bytes=expert + non_expert,
        global_bytes={"other": non_expert},
        quant_types={},
        attention=None,
        kv_bytes_per_token=int(constants["kv_bytes_per_token"]),
        layers=[Layer(il, per_layer) for il in range(n_layer)],
        files=[],
    )
