"""What a bench record holds of its test: the statistics of an arm's repetitions (the median and its
distribution-free interval, llama-bench's mean and spread, whether the precision wanted was reached) or how it
failed; and llama.cpp's own accounting from its -v log (each context's KV bytes, where overridden tensors went).
"""

from __future__ import annotations

import math
import statistics
from typing import TypedDict, cast

from ..core.config import BenchSettings
from ..core.records import BenchRecord, KvContext, LlamaBenchRow
from ..core.stats import median_halfwidth, median_interval, outlying
from ..runtime.llama_log import read_log
from .repetitions import Arm, precise_enough


class ParsedLog(TypedDict):
    """What a bench record keeps of llama.cpp's -v log."""

    contexts: list[KvContext]
    tensor_buffers: dict[str, str]  # overridden tensor -> its buffer
    buffers: dict[str, dict[str, int]] | None  # the largest context's buffers: name -> kind -> bytes


def parse_log(stderr: str) -> ParsedLog:
    """llama.cpp's own accounting from a -v log: each context's size and KV bytes, each overridden tensor's
    destination buffer (CPU, CPU_REPACK: host RAM; CUDA0, RPC0[...]: a device) and, for the memory check, the
    buffers of its largest context by name (llama-bench loads once per test; CUDA0, CUDA_Host, CPU_Mapped ...)."""
    report = read_log(stderr)
    contexts = [context for load in report.loads for context in load.each_context() if context.n_ctx]
    kv = [
        KvContext(n_ctx=n_ctx, kv_mib=sum(k.get("kv", 0) for k in c.sizes.values()) / 2**20)
        for c in contexts
        if (n_ctx := c.n_ctx)
    ]
    largest = max(contexts, key=lambda c: (c.n_ctx, sum(k.get("kv", 0) for k in c.sizes.values())), default=None)
    return {
        "contexts": kv,
        "tensor_buffers": dict(sorted(report.overridden.items())),
        "buffers": largest.sizes if largest else None,
    }


def measured_record(
    base: BenchRecord, test: str, arm: Arm, baseline: Arm | None, settings: BenchSettings, contended: bool | None
) -> BenchRecord:
    """The record of one test of `arm`: the statistics of its repetitions, or its failure."""
    samples = arm.samples.get(test) or []
    if not samples:
        return _failed(base, test, arm)
    mean = statistics.fmean(samples)
    cv = statistics.stdev(samples) / mean if len(samples) > 1 and mean else 0.0
    median, low, high = median_interval(samples)
    halfwidth = median_halfwidth(samples)
    paired = baseline.samples.get(test) if baseline else None
    first = arm.first[test]
    record: BenchRecord = {
        **base,
        "test": test,
        # a run that failed after some repetitions keeps them, under its failure's status (partial)
        "status": arm.failure[0] if arm.failure else "ok",
        "partial": bool(arm.failure),
        # The configuration's value is the median; llama-bench's mean and sd are kept beside it.
        "median_ts": median,
        "ci95_low_ts": None if math.isnan(low) else low,
        "ci95_high_ts": None if math.isnan(high) else high,
        "interval": "order statistics of the median (95%); none below 6 repetitions",
        "outlying_ts": outlying(samples, settings.precision),
        "avg_ts": mean,
        "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "samples_ts": samples,
        "samples_noise": arm.noise.get(test) or [None] * len(samples),
        "warmup_ts": arm.warmups.get(test) or [],
        "repetitions": len(samples),
        "cv": cv,
        "ci95_halfwidth_pct": 100 * halfwidth if math.isfinite(halfwidth) else None,
        "target_reached": precise_enough({test: samples}, {test: paired} if paired else None, settings.precision)
        if settings.adaptive
        else None,
        "noisy": cv > settings.noisy_cv or bool(contended),
        "backends": first.get("backends"),
        "gpu_info": first.get("gpu_info"),
        # llama-bench's own row of the first batch (its per-sample arrays aside), for the published SQLite.
        "llama_bench": cast(LlamaBenchRow, {k: v for k, v in first.items() if not k.startswith("samples_")}),
        "error": "" if not arm.failure else f"stopped after {len(samples)} repetitions: {arm.failure[1]}",
    }
    if baseline is not None:
        record["baseline_samples_ts"] = paired or []
    return record


def _failed(base: BenchRecord, test: str, arm: Arm) -> BenchRecord:
    """The record of a test without a single repetition: its failure."""
    status, reason, stderr_tail = arm.failure or ("error", "no result", "")
    return {
        **base,
        "test": test,
        "status": status,
        "median_ts": None,
        "ci95_low_ts": None,
        "ci95_high_ts": None,
        "outlying_ts": [],
        "avg_ts": None,
        "stddev_ts": None,
        "samples_ts": [],
        "repetitions": 0,
        "cv": None,
        "ci95_halfwidth_pct": None,
        "target_reached": None,
        "noisy": None,
        "backends": None,
        "gpu_info": None,
        "error": f"{reason}: {stderr_tail}",
    }
