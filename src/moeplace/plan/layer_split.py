"""Decode speed of a whole-layer split (-ngl G, no --n-cpu-moe): what a user could run instead of expert offload.

With -ngl G llama.cpp keeps the last G layers on the card and runs the first n_layer - G layers, all their weights,
on the host (their attention and KV cache too); the output layer stays on the host unless G exceeds the layer count.
A token reads each host layer's non-expert bytes and its routed experts' active share from host RAM, and crosses
to the card and back once. On some cards that is as fast as --n-cpu-moe at the same VRAM (a published RX 6700 XT
sweep: -ngl 30 as fast as --n-cpu-moe 18), so a ranking of placements should weigh both.

The same decode model prices it (speed.FEATURES["tg"]: fixed time per layer, device bytes, host bytes, hops, KV),
with the host layers' KV bytes read from host RAM. Its memory is a device's share of a layer split
(plan/devices.device_share: the card's layers whole, their KV cache, a compute buffer as for every expert on the
host). Prefill of a layer split is not predicted: llama.cpp computes the host layers on the CPU for a small batch
and copies their weights for a large one, which no published sweep this prior learned from measures.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.config import Device
from ..core.units import GB
from ..model.memory import Workload, estimate_compute
from ..model.meta import Layer, ModelMeta
from ..model.reads import active_fraction
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE
from .devices import device_share
from .speed import SpeedModel, kv_read_gb


def _layer_bytes(meta: ModelMeta, layer: Layer) -> float:
    """Bytes one decode step reads of a layer: its non-expert weights and its routed experts' active share."""
    own = sum(b for role, b in layer.bytes.items() if role != "expert")
    return own + active_fraction(meta) * layer.expert_bytes


def ngl_features(
    meta: ModelMeta,
    n_gpu_layers: int,
    depth: int = 0,
    n_gen: int = 128,
    type_k: str = DEFAULT_CACHE_TYPE,
    type_v: str = DEFAULT_CACHE_TYPE,
) -> dict[str, float]:
    """speed.features("tg") of -ngl n_gpu_layers: the last n_gpu_layers layers on the card, the rest on the host."""
    n_layer = meta.n_layer
    g = min(max(n_gpu_layers, 0), n_layer + 1)
    first_on_card = n_layer - min(g, n_layer)
    device = sum(_layer_bytes(meta, layer) for layer in meta.layers[first_on_card:])
    host = sum(_layer_bytes(meta, layer) for layer in meta.layers[:first_on_card])
    output = sum(v for k, v in meta.global_bytes.items() if k in ("output", "output_norm"))
    if not meta.global_bytes.get("output"):  # tied embeddings: the output reads the embedding table
        output += meta.global_bytes.get("token_embd", 0)
    device, host = (device + output, host) if g > n_layer else (device, host + output)
    on_card = meta.layers[first_on_card:]
    mean_depth = depth + n_gen / 2
    kv_all = kv_read_gb(meta, mean_depth, type_k, type_v)
    kv_card = kv_read_gb(replace(meta, layers=on_card), mean_depth, type_k, type_v)
    hops = 2.0 if g <= n_layer else 0.0  # to the card and back, unless the output is on the card too
    return {
        "layers": float(n_layer),
        "device_gb": device / GB,
        "host_gb": host / GB + (kv_all - kv_card),
        "hops": hops,
        "kv_gb": kv_card,
    }


def predict_ngl(
    meta: ModelMeta,
    model: SpeedModel,
    n_gpu_layers: int,
    depth: int = 0,
    n_gen: int = 128,
    type_k: str = DEFAULT_CACHE_TYPE,
    type_v: str = DEFAULT_CACHE_TYPE,
) -> dict[str, float] | None:
    """Decode tok/s of -ngl n_gpu_layers (no --n-cpu-moe) with its ~95% interval, as SpeedModel.predict gives one
    for an expert placement; None where the model has no decode terms."""
    tg = model.tests.get("tg")
    return None if tg is None else tg.rate(ngl_features(meta, n_gpu_layers, depth, n_gen, type_k, type_v))


def largest_ngl(meta: ModelMeta, device: Device, w: Workload) -> int | None:
    """The most layers -ngl keeps on the card within its memory and margin (n_layer + 1: the output layer too), or
    None where not one layer fits."""
    n_layer = meta.n_layer
    compute = estimate_compute(meta, w, n_layer)
    for g in range(n_layer + 1, 0, -1):
        span = range(n_layer - min(g, n_layer), n_layer)
        if device_share(meta, w, 0, device, span, g > n_layer, compute, frozenset()).free_bytes >= 0:
            return g
    return None
