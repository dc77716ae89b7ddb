"""The speed model: decode and prefill time per token for any expert placement, context depth and ubatch.

Decode (tg), seconds per generated token:
    t = t0 * L + V/B_dev + D/B_host + h * hops + s_kv * KV
Prefill (pp), seconds per prompt token:
    t = q0 * L + q_link * C + q_kv * KV
where, for a placement P (the routed-expert tensors kept in host RAM):
  L     the model's layers: a token's fixed cost (kernel launches, synchronisation) is t0 per layer;
  V, D  bytes one token reads from the device and from host RAM (predict.read_bytes, per tensor for -ot);
  hops  device<->host transitions per token: 2 per layer with experts on the host (activations out and back),
        and over several devices one per card boundary (the activations move on to the next card: priced as a
        host hop, an assumption no run of two real cards has checked yet);
  KV    bytes of KV cache one token's attention reads at the run's mean depth (sliding-window layers capped at
        their window), in GB: its cost is the KV bandwidth plus attention compute per cached token, so
        s_kv is fitted, or before a fit measured (the ceilings stage's attention rows), not assumed 1/B_dev;
  C     host-resident expert bytes llama.cpp copies to the device per prompt token when it offloads a large
        batch's host experts (op offload): once per ubatch, a ubatch being at most the prompt, and only the
        experts some token of the ubatch routes to (see copied_bytes).
Every coefficient has a unit (seconds per GB, per hop, per token) and a source: "fit" (moeplace calibrate,
non-negative least squares on llama-bench runs), "datasheet" (the config's or the CLI's bandwidths),
"ceilings" (this host's measured bandwidths and attention cost, and the fixed time and host term of the ceilings
probe's own runs: see anchored) or "default"; "fit (in ...)" where a fit takes a term in with another it cannot
tell it from (hops in host_gb, and at one depth the probe's attention cost in the fixed time: see _shares). A
model from datasheets alone predicts decode only: prefill is compute-bound, and nothing but a run (a sweep's, or
the probe's) says how fast this machine computes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ..core.config import Bandwidths
from ..core.errors import MoeplaceError
from ..core.records import JsonObject
from ..core.units import GB
from ..model.kvcache import KV_PAD, row_size
from ..model.memory import OP_OFFLOAD_MIN_BATCH
from ..model.meta import ModelMeta
from ..model.reads import active_fraction, routed_share, unread_bytes
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_UBATCH, batch_for

TESTS = ("tg", "pp")
FEATURES = {
    "tg": ("layers", "device_gb", "host_gb", "hops", "kv_gb"),
    "pp": ("layers", "link_gb", "kv_gb"),
}
UNITS = {
    "layers": "s/layer",
    "device_gb": "s/GB",
    "host_gb": "s/GB",
    "hops": "s/hop",
    "kv_gb": "s/GB",
    "link_gb": "s/GB",
}
# A token's fixed cost before any calibration: kernel launches and synchronisation, per layer. Published
# --n-cpu-moe sweeps on GPUs imply 2-12 ms per token for ~48-layer models; this is the low end.
FIXED_PER_LAYER_S = 50e-6
# Relative spread of a prediction when the fit leaves no residual to measure it by (two runs, two parameters).
DEFAULT_SPREAD = 0.10
MIN_SPREAD = 0.01  # no run repeats to better than this
Z95 = 1.96
Z90 = 1.645
# A predicted ratio between two placements of one machine is off by more the larger it is: its ~90% band is learned
# per class of |log(predicted ratio)|, these the upper edges (x1.11, x1.28, x1.65; the last class is open).
RATIO_EDGES = (0.1, 0.25, 0.5)


def ratio_class(log_ratio: float) -> int:
    """The RATIO_EDGES class of a predicted ratio (its log): 0 for x1 to x1.11, ..., len(RATIO_EDGES) beyond."""
    return sum(abs(log_ratio) > edge for edge in RATIO_EDGES)


@dataclass(frozen=True)
class Run:
    """One configuration, measured or to predict: a placement, a depth, a test and its size."""

    n_cpu_moe: int
    depth: int
    test: str  # tg or pp
    n_tokens: int  # generated (tg) or prompt (pp) tokens
    ubatch: int = DEFAULT_UBATCH
    type_k: str = DEFAULT_CACHE_TYPE
    type_v: str = DEFAULT_CACHE_TYPE
    host_tensors: frozenset[str] = frozenset()  # -ot placements beyond the first n_cpu_moe layers
    tok_s: float | None = None  # measured
    device_hops: int = 0  # over several devices (a layer split): where a token moves from one card to the next


def host_set(meta: ModelMeta, run: Run) -> set[str]:
    first = {name for layer in meta.layers[: run.n_cpu_moe] for name in layer.expert_tensors}
    return first | set(run.host_tensors)


def kv_read_gb(meta: ModelMeta, depth: float, type_k: str, type_v: str) -> float:
    """KV cache bytes one token's attention reads at this depth (GB): every layer with a cache, its cells
    capped by a sliding window; MLA layers read their latent row."""
    window = meta.attention.sliding_window if meta.attention else 0
    total = 0.0
    for layer in meta.layers:
        if not layer.has_kv:
            continue
        cells = min(depth, window + KV_PAD) if layer.swa and window else depth
        v = row_size(type_v, layer.v_dim) if layer.v_dim else 0
        total += cells * (row_size(type_k, layer.k_dim) + v)
    return total / GB


def copied_bytes(meta: ModelMeta, host_bytes: float, n_tokens: int, ubatch: int) -> float:
    """Host expert bytes copied to the device per prompt token under op offload: llama.cpp copies once per
    ubatch (at most the prompt) only the experts some token of it routes to (all of them from a few hundred
    tokens on); nothing below OP_OFFLOAD_MIN_BATCH tokens."""
    u = min(ubatch, n_tokens)
    if u < OP_OFFLOAD_MIN_BATCH:
        return 0.0
    used = routed_share(meta.n_expert_used, meta.n_expert, u)
    return host_bytes * used * math.ceil(n_tokens / u) / n_tokens


def prefill_run(
    n_cpu_moe: int,
    depth: int,
    ubatch: int,
    type_k: str = DEFAULT_CACHE_TYPE,
    type_v: str = DEFAULT_CACHE_TYPE,
    host_tensors: frozenset[str] = frozenset(),
) -> Run:
    """The prefill a prediction is for: one batch of a long prompt with `depth` tokens already cached, as llama.cpp
    prefills it, n_batch tokens at a time (2,048 by default, raised to the ubatch as moeplace's commands do)."""
    return Run(n_cpu_moe, depth, "pp", batch_for(ubatch), ubatch, type_k, type_v, host_tensors)


def prefill_up_to(
    n_cpu_moe: int,
    ctx: int,
    ubatch: int,
    type_k: str = DEFAULT_CACHE_TYPE,
    type_v: str = DEFAULT_CACHE_TYPE,
    host_tensors: frozenset[str] = frozenset(),
) -> Run:
    """The last batch of a long prompt that fills `ctx` (see prefill_run): what a context's prefill ends with."""
    return prefill_run(n_cpu_moe, max(ctx - batch_for(ubatch), 0), ubatch, type_k, type_v, host_tensors)


def features(meta: ModelMeta, run: Run) -> dict[str, float]:
    """The model's inputs for one run (see the module's docstring); depth is the run's mean KV depth."""
    host = host_set(meta, run)
    sizes = {n: b for layer in meta.layers for n, b in layer.expert_tensors.items()}
    host_bytes = sum(sizes[n] for n in host)
    frac = active_fraction(meta)
    d = frac * host_bytes
    v = meta.non_expert_bytes - unread_bytes(meta) + frac * (meta.expert_bytes - host_bytes)
    host_layers = sum(1 for layer in meta.layers if host & set(layer.expert_tensors))
    kv = kv_read_gb(meta, run.depth + run.n_tokens / 2, run.type_k, run.type_v)
    layers = float(meta.n_layer)
    if run.test == "tg":
        hops = 2.0 * host_layers + run.device_hops
        return {"layers": layers, "device_gb": v / GB, "host_gb": d / GB, "hops": hops, "kv_gb": kv}
    link = copied_bytes(meta, host_bytes, run.n_tokens, run.ubatch)
    return {"layers": layers, "link_gb": link / GB, "kv_gb": kv}


@dataclass
class TestModel:
    """Coefficients of one test (seconds per unit of each feature), with their standard errors and sources."""

    coef: dict[str, float]
    source: dict[str, str]
    se: dict[str, float] = field(default_factory=dict)
    spread: float = DEFAULT_SPREAD  # relative sd of a prediction beyond the parameters' own uncertainty
    cov: list[list[float]] | None = None  # of the fitted coefficients, in `fitted` order
    fitted: list[str] = field(default_factory=list)
    runs: int = 0
    at_zero: list[str] = field(default_factory=list)  # fitted coefficients the runs pushed to their bound, 0
    # For a coefficient kept from the prior with an sd in `se` (a measured attention cost): how the fitted
    # coefficients move per unit of it (in `fitted` order), the fit having absorbed what it got wrong.
    lever: dict[str, list[float]] = field(default_factory=dict)
    # Coefficients the fit scaled with the fixed time per layer (see _shares): their value per unit of it.
    shares: dict[str, float] = field(default_factory=dict)
    # For a prior coefficient with an sd: how the probe's fixed time per layer moves per unit of it (anchored
    # solves the fixed time with it), which moves the shares of a fit at one depth too.
    fixed_lever: dict[str, float] = field(default_factory=dict)
    # The ~90% bound on |log(predicted / measured)| of a ratio between two placements of one machine, per
    # RATIO_EDGES class of the predicted ratio, where known (the learned prior's: most of its error is a machine's
    # own offset, shared by its placements); None: two independent errors of `spread`.
    ratio_bound: list[float] | None = None

    def seconds(self, x: dict[str, float]) -> float:
        return sum(self.coef.get(k, 0.0) * v for k, v in x.items())

    def rate(self, x: dict[str, float]) -> dict[str, float] | None:
        """tok/s of a placement with these features, with its ~95% interval (None where no time is left)."""
        t = self.seconds(x)
        if t <= 0:
            return None
        spread = math.exp(Z95 * self.relative_sd(x))  # multiplicative: speeds are positive and errors relative
        return {"tok_s": 1 / t, "low": 1 / (t * spread), "high": spread / t}

    def relative_sd(self, x: dict[str, float]) -> float:
        """The fitted coefficients' uncertainty, a prior coefficient's sd as far as the fit does not cancel it (a
        fit at one depth takes up an attention cost's error there, not at another depth), and the spread."""
        t = self.seconds(x)
        var = 0.0
        tied = sum(w * x[k] for k, w in self.shares.items())  # the fixed time's column carries its shares
        xv = np.array([x[k] + (tied if k == "layers" else 0.0) for k in self.fitted])
        if self.cov is not None and self.fitted:
            var = float(xv @ np.array(self.cov) @ xv)
        for k, sd in self.se.items():
            if k not in self.fitted:
                lever = self.lever.get(k, [0.0] * len(self.fitted))
                moved = x[k] - self.fixed_lever.get(k, 0.0) * tied
                var += ((moved - float(xv @ np.array(lever))) * sd) ** 2
        return math.sqrt(var / t**2 + self.spread**2) if t > 0 else math.inf


@dataclass
class SpeedModel:
    tests: dict[str, TestModel]

    def predict(self, meta: ModelMeta, run: Run) -> dict[str, float] | None:
        """tok/s with its ~95% interval (tok_s / k .. tok_s * k), or None where this model cannot say (prefill
        from datasheets alone)."""
        model = self.tests.get(run.test)
        if model is None or not set(FEATURES[run.test]) <= model.coef.keys():  # a prior's term alone, unfitted
            return None
        return model.rate(features(meta, run))

    def ratio_bound(self, test: str, log_ratio: float) -> float:
        """The ~90% bound on how far a predicted ratio between two placements of one machine (its log) lies from the
        measured one: the ratio is known within x/÷exp(bound); closer to 1 than that, which is faster is not known
        (a ranking calls them equivalent)."""
        m = self.tests.get(test)
        if m is None:
            return math.inf
        if m.ratio_bound:
            return m.ratio_bound[min(ratio_class(log_ratio), len(m.ratio_bound) - 1)]
        return Z90 * math.sqrt(2) * m.spread

    def to_json(self) -> JsonObject:
        return {
            "tests": {k: asdict(v) for k, v in self.tests.items()},
            "units": UNITS,
            "model": "see moeplace.speed: t = sum(coef * feature) seconds per token",
            "notes": zero_fit_notes(self),
        }

    @classmethod
    def from_json(cls, data: JsonObject, where: str = "calibration") -> SpeedModel:
        try:  # a file of moeplace 0.x before the ratio band has difference_spread, now ratio_bound
            tests = {k: {f: x for f, x in v.items() if f != "difference_spread"} for k, v in data["tests"].items()}
            return cls({k: TestModel(**v) for k, v in tests.items()})
        except (KeyError, TypeError, AttributeError) as e:
            raise MoeplaceError(
                f"{where}: not a moeplace calibration file ({e}); make one with moeplace calibrate."
            ) from None


def host_layer_bytes(meta: ModelMeta, model: SpeedModel) -> float:
    """What decode pays for one more layer with experts on the host (its two hops), in the expert bytes on the
    device whose reading from the host instead would cost as much: what placement.optimal_placement weighs a
    partial layer against. 0 where the model prices no hop, or a host byte no dearer than a device byte."""
    tg = model.tests.get("tg")
    if tg is None:
        return 0.0
    per_byte = active_fraction(meta) * (tg.coef.get("host_gb", 0.0) - tg.coef.get("device_gb", 0.0)) / GB
    hop = tg.coef.get("hops", 0.0)
    return 2 * hop / per_byte if hop > 0 and per_byte > 0 else 0.0


def prior(
    bw: Bandwidths, attention: dict[str, float] | None = None, attention_sd: dict[str, float] | None = None
) -> SpeedModel:
    """Decode from bandwidths alone (seed 000's formula, with the KV cache read from the device): measured
    bandwidths (the ceilings stage's, or the config's measured: section) where known, else the datasheet's;
    a hop costs what the ceilings stage measured on a CUDA card, else nothing. `attention` (the ceilings
    stage's, per test, s/GB of KV cache read, with its spread between rounds in `attention_sd`) replaces the KV
    bytes over the device's bandwidth; prefill gets that term alone, for a fit to build on: by itself it
    predicts nothing."""
    vram, ddr = bw.measured_vram_gbps or bw.vram_gbps, bw.measured_ddr_gbps or bw.ddr_gbps
    dev_source = "ceilings" if bw.measured_vram_gbps else "datasheet"
    host_source = "ceilings" if bw.measured_ddr_gbps else "datasheet"
    hop = bw.measured_hop_s or 0.0
    attention, attention_sd = attention or {}, attention_sd or {}
    sd = {t: {"kv_gb": attention_sd[t]} for t in attention_sd if t in attention}
    kv = attention.get("tg", 1 / vram)
    coef = {"layers": FIXED_PER_LAYER_S, "device_gb": 1 / vram, "host_gb": 1 / ddr, "hops": hop, "kv_gb": kv}
    sources = {
        "layers": "default",
        "device_gb": dev_source,
        "host_gb": host_source,
        "hops": "ceilings" if bw.measured_hop_s else "default",
        "kv_gb": "ceilings" if "tg" in attention else dev_source,
    }
    tests = {"tg": TestModel(coef, sources, sd.get("tg", {}), spread=0.5)}
    if "pp" in attention:
        tests["pp"] = TestModel({"kv_gb": attention["pp"]}, {"kv_gb": "ceilings"}, sd.get("pp", {}), spread=0.5)
    return SpeedModel(tests)


TERMS = {
    "layers": "a fixed time per token",
    "device_gb": "reading weights on the device",
    "host_gb": "experts on the host",
    "hops": "host/device hops",
    "kv_gb": "depth (the KV cache attention reads)",
    "link_gb": "copying host experts to the device",
}


def zero_fit_notes(model: SpeedModel) -> list[str]:
    """One sentence per coefficient a fit pushed to 0: its runs show no cost for that term (noise, or a
    placement that ran as fast with more on the host), so predictions that differ in it come out flat."""
    return [
        f"{test}: these {m.runs} runs show no cost for {TERMS[k]} ({k} fitted to 0), so predictions that differ "
        "only in it come out the same"
        + ("; one noisy run of two is enough for that: measure both again, or add a third." if m.runs == 2 else ".")
        for test, m in model.tests.items()
        for k in m.at_zero
    ]
