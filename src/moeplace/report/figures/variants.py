"""Stage 'placement': each expert placement's speed against --n-cpu-moe at the same host bytes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...core.units import Context
from ...runtime.outputs import atomic_path


def variants_figure(variants: pd.DataFrame, ctx: int, out: str | Path) -> None:
    """Each placement's speed difference from --n-cpu-moe at the same host bytes (over several devices: at the
    budget's minimum, with llama.cpp's own split), in % of --n-cpu-moe's speed, with its 95% interval; one row per
    variant and model, "not distinguishable" where the interval spans 0."""
    compared = variants[(variants.variant != "first_n") & variants.get("delta_pct", pd.Series(dtype=float)).notna()]
    models = sorted(variants.model.unique())
    names = [v for v in dict.fromkeys(variants.variant) if v != "first_n"]
    several = "device_plan" in names
    baseline = "--n-cpu-moe at equal host bytes"
    if several:
        baseline = "--n-cpu-moe n (the budget's minimum, llama.cpp's split)"
    fig, axes = plt.subplots(1, 2, figsize=(13, 2.0 + 0.45 * max(len(names) * len(models), 1)))
    height = 0.8 / max(len(models), 1)
    for ax, test in zip(axes, ("tg", "pp")):
        for k, model in enumerate(models):
            v = compared[(compared.model == model) & (compared.test == test)].set_index("variant").reindex(names)
            y = np.arange(len(names)) + k * height
            low = 100 * (v.delta_ci95_low / v.baseline_ts)
            high = 100 * (v.delta_ci95_high / v.baseline_ts)
            err = np.vstack([(v.delta_pct - low).fillna(0), (high - v.delta_pct).fillna(0)])
            ax.barh(y, v.delta_pct.fillna(0), height, xerr=err, capsize=3, color=f"C{k}", label=model)
            # Each label right of its bar and interval, so neither hides it.
            ends = np.nanmax(np.vstack([v.delta_pct.fillna(0), high.fillna(0), np.zeros(len(v))]), axis=0)
            for yi, end, row in zip(y, ends, v.itertuples()):
                if pd.isna(row.delta_pct):
                    text = "not measured"
                elif row.distinguishable:
                    text = f"{row.delta_pct:+.1f}% (MDE {row.mde_pct:.0f}%)"
                else:
                    text = f"not distinguishable (MDE {row.mde_pct:.0f}%)"
                ax.annotate(text, (end, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
        ax.axvline(0, color="black", lw=0.8)
        left, right = ax.get_xlim()
        ax.set_xlim(left, right + 0.6 * (right - left))  # room for the labels
        ax.set_yticks(np.arange(len(names)) + height * (len(models) - 1) / 2, names)
        ax.invert_yaxis()
        what = "decode (tg)" if test == "tg" else "prefill (pp)"
        ax.set_xlabel(f"{what} speed vs {baseline}\n% of its speed, 95% interval")
        ax.set_title("Decode" if test == "tg" else "Prefill", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        if len(models) > 1:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(models), frameon=False)
    devices = "; ".join(sorted(set(variants.get("device", pd.Series(dtype=str)).dropna())))
    how = "measured in turn" if several else "measured interleaved"
    title = f"Expert placements vs --n-cpu-moe, {Context(ctx)} context ({ctx:,} tokens), {how}"
    title = f"{models[0]}: {title}" if len(models) == 1 else title
    fig.suptitle(f"{title}\n{textwrap.fill(devices, 130)}" if devices else title, fontsize=10)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png", bbox_inches="tight")  # the legends below the axes whole
    plt.close(fig)
