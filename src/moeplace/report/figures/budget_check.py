"""Stage 'budget_check': the budget's minimum --n-cpu-moe against the measured one (one device), or each
device's planned bytes against llama.cpp's logged ones (several devices)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import cast

import matplotlib.pyplot as plt
import pandas as pd

from ...measure.budget_check import devices_summary, summary
from ...runtime.llamacpp_args import UNSUPPORTED


def budget_check_figure(table: pd.DataFrame, path: str | Path, device: str) -> None:
    """Predicted and llama-fit-params' minimum n against the measured one; each point says how many cells it is."""
    cells = table[(table.status == "ok") & table.measured_n.notna()]
    fig, ax = plt.subplots(figsize=(7, 5.4))
    top = int(max(cells[["measured_n", "predicted_n"]].max().max(), 1)) if len(cells) else 1
    ax.plot([0, top], [0, top], color="0.7", lw=1, label="exact")
    for column, marker, label, offset in (
        ("predicted_n", "o", "moeplace budget", 8),
        ("fit_params_n", "x", "llama-fit-params (-fitt 0)", -14),
    ):
        points = cells[cells[column].notna()].groupby(["measured_n", column]).size()
        pairs = cast(list[tuple[float, float]], points.index.tolist())  # (measured n, this column's n)
        xs, ys = zip(*pairs) if len(points) else ((), ())
        ax.scatter(xs, ys, marker=marker, s=50, label=label, zorder=3)
        for (x, y), count in zip(pairs, points):
            ax.annotate(f"{count}", (x, y), textcoords="offset points", xytext=(6, offset), fontsize=8)
    ax.set_xlabel("measured minimum --n-cpu-moe (load probes at the full context)")
    ax.set_ylabel("predicted minimum --n-cpu-moe")
    s = summary(table)
    ax.set_title(
        "Minimum --n-cpu-moe, predicted vs measured\n"
        f"budget exact on {s['exact']} of {s['cells']} cells, below the measured on {s['below_measured']} "
        f"({s['cells'] - len(cells)} cells where nothing fits are not drawn)\n" + textwrap.shorten(device, 80),
        fontsize=9,
    )
    ax.legend(title="numbers: cells at the point", fontsize=8, title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def devices_figure(table: pd.DataFrame, path: str | Path) -> None:
    """Over several devices: each device's bytes as the plan has them against llama.cpp's logged ones, per cell
    that loaded; the title says on how many cells the plan was exact."""
    fig, ax = plt.subplots(figsize=(7, 5.4))
    loaded = table[table.status == "ok"]
    caps = [float(c) for c in table.caps_mib.iloc[0].split("/")]
    for i, cap in enumerate(caps):
        planned = pd.to_numeric(loaded.planned_mib.str.split("/").str[i], errors="coerce")
        logged = pd.to_numeric(loaded.logged_mib.str.split("/").str[i], errors="coerce")  # "-": none logged
        ax.scatter(logged, planned, s=40, label=f"device {i} ({cap:.1f} MiB)", zorder=3)
        ax.axhline(cap, color=f"C{i}", lw=0.8, ls=":")
    ax.plot([0, max(caps)], [0, max(caps)], color="0.7", lw=1, label="exact")
    ax.set_xlabel("each device's buffers as llama.cpp logged them (MiB)")
    ax.set_ylabel("each device's buffers as planned (MiB)")
    failed = int((~table.status.isin(["ok", UNSUPPORTED])).sum())
    title = f"Per-device budget over {len(caps)} devices, planned vs loaded\n{devices_summary(table)}"
    ax.set_title(f"{title} ({failed} did not load; dotted: each device's cap)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
