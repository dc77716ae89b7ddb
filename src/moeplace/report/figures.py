"""Stage 'figures': tok/s against --n-cpu-moe, measured beside predicted, one panel per model."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..core.units import Context  # noqa: E402
from ..runtime.llamacpp_args import UNSUPPORTED  # noqa: E402
from ..runtime.outputs import atomic_path  # noqa: E402

FAILED = ("oom", "crash", "timeout", "error")


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
        if len(failed):
            # Everything below the smallest n that ran is infeasible on this device.
            edge = ok.n_cpu_moe.min() if len(ok) else n_max + 0.5
            ax.axvspan(-0.5, edge - 0.5, color="tab:red", alpha=0.08, label="does not fit (measured OOM)")
            for r in failed.itertuples():
                ax.annotate(r.status.upper(), (r.n_cpu_moe, 0), xytext=(0, 4), textcoords="offset points",
                            ha="center", fontsize=8, color="tab:red", xycoords=("data", "axes fraction"))  # fmt: skip
        low, high = _interval(ok)
        few = " (± sd below 6)" if (ok.repetitions < 6).any() else ""
        label = f"measured {test}: median, 95% interval{few} ({_reps(ok.repetitions)} repetitions)"
        ax.errorbar(ok.n_cpu_moe, ok.median_ts, yerr=[ok.median_ts - low, high - ok.median_ts], fmt="o",
                    color="tab:blue", capsize=3, label=label)  # fmt: skip
        p = c[c[f"predicted_{test}_tok_s"].notna()] if len(c) else c
        if len(p):
            err = p[f"{test}_error_pct"].abs().median()
            ax.plot(p.n_cpu_moe, p[f"predicted_{test}_tok_s"], "-", color="tab:orange",
                    label=f"speed model, each point fitted without it (median |error| {err:.1f}%)")  # fmt: skip
            ax.fill_between(p.n_cpu_moe, p[f"predicted_{test}_low"], p[f"predicted_{test}_high"], color="tab:orange",
                            alpha=0.2, label="~95% prediction interval")  # fmt: skip
        if test == "tg" and len(c) and pd.notna(c.knee_measured.iloc[0]):
            k = int(c.knee_measured.iloc[0])
            y = ok.set_index("n_cpu_moe").median_ts.get(k, float("nan"))
            # hollow, so the point and its interval show through
            ax.plot([k], [y], "*", ms=18, mfc="none", mec="tab:green", mew=1.5, label=f"measured knee (n = {k})",
                    zorder=5)  # fmt: skip
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


def _interval(ok: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Each point's 95% interval of its median; below 6 repetitions, where none exists, its sd about it."""
    low, high = (pd.to_numeric(ok[c], errors="coerce") for c in ("ci95_low_ts", "ci95_high_ts"))
    return low.fillna(ok.median_ts - ok.stddev_ts), high.fillna(ok.median_ts + ok.stddev_ts)


def _scale_to_measured(ax: plt.Axes, ok: pd.DataFrame, predicted: pd.DataFrame, test: str) -> None:
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
            ax.plot(cut.n_cpu_moe, [top] * len(cut), "^", color="tab:orange", ms=7, clip_on=False, zorder=6,
                    label="prediction or its interval runs above the axis (cut)")  # fmt: skip


def matrix_figure(matrix: pd.DataFrame, out: str | Path) -> None:
    """Heatmaps over model x context: the recommended --n-cpu-moe and its decode speed."""
    import numpy as np

    matrix = matrix.assign(row=matrix.model + " · KV " + matrix.cache_type, status=matrix.get("status", ""))
    models = sorted(matrix.row.unique())
    contexts = sorted(matrix.ctx.unique())
    fig, axes = plt.subplots(1, 2, figsize=(5 + 1.6 * len(contexts) * 2, 1.8 + 0.7 * len(models)))
    for ax, column, title, cmap in (
        (axes[0], "recommended_n", "recommended --n-cpu-moe", "viridis"),
        (axes[1], "tg_tok_s", "decode speed there, tokens/s", "magma"),
    ):
        grid = matrix.pivot(index="row", columns="ctx", values=column).reindex(index=models, columns=contexts)
        values = grid.to_numpy(dtype=float)
        status = matrix.pivot(index="row", columns="ctx", values="status").reindex(index=models, columns=contexts)
        image = ax.imshow(values, cmap=cmap, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            light = np.isnan(v) or image.norm(v) > 0.6  # both colormaps end light: dark text there
            ax.text(
                j,
                i,
                (UNSUPPORTED if status.iat[i, j] == UNSUPPORTED else "does not fit")
                if np.isnan(v)
                else (f"{v:.0f}" if column == "recommended_n" else f"{v:.1f}"),
                ha="center",
                va="center",
                color="black" if light else "white",
                fontsize=10,
            )
        ax.set_xticks(range(len(contexts)), [f"{Context(int(c))} context" for c in contexts])
        ax.set_yticks(range(len(models)), models)
        ax.set_xlabel("context length, tokens")
        ax.set_title(title, fontsize=10)
        fig.colorbar(image, ax=ax, shrink=0.8)
    device = matrix.device.iloc[0] if "device" in matrix else ""
    fig.suptitle(textwrap.fill(f"Tuned expert offload per model and context — {device}", 130), fontsize=10)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png", bbox_inches="tight")  # the legends below the axes whole
    plt.close(fig)


def variants_figure(variants: pd.DataFrame, ctx: int, out: str | Path) -> None:
    """Each placement's speed difference from --n-cpu-moe at the same host bytes (over several devices: at the
    budget's minimum, with llama.cpp's own split), in % of --n-cpu-moe's speed, with its 95% interval; one row per
    variant and model, "not distinguishable" where the interval spans 0."""
    import numpy as np

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
