"""Stage 'aggregate': bench records -> measured, predicted-vs-measured (with the knee) and KV-check tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .kvcache import DEFAULT_UBATCH, kv_bytes

MEASURED_COLUMNS = [
    "model",
    "ctx",
    "n_cpu_moe",
    "variant",
    "test",
    "status",
    "avg_ts",
    "stddev_ts",
    "samples",
    "cv",
    "noisy",
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


def measured_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for r in records:
        files = r.get("model_files") or []
        rows.append(
            {
                **{k: r.get(k) for k in MEASURED_COLUMNS},
                "samples": len(r.get("samples_ts") or []),
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
    measured: pd.DataFrame, predicted: dict[str, pd.DataFrame], budget: dict[str, pd.DataFrame]
) -> pd.DataFrame:
    """Measured tg per (model, ctx, n) beside the prediction; eta = measured / predicted."""
    rows = []
    tg = measured[(measured.variant == "ncmoe") & (measured.test == "tg")]
    pp = measured[(measured.variant == "ncmoe") & (measured.test == "pp")].set_index(["model", "ctx", "n_cpu_moe"])
    for (model, ctx), group in tg.groupby(["model", "ctx"]):
        pred = predicted[model].set_index("n_cpu_moe")
        b = budget[model].set_index("ctx").loc[ctx]
        ok = group[group.status == "ok"]
        etas = ok.avg_ts.to_numpy() / pred.loc[ok.n_cpu_moe, "tok_s"].to_numpy()
        eta = float(np.median(etas)) if len(etas) else float("nan")
        ok_sorted = ok.sort_values("n_cpu_moe")
        noise = float(ok_sorted.stddev_ts.median()) if len(ok_sorted) else 0.0
        measured_knee = knee(ok_sorted.n_cpu_moe.tolist(), ok_sorted.avg_ts.tolist(), noise)
        n_min = b.n_cpu_moe if b.status == "ok" else None
        feasible = pred[pred.index >= (n_min if n_min is not None else len(pred))]
        predicted_knee = knee(feasible.index.tolist(), feasible.tok_s.tolist())
        for r in group.itertuples():
            p = pred.loc[min(r.n_cpu_moe, pred.index.max())]
            pp_row = pp.loc[(model, ctx, r.n_cpu_moe)] if (model, ctx, r.n_cpu_moe) in pp.index else None
            rows.append(
                {
                    "model": model,
                    "ctx": ctx,
                    "n_cpu_moe": r.n_cpu_moe,
                    "status": r.status,
                    "measured_tg_tok_s": r.avg_ts,
                    "measured_tg_stddev": r.stddev_ts,
                    "measured_pp_tok_s": None if pp_row is None else pp_row.avg_ts,
                    "predicted_tok_s": p.tok_s,
                    "eta": r.avg_ts / p.tok_s if r.status == "ok" else None,
                    "calibrated_tok_s": eta * p.tok_s,
                    "eta_median": eta,
                    "budget_min_n": n_min,
                    "knee_measured": measured_knee,
                    "knee_predicted": predicted_knee,
                    "device": r.device,
                }
            )
    return pd.DataFrame(rows)


def kv_check_table(records: list[dict[str, Any]], metadata: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """llama.cpp's own KV buffer size (from the -v log) against our KV model, per context it created."""
    rows = []
    seen = set()
    for r in records:
        meta = metadata[r["model"]]
        for c in r.get("kv_contexts") or []:
            key = (r["model"], r["ctx"], c["n_ctx"], r["type_k"], r["type_v"])
            if key in seen or not c["kv_mib"]:
                continue
            seen.add(key)
            ours = kv_bytes(meta, c["n_ctx"], r["type_k"], r["type_v"], min(DEFAULT_UBATCH, c["n_ctx"]))
            theirs = c["kv_mib"] * 2**20
            rows.append(
                {
                    "model": r["model"],
                    "ctx": r["ctx"],
                    "n_ctx": c["n_ctx"],
                    "type_k": r["type_k"],
                    "type_v": r["type_v"],
                    "llamacpp_kv_mib": c["kv_mib"],
                    "predicted_kv_mib": ours / 2**20,
                    "ratio": ours / theirs,
                    "within_1pct": abs(ours / theirs - 1) <= 0.01,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "model",
            "ctx",
            "n_ctx",
            "type_k",
            "type_v",
            "llamacpp_kv_mib",
            "predicted_kv_mib",
            "ratio",
            "within_1pct",
        ],
    )
