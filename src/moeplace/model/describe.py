"""A model in words: its layer kinds in one line (`structure`, shown by recommend and the model zoo) and
`moeplace inspect`'s text (`describe`)."""

from __future__ import annotations

from ..core.units import GB
from .meta import ModelMeta


def layer_kinds(meta: ModelMeta) -> dict[str, int]:
    """How many layers of each kind: attention (full), sliding-window, recurrent; MoE, dense FFN."""
    layers = meta.layers
    return {
        "attention": sum(1 for layer in layers if layer.has_kv and not layer.swa),
        "sliding-window": sum(1 for layer in layers if layer.swa),
        "recurrent": sum(1 for layer in layers if layer.state_bytes),
        "MoE": sum(1 for layer in layers if layer.expert_bytes),
        "dense": sum(1 for layer in layers if layer.bytes["dense_ffn"]),
    }


def structure(meta: ModelMeta) -> str:
    """One line: the layer kinds with their attention (MLA, window), recurrent state and experts."""
    att, kinds = meta.attention, layer_kinds(meta)
    state = sum(layer.state_bytes for layer in meta.layers)
    mla = f" (MLA rank {att.kv_lora_rank})" if att.mla else ""
    mixers = {
        "attention": f"{kinds['attention']} full attention{mla}",
        "sliding-window": f"{kinds['sliding-window']} sliding-window ({att.sliding_window} tokens)",
        "recurrent": f"{kinds['recurrent']} recurrent ({state / 2**20:.2f} MiB state per sequence)",
    }
    shared = f", {meta.n_expert_shared} shared" if meta.n_expert_shared else ""
    ffn = {
        "MoE": f"{kinds['MoE']} MoE ({meta.n_expert_used} of {meta.n_expert} experts{shared})",
        "dense": f"{kinds['dense']} dense FFN",
    }
    parts = [", ".join(text for kind, text in group.items() if kinds[kind]) for group in (mixers, ffn)]
    nextn = meta.n_layer_nextn
    count = f"{meta.n_layer - nextn} layers (+{nextn} NextN, not loaded)" if nextn else f"{meta.n_layer} layers"
    return f"{count}: " + "; ".join(p for p in parts if p)


def describe(meta: ModelMeta) -> str:
    """`moeplace inspect`'s text: the model, its bytes by role, its attention and each layer."""
    att = meta.attention
    lines = [f"{meta.name}  ({meta.architecture}, {meta.n_layer} layers, trained context {meta.n_ctx_train})"]
    lines.append(structure(meta))
    if meta.n_expert:
        lines.append(
            f"experts: {meta.n_expert} routed, {meta.n_expert_used} used per token, {meta.n_expert_shared} shared"
        )
    else:
        lines.append("dense model: no routed experts")
    sizes = (meta.expert_bytes / GB, meta.non_expert_bytes / GB, meta.total_bytes / GB)
    lines.append("bytes: expert {:.3f} GB, non-expert {:.3f} GB, total {:.3f} GB".format(*sizes))
    lines.append("quant types: " + ", ".join(f"{k} {v / GB:.3f} GB" for k, v in meta.quant_types.items()))
    n_nextn = meta.n_layer_nextn
    if n_nextn:
        lines.append(
            f"NextN/MTP layers {meta.n_layer - n_nextn}-{meta.n_layer - 1}: {meta.nextn_bytes / GB:.3f} GB "
            "in the file, not loaded by llama.cpp without --mtp (not in the bytes above)"
        )
    lines.append(
        f"attention: {att.n_head} heads, KV heads {att.n_head_kv}, key/value length "
        f"{att.key_length}/{att.value_length}"
        + (f", MLA rank {att.kv_lora_rank}" if att.mla else "")
        + (f", sliding window {att.sliding_window}" if att.sliding_window else "")
    )
    state = sum(layer.state_bytes for layer in meta.layers)
    if state:
        lines.append(f"recurrent state: {state / 2**20:.2f} MiB per sequence")
    lines.append(f"{'layer':>5} {'experts MB':>11} {'attn MB':>8} {'shexp MB':>8} {'dense MB':>8} {'router MB':>9}  kv")
    for layer in meta.layers:
        b = layer.bytes
        kv = (
            ("swa" if layer.swa else "full")
            if layer.has_kv
            else ("state" if layer.state_bytes else "nextn" if layer.index >= meta.n_layer - n_nextn else "none")
        )
        expert, attention, shared, dense, router = (
            b[role] / 1e6 for role in ("expert", "attention", "shared_expert", "dense_ffn", "router")
        )
        lines.append(
            f"{layer.index:>5} {expert:>11.2f} {attention:>8.2f} {shared:>8.2f} {dense:>8.2f} {router:>9.3f}  {kv}"
        )
    return "\n".join(lines)
