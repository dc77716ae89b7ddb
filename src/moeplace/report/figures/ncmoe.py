"""Stage 'figures': tok/s against --n-cpu-moe, measured beside predicted, one panel per model."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes

from ...core.units import Context
from ...runtime.llamacpp_args import UNSUPPORTED
from ...runtime.outputs import atomic_path

FAILED = ("oom", "crash", "timeout", "error", UNSUPPORTED)


def _reps(repetitions: pd.Series) -> str:
    low, high = (int(repetitions.min()), int(repetitions.max())) if len(repetitions) else (0, 0)
    return f"{low}" if low == high else f"{low}-{high}"


def ncmoe_figure(compare: pd.DataFrame, measured: pd.DataFrame, ctx: int, test: str, out: str | Path) -> None:
    """Decode ('tg') or prefill ('pp') speed against --n-cpu-moe, one panel per model: what was measured (the
    median with its 95% interval, or ± sd where the repetitions are too few for one) and, on the same axis, the
    speed model's out-of-sample prediction of each point with its band."""
    models = sorted(measured.model.unique())
    fig, axes = plt.subplots(1, max(len(models), 1), figsize=(6.8 * max(len(models), 1), 5.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        c = compare[compare.model == model].sort_values("n_cpu_moe")
        m = measured[(measured.model == model) & (measured.test == test) & (measured.variant == "ncmoe")]
        m = m.sort_values("n_cpu_moe")
        ok = m[m.status == "ok"]
        failed = m[m.status.isin(FAILED)]
        device = m.device.iloc[0] if len(m) else ""
        n_max = int(m.n_cpu_moe.max()) if len(m) else 0
        _mark_failed(ax, ok, failed)
        low, high = _interval(ok)
        few = " (± sd below 6)" if (ok.repetitions < 6).any() else ""
        label = f"measured {test}: median, 95% interval{few} ({_reps(ok.repetitions)} repetitions)"
        ax.errorbar(
            ok.n_cpu_moe,
            ok.median_ts,
            yerr=[ok.median_ts - low, high - ok.median_ts],
            fmt="o",
            color="tab:blue",
            capsize=3,
            label=label,
        )
        p = c[c[f"predicted_{test}_tok_s"].notna()] if len(c) else c
        _plot_predicted(ax, p, test)
        if test == "tg" and len(c) and pd.notna(c.knee_measured.iloc[0]):
            k = int(c.knee_measured.iloc[0])
            y = ok.set_index("n_cpu_moe").median_ts.get(k, float("nan"))
            # hollow, so the point and its interval show through
            ax.plot(
                [k], [y], "*", ms=18, mfc="none", mec="tab:green", mew=1.5, label=f"measured knee (n = {k})", zorder=5
            )
        if len(c) and pd.notna(c.budget_min_n.iloc[0]):
            n_min = int(c.budget_min_n.iloc[0])
            ax.axvline(n_min, color="tab:purple", lw=1.2, label=f"budget minimum (n = {n_min})")
        ax.set_xlim(-0.5, n_max + 0.5)
        _scale_to_measured(ax, ok, p, test)
        ax.set_xlabel("--n-cpu-moe (layers whose experts stay in host RAM)")
        ax.set_ylabel(f"{'decode (tg)' if test == 'tg' else 'prefill (pp)'} speed, tokens/s")
        ax.set_title(f"{model}, {Context(ctx)} context ({ctx:,} tokens)\n{textwrap.fill(device, 90)}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.suptitle(
        f"{'Decode' if test == 'tg' else 'Prefill'} speed vs expert offload at {Context(ctx)} context", fontsize=12
    )
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png", bbox_inches="tight")  # the legends below the axes whole
    plt.close(fig)


def _mark_failed(ax: Axes, ok: pd.DataFrame, failed: pd.DataFrame) -> None:
    """Shade what was measured not to fit: each n that ran out of memory, and below the smallest n that ran every
    n under the largest OOM there (fewer experts on the host need more of the device). Every failed run's status
    at its n; a crash, a timeout, an error or a refused setting is named as such, never drawn as out of memory."""
    ooms = failed[failed.status == "oom"].n_cpu_moe
    smallest_ok = ok.n_cpu_moe.min() if len(ok) else float("inf")
    below = ooms[ooms < smallest_ok]
    spans = [(-0.5, below.max() + 0.5)] if len(below) else []
    spans += [(n - 0.5, n + 0.5) for n in ooms[ooms > smallest_ok]]
    for i, (start, end) in enumerate(spans):
        ax.axvspan(start, end, color="tab:red", alpha=0.08, label="" if i else "does not fit (measured OOM)")
    for status, runs in failed[failed.status != "oom"].groupby("status"):
        at = ", ".join(str(n) for n in sorted(runs.n_cpu_moe))
        ax.plot([], [], ls="none", marker="x", color="dimgray", label=f"{status} at n = {at}: failed, not for memory")
    for r in failed.itertuples():
        ax.annotate(
            str(r.status).upper(),
            (r.n_cpu_moe, 0),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            color="tab:red" if r.status == "oom" else "dimgray",
            xycoords=("data", "axes fraction"),
        )


def _plot_predicted(ax: Axes, p: pd.DataFrame, test: str) -> None:
    """The speed model's out-of-sample prediction of each point (`p`: the rows that have one), with its band."""
    if not len(p):
        return
    err = p[f"{test}_error_pct"].abs().median()
    label = f"speed model, each point fitted without it (median |error| {err:.1f}%)"
    ax.plot(p.n_cpu_moe, p[f"predicted_{test}_tok_s"], "-", color="tab:orange", label=label)
    ax.fill_between(
        p.n_cpu_moe,
        p[f"predicted_{test}_low"],
        p[f"predicted_{test}_high"],
        color="tab:orange",
        alpha=0.2,
        label="~95% prediction interval",
    )


def _interval(ok: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Each point's 95% interval of its median; below 6 repetitions, where none exists, its sd about it."""
    low, high = (pd.to_numeric(ok[c], errors="coerce") for c in ("ci95_low_ts", "ci95_high_ts"))
    return low.fillna(ok.median_ts - ok.stddev_ts), high.fillna(ok.median_ts + ok.stddev_ts)


def _scale_to_measured(ax: Axes, ok: pd.DataFrame, predicted: pd.DataFrame, test: str) -> None:
    """The y axis spans what was measured (with room for its spread); a prediction or interval beyond it is cut
    at the top and marked there, so a wide interval never flattens the points."""
    if not len(ok):
        ax.set_ylim(bottom=0)
        return
    top = 1.3 * float(_interval(ok)[1].max())
    ax.set_ylim(0, top)
    if len(predicted):
        cut = predicted[predicted[f"predicted_{test}_high"] > top]
        if len(cut):
            ax.plot(
                cut.n_cpu_moe,
                [top] * len(cut),
                "^",
                color="tab:orange",
                ms=7,
                clip_on=False,
                zorder=6,
                label="prediction or its interval runs above the axis (cut)",
            )
