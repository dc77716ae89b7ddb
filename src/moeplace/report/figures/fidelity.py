"""Stage 'fidelity': the speed model's out-of-sample predictions against the measured speeds."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import cast

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...runtime.outputs import atomic_path
from ..fidelity import scope


def fidelity_figure(table: pd.DataFrame, out: str | Path, device: str) -> None:
    """Predicted against measured tok/s, log-log, y = x; one marker per fit (a two-point fit's own depth and
    the other depths apart), one colour per test."""
    fig, ax = plt.subplots(figsize=(7, 7.5))
    markers = {"two_point, fit depth": "o", "two_point, other depth": "s", "loo": "x", "prior": "+"}
    for key, g in table.groupby([scope(table), "test"]):
        fit, test = cast(tuple[str, str], key)  # the fit's scope and the test
        err = g.error_pct.abs()
        name = fit.replace("two_point", "two-point")
        label = f"{test} {name}: median |error| {err.median():.1f}%, p90 {np.percentile(err, 90):.1f}%"
        ax.scatter(
            g.measured_tok_s,
            g.predicted_tok_s,
            marker=markers.get(fit, "."),
            label=label,
            color="C0" if test == "tg" else "C1",
            alpha=0.7,
        )
    values = pd.concat([table.measured_tok_s, table.predicted_tok_s]).dropna()
    if len(values):
        lo, hi = values.min() / 1.3, values.max() * 1.3
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = measured")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured speed, tokens/s")
    ax.set_ylabel("predicted speed (out of sample), tokens/s")
    ax.set_title(f"Speed model against runs it was not fitted to\n{textwrap.fill(device, 90)}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)  # off the points
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)
