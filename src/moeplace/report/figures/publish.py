"""`moeplace merge`: decode speed by host and device, from several published folders merged."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd


def merged_figure(runs: pd.DataFrame, path: Path, title: str) -> None:
    """Decode speed against --n-cpu-moe, one line per host and device, with each mean's spread."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    tg = runs[(runs.n_gen > 0) & (runs.status == "ok")]
    for (host, device), line in tg.groupby(["host", "device"]):
        line = line.sort_values("n_cpu_moe")
        ax.errorbar(line.n_cpu_moe, line.avg_ts, yerr=line.stddev_ts, marker="o", capsize=3, label=f"{host} · {device}")
    ax.set_xlabel("--n-cpu-moe (layers whose experts are in host RAM)")
    ax.set_ylabel("decode speed (tokens/s), mean ± sd")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
