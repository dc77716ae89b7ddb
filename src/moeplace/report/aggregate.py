"""Stage 'aggregate': bench records -> measured, predicted-vs-measured (with the knee) and KV-check tables."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pandas as pd

from ..core.records import BenchRecord, Row
from ..model.memory import Pins, Workload, device_need
from ..model.meta import ModelMeta
from ..plan.calibrate import runs_from_records
from ..plan.speed import SpeedModel
from ..plan.speed_fit import leave_one_out
from ..runtime.llama_names import is_host
from ..runtime.llamacpp_args import DEFAULT_FLASH_ATTN, DEFAULT_UBATCH

MEASURED_COLUMNS = [
    "model",
    "ctx",
    "n_cpu_moe",
    "variant",
    "test",
    "status",
    "median_ts",
    "ci95_low_ts",
    "ci95_high_ts",
    "avg_ts",
    "stddev_ts",
    "samples",
    "outlying",
    "cv",
    "ci95_halfwidth_pct",
    "precision_target",
    "target_reached",
    "noisy",
    "contended",
    "others_running",
    "batches",
    "device",
    "device_kind",
    "threads",
    "repetitions",
    "n_prompt",
    "n_gen",
    "type_k",
    "type_v",
    "llamacpp_version",
    "llamacpp_commit",
    "pipeline_commit",
    "pipeline_dirty",
    "host",
    "cpu",
    "load_avg_1m",
    "model_size",
    "model_header_sha256",
    "started",
    "error",
]


def measured_table(records: list[BenchRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        files = r.get("model_files") or []
        rows.append(
            {
                **{k: r.get(k) for k in MEASURED_COLUMNS},
                "samples": len(r.get("samples_ts") or []),
                "outlying": len(r.get("outlying_ts") or []),
                "model_size": sum(f["size"] for f in files),
                "model_header_sha256": ";".join(f["header_sha256"][:16] for f in files),
                "error": (r.get("error") or "").replace("\n", " | ")[-300:],
            }
        )
    table = pd.DataFrame(rows, columns=MEASURED_COLUMNS)
    return table.sort_values(["model", "ctx", "variant", "n_cpu_moe", "test"], ignore_index=True)


def knee(ns: list[int], values: list[float], noise: float = 0.0) -> int | None:
    """The knee of a falling tok/s-vs-n curve: the point farthest below the chord joining its ends,
    with both axes scaled to [0, 1] (Kneedle). Past it, each extra offloaded layer costs less speed
    than the average layer does; before it, more. None with fewer than three points, or when the
    curve falls from its first to its last point by no more than twice its noise (a typical standard
    deviation): it is flat."""
    if len(ns) < 3:
        return None
    x = np.asarray(ns, dtype=float)
    y = np.asarray(values, dtype=float)
    if np.ptp(x) == 0 or np.ptp(y) == 0 or y[0] - y[-1] <= 2 * noise:
        return None
    xs, ys = (x - x.min()) / np.ptp(x), (y - y.min()) / np.ptp(y)
    chord = ys[0] + (ys[-1] - ys[0]) * (xs - xs[0]) / (xs[-1] - xs[0])
    gap = chord - ys  # a convex falling curve sags below its chord
    i = int(np.argmax(gap))
    return int(x[i]) if gap[i] > 0 else None


def compare_table(
    measured: pd.DataFrame,
    records: list[BenchRecord],
    metadata: dict[str, ModelMeta],
    budget: dict[str, pd.DataFrame],
    base: SpeedModel,
) -> pd.DataFrame:
    """Per (model, ctx, n): the measured tg and pp beside the speed model's out-of-sample prediction of each
    point (fitted to every other point of the sweep: leave-one-out) with its ~95% interval, and the knees."""
    rows = []
    sweep = measured[measured.variant == "ncmoe"]
    for key, group in sweep.groupby(["model", "ctx"]):
        model, ctx = cast(tuple[str, int], key)  # the model and ctx columns' values
        ok_records = [r for r in records if r["model"] == model and r["ctx"] == ctx and r["variant"] == "ncmoe"]
        ok_records = [r for r in ok_records if r["status"] == "ok" and r.get("avg_ts")]
        runs = runs_from_records(metadata[model], ok_records)
        predicted = {
            (run.test, run.n_cpu_moe): pred
            for run, pred in zip(runs, leave_one_out(metadata[model], runs, base))
            if pred is not None
        }
        b = cast("pd.Series[Any]", budget[model].set_index("ctx").loc[ctx])  # the budget table's row of this ctx
        tg = group[(group.test == "tg")].set_index("n_cpu_moe")
        pp = group[(group.test == "pp")].set_index("n_cpu_moe")
        ok = tg[tg.status == "ok"].sort_index()
        noise = float(ok.stddev_ts.median()) if len(ok) else 0.0
        measured_knee = knee(ok.index.tolist(), ok.median_ts.tolist(), noise)
        for n in sorted(set(tg.index) | set(pp.index)):
            row: Row = {"model": model, "ctx": ctx, "n_cpu_moe": n}
            for test, table in (("tg", tg), ("pp", pp)):
                m = table.loc[n] if n in table.index else None
                done = m if m is not None and m.status == "ok" else None
                pred = predicted.get((test, n))
                value = None if done is None else done.median_ts
                row |= {
                    f"{test}_status": None if m is None else m.status,
                    f"measured_{test}_tok_s": value,
                    f"measured_{test}_low": None if done is None else done.ci95_low_ts,
                    f"measured_{test}_high": None if done is None else done.ci95_high_ts,
                    f"measured_{test}_sd": None if done is None else done.stddev_ts,
                    f"predicted_{test}_tok_s": None if pred is None else pred["tok_s"],
                    f"predicted_{test}_low": None if pred is None else pred["low"],
                    f"predicted_{test}_high": None if pred is None else pred["high"],
                    f"{test}_error_pct": 100 * (pred["tok_s"] - value) / value if pred and value else None,
                }
            row |= {
                "budget_min_n": b.n_cpu_moe if b.status == "ok" else None,
                "knee_measured": measured_knee,
                "noise_tok_s": noise,
                "device": group.device.iloc[0],
            }
            rows.append(row)
    table = pd.DataFrame(rows)
    numeric = [c for c in table.columns if c.startswith(("measured_", "predicted_")) or c.endswith("_error_pct")]
    table[numeric] = table[numeric].apply(pd.to_numeric, errors="coerce").astype(float)  # None: not predictable
    return table


# How far ours may be from llama.cpp's and still agree. Weights and KV are exact: llama.cpp prints 0.01 MiB, each
# tensor padded to its alignment (bytes). Compute is our estimate of the scheduler's reserve (memory.py), the
# graph's largest live tensors summed without the allocator's reuse: never far under llama.cpp's (an under-estimate
# risks an out-of-memory), often over (llama.cpp packs the attention mask and the logits tighter: 36.01 MiB against
# our 42.00 on the tiny qwen3moe twin at 32K with every expert on the host; on real cards with every matrix on the
# device 1.00-1.11 of the log). Shares of llama.cpp's figure, under and over:
EXACT_TOLERANCE = 0.05 * 2**20
COMPUTE_TOLERANCE = (-0.05, 0.20)


def device_buffers(buffers: dict[str, dict[str, int]]) -> tuple[dict[str, int], int]:
    """llama.cpp's device bytes per kind from a run's buffers by name (host buffers such as CUDA_Host and
    CPU_Mapped left out), and how many devices held them. Over several devices the weights and the KV cache add
    up to what one device would hold; each device's compute buffer does not, so it is left out there."""
    devices = [kinds for name, kinds in buffers.items() if not is_host(name)]
    total = {
        kind: sum(d.get(kind, 0) for d in devices)
        for kind in ("weights", "kv", "compute")
        if any(kind in d for d in devices)
    }
    if len(devices) > 1:
        total.pop("compute", None)
    return total, len(devices)


def memory_check_table(records: list[BenchRecord], metadata: dict[str, ModelMeta]) -> pd.DataFrame:
    """llama.cpp's own device buffers (from each run's -v log: its largest context) against our memory model
    (memory.py: weights and KV exact, compute our estimate), per run and buffer."""
    rows = []
    for r in records:
        contexts = [c for c in r.get("kv_contexts") or [] if c["kv_mib"]]
        logged = r.get("buffers")
        if not logged or not contexts or r.get("test", "tg") != "tg":
            continue  # one row set per run (its tg record), and only where llama.cpp logged its buffers
        buffers, devices = device_buffers(logged)
        meta = metadata[r["model"]]
        n_ctx = max(c["n_ctx"] for c in contexts)
        w = Workload(
            n_ctx, r.get("ubatch", DEFAULT_UBATCH), r.get("flash_attn", DEFAULT_FLASH_ATTN), r["type_k"], r["type_v"]
        )
        host = frozenset(r.get("cpu_tensors") or []) if r.get("overrides") else frozenset()
        need = device_need(meta, w, 0 if host else r["n_cpu_moe"], pins=Pins(host=host))
        for buffer, ours in (("weights", need.weights), ("kv", need.kv), ("compute", need.compute)):
            if buffer not in buffers:
                continue  # an out-of-memory run never got to allocate it
            theirs = buffers[buffer]
            diff = ours - theirs
            rows.append(
                {
                    "model": r["model"],
                    "ctx": r["ctx"],
                    "n_ctx": n_ctx,
                    "n_cpu_moe": r["n_cpu_moe"],
                    "variant": r["variant"],
                    "type_k": r["type_k"],
                    "type_v": r["type_v"],
                    "devices": devices,
                    "buffer": buffer,
                    "llamacpp_mib": theirs / 2**20,
                    "ours_mib": ours / 2**20,
                    "diff_mib": diff / 2**20,
                    "diff_pct": 100 * diff / theirs if theirs else None,
                    "within_tolerance": within_tolerance(buffer, ours, theirs),
                }
            )
    columns = [
        "model",
        "ctx",
        "n_ctx",
        "n_cpu_moe",
        "variant",
        "type_k",
        "type_v",
        "devices",
        "buffer",
        "llamacpp_mib",
        "ours_mib",
        "diff_mib",
        "diff_pct",
        "within_tolerance",
    ]
    return pd.DataFrame(rows, columns=columns)


def within_tolerance(buffer: str, ours: int, theirs: int) -> bool:
    """Whether our figure for a device buffer agrees with llama.cpp's logged one."""
    if buffer != "compute":
        return abs(ours - theirs) <= EXACT_TOLERANCE
    under, over = COMPUTE_TOLERANCE
    return under * theirs <= ours - theirs <= over * theirs


def precision_table(measured: pd.DataFrame, variants: pd.DataFrame) -> pd.DataFrame:
    """How precise the values are, per stage, model, context and test: configurations measured, the median
    CV and 95% CI half-width (% of the median), the share that reached the precision target, the outlying
    repetitions, and for the placement variants the median smallest detectable difference from -ncmoe (% of
    its mean)."""
    rows = []
    sweep = measured[(measured.variant == "ncmoe") & (measured.status == "ok")]
    for (model, ctx, test), g in sweep.groupby(["model", "ctx", "test"]):
        reached = g.target_reached.dropna()
        rows.append(
            {
                "stage": "bench",
                "model": model,
                "ctx": ctx,
                "test": test,
                "configurations": len(g),
                "median_repetitions": float(g.repetitions.median()),
                "median_cv_pct": 100 * float(g.cv.median()),
                "median_ci95_halfwidth_pct": float(g.ci95_halfwidth_pct.median()),
                "reached_target_pct": 100 * float(reached.astype(bool).mean()) if len(reached) else None,
                "contended": int(g.contended.fillna(False).astype(bool).sum()),
                "outlying": int(g.outlying.sum()),
            }
        )
    compared = variants[(variants.status == "ok") & variants.get("mde_pct", pd.Series(dtype=float)).notna()]
    for (model, ctx, test), g in compared.groupby(["model", "ctx", "test"]):
        rows.append(
            {
                "stage": "variants",
                "model": model,
                "ctx": ctx,
                "test": test,
                "configurations": len(g),
                "median_repetitions": float(g.repetitions.median()),
                "median_ci95_halfwidth_pct": float(
                    ((g.delta_ci95_high - g.delta_ci95_low) / 2 / g.baseline_ts).median()
                )
                * 100,
                "median_mde_pct": float(g.mde_pct.median()),
                "max_mde_pct": float(g.mde_pct.max()),
                "distinguishable": int(g.distinguishable.fillna(False).astype(bool).sum()),
            }
        )
    columns = [
        "stage",
        "model",
        "ctx",
        "test",
        "configurations",
        "median_repetitions",
        "median_cv_pct",
        "median_ci95_halfwidth_pct",
        "reached_target_pct",
        "median_mde_pct",
        "max_mde_pct",
        "contended",
        "outlying",
        "distinguishable",
    ]
    return pd.DataFrame(rows, columns=columns)
