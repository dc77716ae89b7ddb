"""Stage 'fidelity': how well the speed model predicts runs it was not fitted to.

For every model: "two_point" fits each test to the lowest and the highest n measured at one depth (what a
user with two runs has) and predicts every other (n, depth, test) point; "loo" predicts each point from a
fit to all the others; "prior" predicts every point from what the ceilings stage measured (bandwidths, the
model's attention cost, and its fixed time and host cost from the probe's own runs) or else the datasheet's
bandwidths, fitted to no run of the sweep (prefill only where the probe ran both placements). Predictions at a depth a
fit never saw take the depth term from the prior: the attention cost the ceilings stage measured (scaled with
the fit's fixed time where the probe measured that too: speed_fit._shares), or the KV bytes over the device's
bandwidth. Errors are (predicted - measured) / measured. A two-point row names the
coefficients its fit pushed to zero (`fit_at_zero`): two runs where more experts on the host ran as fast make
that fit flat across placements.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from ..core.errors import MoeplaceError
from ..core.records import BenchRecord
from ..model.meta import ModelMeta
from ..plan.calibrate import runs_from_records
from ..plan.speed import SpeedModel
from ..plan.speed_fit import leave_one_out, two_point

COLUMNS = [
    "model",
    "ctx",
    "depth",
    "test",
    "n_cpu_moe",
    "overrides",
    "measured_tok_s",
    "predicted_tok_s",
    "predicted_low",
    "predicted_high",
    "error_pct",
    "fit",
    "fit_depth",
    "fit_at_zero",
]


def fidelity_table(
    meta: ModelMeta,
    records: list[BenchRecord],
    base: SpeedModel,
    probed: Collection[tuple[int, int]] = (),
    anchors: Collection[tuple[int, int]] = (),
) -> pd.DataFrame:
    """One model's out-of-sample predictions: every two-point fit (one per depth), leave-one-out and the
    uncalibrated prior `base`. The `-ncmoe` runs at a (n_cpu_moe, depth) in `probed` are not scored: the
    ceilings stage ran that configuration to time attention, and `base` holds what it measured, which every fit
    carries. Those in `anchors` are not scored against the prior, whose fixed time and host cost they gave."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("avg_ts")]
    runs = runs_from_records(meta, ok)
    rows = []

    def row(i: int, pred: dict[str, float] | None, how: str, fit_depth: int | None, at_zero: str = "") -> None:
        config = (runs[i].n_cpu_moe, runs[i].depth)
        if pred is None or (not runs[i].host_tensors and (config in probed or (how == "prior" and config in anchors))):
            return
        r, run = ok[i], runs[i]
        assert run.tok_s is not None  # runs from records are measured
        rows.append(
            {
                "model": r["model"],
                "ctx": r["ctx"],
                "depth": run.depth,
                "test": run.test,
                "n_cpu_moe": run.n_cpu_moe,
                "overrides": r.get("overrides") or "",
                "measured_tok_s": run.tok_s,
                "predicted_tok_s": pred["tok_s"],
                "predicted_low": pred["low"],
                "predicted_high": pred["high"],
                "error_pct": 100 * (pred["tok_s"] - run.tok_s) / run.tok_s,
                "fit": how,
                "fit_depth": fit_depth,
                "fit_at_zero": at_zero,
            }
        )

    for depth in sorted({r.depth for r in runs}):
        try:
            model, used = two_point(meta, runs, depth, base)
        except MoeplaceError:  # a depth with too few runs has no two-point fit
            continue
        for i, run in enumerate(runs):
            fitted = model.tests.get(run.test)
            if i not in used and fitted and fitted.fitted:  # a test without two n here keeps the prior: no fit
                row(i, model.predict(meta, run), "two_point", depth, " ".join(fitted.at_zero))
    for i, pred in enumerate(leave_one_out(meta, runs, base)):
        row(i, pred, "loo", None)
    for i, run in enumerate(runs):
        row(i, base.predict(meta, run), "prior", None)
    return pd.DataFrame(rows, columns=COLUMNS)


def scope(table: pd.DataFrame) -> pd.Series:
    """What each prediction was: a two-point fit's at its own depth or at another (one median over both
    would hide either), else the fit's name."""
    other = np.where(table.depth == table.fit_depth, "two_point, fit depth", "two_point, other depth")
    return table.fit.where(table.fit != "two_point", other)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th-percentile |error| per scope (see `scope`), test and depth (and over all depths), and how
    often the prediction's ~95% interval held the measured speed."""
    table = table.assign(scope=scope(table))
    out = []
    for keys, g in list(table.groupby(["scope", "test", "depth"])) + [
        ((f, t, "all"), g) for (f, t), g in table.groupby(["scope", "test"])
    ]:
        err = g.error_pct.abs()
        inside = g.measured_tok_s.between(g.predicted_low, g.predicted_high)
        out.append(
            {
                "fit": keys[0],
                "test": keys[1],
                "depth": keys[2],
                "points": len(g),
                "median_abs_error_pct": float(err.median()),
                "p90_abs_error_pct": float(np.percentile(err, 90)),
                "covered_pct": 100 * float(inside.mean()),
            }
        )
    return pd.DataFrame(out)
