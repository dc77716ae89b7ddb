"""What one token reads: the weight bytes a decode step takes from the device and from host RAM for a placement
(the top-k of E share of the experts, every other matrix but the gathered embedding), and the share of the
host's experts that RAM cannot hold."""

from __future__ import annotations

from .meta import Model


def active_fraction(meta: Model) -> float:
    return meta.n_expert_used / meta.n_expert if meta.n_expert else 1.0


def routed_share(k: int, n_expert: int, tokens: int) -> float:
    """The expected share of a layer's experts that at least one of `tokens` tokens routes to, with routing
    spread evenly: 1 - (1 - k/E)^tokens (1 for a dense model)."""
    return 1 - (1 - k / n_expert) ** tokens if n_expert else 1.0


def unread_bytes(meta: Model) -> int:
    """Non-expert bytes a decode step does not read: the embedding table, of which one row is gathered
    (unless it doubles as the output matrix, which is read whole)."""
    globals_ = meta.global_bytes
    return globals_.get("token_embd", 0) if globals_.get("output", 0) else 0


def read_bytes(meta: Model, n_cpu_moe: int) -> tuple[float, float]:
    """(D, V): bytes read per token from host RAM and from the device, with n layers' experts on the host."""
    n = min(max(n_cpu_moe, 0), meta.n_layer)
    expert = [layer.expert_bytes for layer in meta.layers]
    frac = active_fraction(meta)
    d = frac * sum(expert[:n])
    v = meta.non_expert_bytes - unread_bytes(meta) + frac * sum(expert[n:])
    return d, v


def bytes_per_token(meta: Model) -> float:
    """Weight bytes one decode step reads, wherever they live: D + V."""
    return meta.non_expert_bytes - unread_bytes(meta) + active_fraction(meta) * meta.expert_bytes


def disk_share(meta: Model, n_cpu_moe: int, ram_bytes: int | None) -> float:
    """The fraction of the CPU-side experts that is not resident in `ram_bytes` (experts are read uniformly)."""
    cpu_experts = sum(layer.expert_bytes for layer in meta.layers[: max(n_cpu_moe, 0)])
    if ram_bytes is None or cpu_experts <= ram_bytes:
        return 0.0
    return 1 - max(ram_bytes, 0) / cpu_experts
