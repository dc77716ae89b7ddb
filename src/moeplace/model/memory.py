"""What llama.cpp allocates on the device for a placement and a workload, buffer by buffer.

- weights: every tensor llama.cpp puts on the device: all but the input embedding (the input layer is kept on
  the host; a tied output matrix is a device copy of it) and the experts sent to the host;
- kv: the KV cache (kvcache.py) and a hybrid model's recurrent state, one of each per parallel sequence;
- compute: the scheduler's graph buffer, reserved for a full ubatch against the whole cache. llama.cpp's own
  reserve (llama-fit-params --fit-print, no allocation) gives it exactly; without a build, `estimate_compute`
  follows the graph's largest live tensors: the attention mask, the attention scores (without flash attention),
  the logits of a ubatch's outputs and the routed experts' activations;
- extra: what else the user puts there (a vision projector);
- draft: a speculative draft's weights, KV and compute (draft.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_FLASH_ATTN, DEFAULT_UBATCH, batch_for
from .kvcache import kv_bytes, pad
from .meta import ModelMeta

FLASH_ATTN = ("auto", "on", "off")
SERVER = "server"  # Workload.outputs of a llama-server plan
# llama.cpp's GPU backends offload an op on host weights (copy them into the compute buffer, compute on the device)
# from this batch up; below it the host computes its experts itself.
OP_OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class Workload:
    """What a llama.cpp run asks of memory besides its weights (llama-server -c, -ub, -b, -fa, -ctk/-ctv, -np)."""

    ctx: int
    ubatch: int = DEFAULT_UBATCH
    flash_attn: str = DEFAULT_FLASH_ATTN  # auto resolves to on where the device runs it (GPUs, the RPC device)
    type_k: str = DEFAULT_CACHE_TYPE
    type_v: str = DEFAULT_CACHE_TYPE
    parallel: int = 1
    # Logits the graph is reserved for: a whole ubatch's (llama-bench, llama-fit-params, llama-completion), or one
    # per slot (llama-server since llama.cpp b11434 reserves n_outputs_max = --parallel: SERVER).
    outputs: str = "batch"
    op_offload: bool = False  # a GPU backend that copies host weights for large batches (budget.OP_OFFLOAD)
    no_kv_offload: bool = False  # -nkvo: the KV cache stays in host RAM
    # Speculative decoding (draft.py): the tokens a slot verifies beyond its own per step (a server reserves logits
    # for 1 + n_draft per slot), and the recurrent state's rollback snapshots (n_rs_seq) kept beside it.
    n_draft: int = 0
    rs_snapshots: int = 0

    @property
    def batch(self) -> int:
        return batch_for(self.ubatch)

    @property
    def tokens(self) -> int:
        """The ubatch llama.cpp reserves its graph for: never more than the batch or the context."""
        return min(self.ubatch, self.batch, self.ctx * self.parallel)

    @property
    def n_outputs(self) -> int:
        return self.tokens if self.outputs == "batch" else min(self.tokens, self.parallel * (1 + self.n_draft))

    def llama_args(self) -> list[str]:
        args = ["-c", str(self.ctx * self.parallel), "-ub", str(self.ubatch), "-b", str(self.batch)]
        args += ["-fa", self.flash_attn, "-ctk", self.type_k, "-ctv", self.type_v]
        args += ["-np", str(self.parallel)] if self.parallel > 1 else []
        return args + (["-nkvo"] if self.no_kv_offload else [])


@dataclass(frozen=True)
class DeviceNeed:
    """Bytes on the device, by buffer."""

    weights: int
    kv: int
    compute: int
    extra: int = 0
    draft: int = 0  # a speculative draft's buffers (draft.py), beside the main context's

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.extra + self.draft


@dataclass(frozen=True)
class Pins:
    """The user's own -ot rules resolved to routed-expert tensors as llama.cpp resolves them (the first rule that
    matches a tensor wins, and the user's rules come before --n-cpu-moe's): those kept on the host whatever n is,
    and those kept on the device even within the first n layers; `rules` as the user wrote them, one per rule."""

    host: frozenset[str] = frozenset()
    device: frozenset[str] = frozenset()
    rules: tuple[str, ...] = ()

    def host_set(self, meta: ModelMeta, n_cpu_moe: int) -> frozenset[str]:
        """Every expert tensor in host RAM with --n-cpu-moe n after these rules."""
        first = {name for layer in meta.layers[: max(n_cpu_moe, 0)] for name in layer.expert_tensors}
        return frozenset((first - self.device) | self.host)


NO_PINS = Pins()


def host_layer_count(meta: ModelMeta, host: frozenset[str]) -> int:
    """Layers with any of their experts in host RAM (the rest are resident)."""
    return sum(1 for layer in meta.layers if host.intersection(layer.expert_tensors))


def host_kept_bytes(meta: ModelMeta) -> int:
    """Non-expert bytes llama.cpp keeps on the host with every layer offloaded: the input embedding, unless it
    doubles as the output matrix (then the device holds a copy of it and the host the original)."""
    return meta.global_bytes.get("token_embd", 0) if meta.global_bytes.get("output", 0) else 0


def host_bytes(meta: ModelMeta, host: frozenset[str] | set[str]) -> int:
    """What a plan leaves in host RAM: the expert tensors on the host and the input embedding."""
    sizes = {n: b for layer in meta.layers for n, b in layer.expert_tensors.items()}
    return sum(sizes[n] for n in host) + host_kept_bytes(meta)


def device_weight_bytes(meta: ModelMeta, n_cpu_moe: int, pins: Pins = NO_PINS) -> int:
    """Weight bytes on the device with -ngl 99, the experts of the first n layers on the host, as the user's -ot
    pins (or an -ot placement, as host pins with n = 0) leave them."""
    host = pins.host_set(meta, n_cpu_moe)
    on_host = sum(b for layer in meta.layers for t, b in layer.expert_tensors.items() if t in host)
    return meta.total_bytes - host_kept_bytes(meta) - on_host


def state_bytes(meta: ModelMeta, snapshots: int = 0) -> int:
    """The recurrent layers' fixed state for one sequence (hybrid models; 0 for pure attention), with `snapshots`
    rollback copies of it (llama-memory-recurrent.cpp: mem_size x (1 + n_rs_seq) rows)."""
    return sum(layer.state_bytes for layer in meta.layers) * (1 + snapshots)


def estimate_compute(meta: ModelMeta, w: Workload, n_cpu_moe: int, host: frozenset[str] | None = None) -> int:
    """The device compute buffer from the graph's largest live tensors (an estimate: llama.cpp's allocator
    reuses memory between them; its own reserve is exact), with, on a backend that offloads large batches' ops,
    a copy of the largest expert tensor in host RAM (`host`: that set, else the first n layers' experts)."""
    a = meta.attention
    flash = w.flash_attn != "off"
    tokens = w.tokens
    n_kv = pad(w.ctx) * w.parallel
    layers = [layer for layer in meta.layers if layer.has_kv]
    mask_cols = n_kv if any(not layer.swa for layer in layers) else 0
    if any(layer.swa for layer in layers):
        mask_cols += min(n_kv, pad(a.sliding_window * w.parallel + w.ubatch))
    mask = mask_cols * (pad(tokens, 64) * 2 if flash else tokens * 4)  # f16 and padded for flash attention
    activations = tokens * 4 * 4 * a.n_embd  # the residual stream and its normed copies, f32
    scores = 0 if flash else n_kv * tokens * a.n_head * 4
    if a.mla and not flash:
        scores += n_kv * a.kv_lora_rank * 2  # V is a view of the latent K: made contiguous for the product
    logits = w.n_outputs * meta.n_vocab * 4
    on_host = NO_PINS.host_set(meta, n_cpu_moe) if host is None else host
    experts_on_device = meta.n_expert_used and any(
        t not in on_host for layer in meta.layers for t in layer.expert_tensors
    )
    # the routed experts' gate and up outputs and their gated product, f32, for every used expert; the same for the
    # widest dense FFN (a dense layer's or the shared experts')
    moe = tokens * meta.n_expert_used * meta.n_ff_exp * 4 * 3 if experts_on_device else 0
    dense = tokens * meta.n_ff_dense * 4 * 3
    copy = 0
    if w.op_offload and tokens >= OP_OFFLOAD_MIN_BATCH:
        copy = max((b for layer in meta.layers for t, b in layer.expert_tensors.items() if t in on_host), default=0)
    return mask + activations + max(scores, logits, moe + copy, dense)  # the copy is live with the experts' outputs


def device_need(
    meta: ModelMeta,
    w: Workload,
    n_cpu_moe: int,
    compute: Callable[[int], int] | None = None,
    extra_bytes: int = 0,
    pins: Pins = NO_PINS,
) -> DeviceNeed:
    """The device's buffers for n layers' experts on the host, as the user's -ot pins leave them; `compute(n)` is
    llama.cpp's reserve where known."""
    kv = (kv_bytes(meta, w.ctx, w.type_k, w.type_v, w.ubatch) + state_bytes(meta, w.rs_snapshots)) * w.parallel
    return DeviceNeed(
        weights=device_weight_bytes(meta, n_cpu_moe, pins),
        kv=0 if w.no_kv_offload else kv,
        compute=compute(n_cpu_moe) if compute else estimate_compute(meta, w, n_cpu_moe, pins.host_set(meta, n_cpu_moe)),
        extra=extra_bytes,
    )


def minimum_n(meta: ModelMeta, fits: Callable[[int], bool]) -> int | None:
    """The smallest n whose placement fits (more experts on the host never needs more device memory)."""
    return lowest(0, meta.n_layer, fits) if fits(meta.n_layer) else None


def lowest(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """The smallest n in [lo, hi] for which `fits` holds, by bisection (`fits` turns true once and stays true;
    hi is taken to fit)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
