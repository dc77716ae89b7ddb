"""Stage 'tune': the lowest --n-cpu-moe that really runs at a context, found with few real loads (seed 001).

Loading is not fitting: each probe loads the model, allocates the KV cache and compute buffers at
the target context and generates tokens (llama-bench -d CTX-8 -p 0 -n 8 -r 1: a context of exactly
CTX cells, as `llama-server -c CTX` allocates). The search starts at
the budget's prediction n*: when the prediction is right it costs two loads (n* runs, n*-1 does
not), and never more than a binary search over the rest. On a GPU a run whose decode speed collapses
below `spill_ratio` of its feasible neighbour's counts as infeasible: a silent spill to slow memory
(published sweeps show 3-5x drops at the edge). The emulated device cannot spill (its cap is hard), so
there only allocation failures count: a single short probe's speed is too noisy to judge it by.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..core.config import BenchSettings, Device, DeviceTarget, TuneSettings
from ..core.records import BenchRecord, Row
from ..model.memory import Workload, lowest
from ..model.meta import ModelMeta
from ..model.metadata import inspect_model
from ..plan.budget import plan
from ..plan.devices import minimum_ncmoe
from ..runtime.build import Build
from ..runtime.device import DeviceSetup, device_setup, margin_on
from ..runtime.llamacpp_args import UNSUPPORTED, refusal
from .bench import BenchJob, Rig, run_bench, run_sweep

log = logging.getLogger("moeplace")

PROBE_TOKENS = 8
# The calibrating runs after the search: at an empty context (no fill to wait for), enough tokens and repetitions
# for a median within a few percent on a GPU, decode and a prompt of one ubatch.
CALIBRATION_GEN, CALIBRATION_REPETITIONS = 32, 3
SPILL_RATIO = 0.3  # a neighbour 3x faster means this run spilled


@dataclass(frozen=True)
class Probing:
    """How and where the probes run: the tuner's settings, the llama.cpp build, the log, and the pipeline's
    folder (for its revision)."""

    settings: TuneSettings
    manifest: Build
    log_path: Path
    workdir: Path

    def rig(self, bench: BenchSettings, device: DeviceSetup) -> Rig:
        return Rig(bench, device, self.manifest, self.log_path, self.workdir)


@dataclass
class Probe:
    n_cpu_moe: int
    status: str
    tg_tok_s: float | None


@dataclass
class TuneResult:
    predicted_n: int
    lowest_n: int | None
    chosen_n: int | None
    chosen_tok_s: float | None
    probes: list[Probe] = field(default_factory=list)

    @property
    def loads(self) -> int:
        return len(self.probes)


def probe_settings(threads: int, timeout_s: float) -> BenchSettings:
    return BenchSettings(prompt=0, gen=PROBE_TOKENS, repetitions=1, threads=threads, timeout_s=timeout_s)


def search(
    predicted_n: int,
    n_layer: int,
    run: Callable[[int], tuple[str, float | None]],
    safety_layers: int = 0,
    spill_ratio: float = SPILL_RATIO,
) -> TuneResult:
    """Find the lowest feasible n with `run(n) -> (status, tg tok/s)`, starting from the prediction."""
    result = TuneResult(predicted_n=predicted_n, lowest_n=None, chosen_n=None, chosen_tok_s=None)
    cache: dict[int, Probe] = {}

    def probe(n: int) -> Probe:
        if n not in cache:
            status, tok_s = run(n)
            cache[n] = Probe(n, status, tok_s)
            result.probes.append(cache[n])
            log.info("probe n_cpu_moe=%d: %s%s", n, status, f", {tok_s:.2f} tok/s" if tok_s else "")
        return cache[n]

    def feasible(n: int) -> bool:
        p = probe(n)
        if p.status != "ok":
            return False
        above = cache.get(n + 1)
        # A collapse against a neighbour that ran means the device silently spilled.
        return not (above and above.tg_tok_s and p.tg_tok_s is not None and p.tg_tok_s < spill_ratio * above.tg_tok_s)

    lo, hi = 0, n_layer  # invariant: the answer lies in [lo, hi]; hi may be infeasible only if nothing is
    start = min(max(predicted_n, 0), n_layer)
    if feasible(start):
        hi = start
        if start == 0 or not feasible(start - 1):
            lo = start
        else:
            hi = start - 1
    else:
        lo = start + 1
    lo = lowest(lo, hi, feasible)
    if lo > n_layer or not feasible(lo):
        return result  # even all experts on the host does not run: the context does not fit
    result.lowest_n = lo
    result.chosen_n = min(n_layer, lo + safety_layers)
    result.chosen_tok_s = probe(result.chosen_n).tg_tok_s
    return result


def tune_record(
    model: str, ctx: int, result: TuneResult, device: str, safety_layers: int, type_k: str, type_v: str
) -> Row:
    return {
        "model": model,
        "ctx": ctx,
        "cache_type": type_k if type_k == type_v else f"{type_k}/{type_v}",
        "device": device,
        "predicted_n": result.predicted_n,
        "lowest_feasible_n": result.lowest_n,
        "safety_layers": safety_layers,
        "chosen_n": result.chosen_n,
        "chosen_tg_tok_s": result.chosen_tok_s,
        "loads": result.loads,
        "probes": ";".join(f"{p.n_cpu_moe}:{p.status}" for p in result.probes),
        "status": "ok" if result.chosen_n is not None else "does_not_fit",
    }


def tune(
    model_path: str, workload: Workload, device: DeviceSetup, n_layer: int, predicted_n: int, probing: Probing
) -> TuneResult:
    """Run the search with real llama-bench probes of `workload` on the given device."""
    files = inspect_model(model_path).file_records()
    w, settings = workload, probing.settings
    probes = replace(
        probe_settings(settings.threads, settings.timeout_s),
        type_k=w.type_k,
        type_v=w.type_v,
        ubatch=w.ubatch,
        flash_attn=w.flash_attn,
    )
    rig = probing.rig(probes, device)

    def run(n: int) -> tuple[str, float | None]:
        job = BenchJob(str(model_path), str(model_path), files, w.ctx, n, "tune-probe", depth=w.ctx - PROBE_TOKENS)
        (record,) = run_bench(job, rig)
        return record["status"], record["avg_ts"]

    return search(predicted_n, n_layer, run, settings.safety_layers, 0.0 if device.kind == "emulated" else SPILL_RATIO)


def calibrate_runs(
    model_path: str, meta: ModelMeta, workload: Workload, target: DeviceTarget, chosen_n: int, probing: Probing
) -> list[BenchRecord]:
    """Decode and prefill with `workload`'s KV cache type, ubatch and flash attention at the chosen n and with every
    expert on the host (half of them where that is the chosen n), at an empty context, in one llama-bench process:
    two placements give the speed model's fixed time and host terms (speed_fit.fit); its depth term stays the
    prior's."""
    w, settings = workload, probing.settings
    bench = BenchSettings(
        prompt=w.ubatch,
        gen=CALIBRATION_GEN,
        repetitions=CALIBRATION_REPETITIONS,
        threads=settings.threads,
        timeout_s=settings.timeout_s,
        type_k=w.type_k,
        type_v=w.type_v,
        ubatch=w.ubatch,
        flash_attn=w.flash_attn,
    )
    other = meta.n_layer if chosen_n < meta.n_layer else meta.n_layer // 2
    job = BenchJob(str(model_path), str(model_path), meta.file_records(), w.ctx, chosen_n, "tune-calibration", depth=0)
    return run_sweep(job, [chosen_n, other], probing.rig(bench, device_setup(target, probing.manifest)))


def tune_model(
    *,
    model_name: str,
    model_path: str,
    meta: ModelMeta,
    workload: Workload,
    target: DeviceTarget,
    memory: Device,
    probing: Probing,
) -> tuple[TuneResult, Row]:
    """The tuner for one model and workload (context, KV cache type, ubatch), from the budget's prediction: the
    result and its record (what the pipeline's tune stage writes and `moeplace tune` prints). A workload llama.cpp
    refuses (runtime/llamacpp_args.refusal) is recorded UNSUPPORTED, with no probe."""
    settings = probing.settings
    device = device_setup(target, probing.manifest)
    if reason := refusal(workload.flash_attn, workload.type_v):
        log.info("%s at %d tokens: %s; recorded %s", model_name, workload.ctx, reason, UNSUPPORTED)
        result = TuneResult(predicted_n=meta.n_layer, lowest_n=None, chosen_n=None, chosen_tok_s=None)
        w = workload
        record = tune_record(model_name, w.ctx, result, device.label, settings.safety_layers, w.type_k, w.type_v)
        return result, {**record, "predicted_n": None, "status": UNSUPPORTED, "device_kind": device.kind}
    margin = margin_on(device, probing.manifest, memory)
    if device.other_caps:  # several devices: --n-cpu-moe with llama.cpp's own split over them
        predicted = minimum_ncmoe(meta, [Device(cap, margin) for cap in device.caps], workload)[0]
    else:
        predicted = plan(meta, Device(device.cap_bytes, margin), workload)["n_cpu_moe"]
    log.info("predicted minimum n_cpu_moe at %d tokens: %s; probing on %s", workload.ctx, predicted, device.label)
    start = meta.n_layer if predicted is None else predicted
    result = tune(model_path, workload, device, meta.n_layer, start, probing)
    w = workload
    record = tune_record(model_name, w.ctx, result, device.label, settings.safety_layers, w.type_k, w.type_v)
    return result, {**record, "device_kind": device.kind}


def matrix_table(tune: Any) -> Any:
    """Seed 001's table: per model and context, the tuned n and its decode speed."""
    columns = {
        "model": "model",
        "cache_type": "cache_type",
        "ctx": "ctx",
        "predicted_n": "budget_n",
        "chosen_n": "recommended_n",
        "chosen_tg_tok_s": "tg_tok_s",
        "loads": "loads",
        "status": "status",
        "device": "device",
    }
    return tune[list(columns)].rename(columns=columns).sort_values(["model", "cache_type", "ctx"], ignore_index=True)
