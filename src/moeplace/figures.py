"""Stage 'figures': tok/s against --n-cpu-moe, measured beside predicted, one panel per model."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .outputs import atomic_path  # noqa: E402
from .units import Context  # noqa: E402

FAILED = ("oom", "crash", "timeout", "error")


def ncmoe_figure(
    compare: pd.DataFrame,
    measured: pd.DataFrame,
    predicted: dict[str, pd.DataFrame],
    ctx: int,
    test: str,
    out: str | Path,
) -> None:
    """test 'tg' (decode, with the predictions) or 'pp' (prefill, measured only)."""
    models = sorted(compare.model.unique()) or sorted(predicted)
    fig, axes = plt.subplots(1, len(models), figsize=(6.8 * len(models), 5.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        c = compare[compare.model == model].sort_values("n_cpu_moe")
        m = measured[(measured.model == model) & (measured.test == test) & (measured.variant == "ncmoe")]
        m = m.sort_values("n_cpu_moe")
        ok = m[m.status == "ok"]
        failed = m[m.status.isin(FAILED)]
        device = m.device.iloc[0] if len(m) else ""
        n_max = int(predicted[model].n_cpu_moe.max())
        if len(failed):
            # Everything below the smallest n that ran is infeasible on this device.
            edge = ok.n_cpu_moe.min() if len(ok) else n_max + 0.5
            ax.axvspan(-0.5, edge - 0.5, color="tab:red", alpha=0.08, label="does not fit (measured OOM)")
            for r in failed.itertuples():
                ax.annotate(
                    r.status.upper(),
                    (r.n_cpu_moe, 0),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    fontsize=8,
                    color="tab:red",
                    xycoords=("data", "axes fraction"),
                )
        ax.errorbar(
            ok.n_cpu_moe,
            ok.avg_ts,
            yerr=ok.stddev_ts,
            fmt="o-",
            color="tab:blue",
            capsize=3,
            label=f"measured {test} (mean ± sd, {int(ok.repetitions.max()) if len(ok) else 0} reps)",
        )
        if test == "tg":
            p = predicted[model]
            theory_ax = ax
            if len(ok) and p.tok_s.max() > 3 * ok.avg_ts.max():
                # Far above what was measured (e.g. a CPU-bound emulated device): its own axis keeps both readable.
                theory_ax = ax.twinx()
                theory_ax.set_ylabel("theoretical prediction, tokens/s", color="tab:gray")
                theory_ax.set_ylim(0, p.tok_s.max() * 1.1)
            theory_ax.plot(p.n_cpu_moe, p.tok_s, "--", color="tab:gray")
            ax.plot(
                [],
                [],
                "--",
                color="tab:gray",
                label="predicted (theoretical bandwidth)" + (", right axis" if theory_ax is not ax else ""),
            )
            if len(c) and c.eta_median.notna().any():
                eta = c.eta_median.iloc[0]
                ax.plot(
                    p.n_cpu_moe, eta * p.tok_s, ":", color="tab:orange", label=f"calibrated prediction (η = {eta:.2f})"
                )
            if len(c) and pd.notna(c.knee_measured.iloc[0]):
                k = int(c.knee_measured.iloc[0])
                ax.plot(
                    [k],
                    ok.set_index("n_cpu_moe").avg_ts.get(k, float("nan")),
                    "*",
                    ms=16,
                    color="tab:green",
                    label=f"measured knee (n = {k})",
                    zorder=5,
                )
        if len(c) and pd.notna(c.budget_min_n.iloc[0]):
            n_min = int(c.budget_min_n.iloc[0])
            ax.axvline(n_min, color="tab:purple", lw=1.2, label=f"budget minimum (n = {n_min})")
        ax.set_xlim(-0.5, n_max + 0.5)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("--n-cpu-moe (layers whose experts stay in host RAM)")
        ax.set_ylabel(f"{'decode (tg)' if test == 'tg' else 'prefill (pp)'} speed, tokens/s")
        ax.set_title(f"{model}, {Context(ctx)} context ({ctx:,} tokens)\n{device}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.suptitle(
        f"{'Decode' if test == 'tg' else 'Prefill'} speed vs expert offload at {Context(ctx)} context", fontsize=12
    )
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)


def matrix_figure(matrix: pd.DataFrame, out: str | Path) -> None:
    """Heatmaps over model x context: the recommended --n-cpu-moe and its decode speed."""
    import numpy as np

    matrix = matrix.assign(row=matrix.model + " · KV " + matrix.cache_type)
    models = sorted(matrix.row.unique())
    contexts = sorted(matrix.ctx.unique())
    fig, axes = plt.subplots(1, 2, figsize=(5 + 1.6 * len(contexts) * 2, 1.8 + 0.7 * len(models)))
    for ax, column, title, cmap in (
        (axes[0], "recommended_n", "recommended --n-cpu-moe", "viridis"),
        (axes[1], "tg_tok_s", "decode speed there, tokens/s", "magma"),
    ):
        grid = matrix.pivot(index="row", columns="ctx", values=column).reindex(index=models, columns=contexts)
        values = grid.to_numpy(dtype=float)
        image = ax.imshow(values, cmap=cmap, aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            light = np.isnan(v) or image.norm(v) > 0.6  # both colormaps end light: dark text there
            ax.text(
                j,
                i,
                "does not fit" if np.isnan(v) else (f"{v:.0f}" if column == "recommended_n" else f"{v:.1f}"),
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
    fig.suptitle(
        f"Tuned expert offload per model and context — {matrix.device.iloc[0] if 'device' in matrix else ''}",
        fontsize=10,
    )
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)


def variants_figure(variants: pd.DataFrame, ctx: int, out: str | Path) -> None:
    """Bars of decode and prefill speed per placement variant, one group per model."""
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    models = sorted(variants.model.unique())
    names = list(dict.fromkeys(variants.variant))
    width = 0.8 / max(len(models), 1)
    for ax, test in zip(axes, ("tg", "pp")):
        for k, model in enumerate(models):
            v = variants[(variants.model == model) & (variants.test == test)].set_index("variant").reindex(names)
            x = np.arange(len(names)) + k * width
            ax.bar(x, v.avg_ts.fillna(0), width, yerr=v.stddev_ts.fillna(0), capsize=3, label=model)
            for xi, status in zip(x, v.status):
                if status != "ok":
                    ax.text(xi, 0, str(status).upper(), ha="center", va="bottom", color="tab:red", fontsize=8)
        ax.set_xticks(np.arange(len(names)) + width * (len(models) - 1) / 2, names, rotation=15)
        ax.set_ylabel(f"{'decode (tg)' if test == 'tg' else 'prefill (pp)'} speed, tokens/s")
        ax.set_title(f"{'Decode' if test == 'tg' else 'Prefill'}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    title = f"Expert placements at equal host-resident bytes, {Context(ctx)} context ({ctx:,} tokens)"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)
