"""Stage 'quants': bytes read per token beside decode speed, per quant type."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from ...runtime.outputs import atomic_path


def _ratio(value: float) -> str:
    return "n/a" if pd.isna(value) else f"{value:.2f}"


def quants_figure(table: pd.DataFrame, path: str | Path, title: str) -> None:
    """Bytes read per token next to decode speed, per quant type, with and without the RAM cap."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    x = range(len(table))
    left.bar(x, table.active_mb_per_token, color="tab:gray", label="all weights read per token")
    left.bar(x, table.expert_mb_per_token, color="tab:purple", label="of which routed experts")
    left.set(xticks=list(x), xticklabels=table.quant, ylabel="MB read per token", title="Bytes per token")
    left.legend(loc="upper right", fontsize=8)
    width = 0.38
    cap = int(table.cap_pct.iloc[0])
    right.bar([i - width / 2 for i in x], table.tok_s.fillna(0), width, label="plenty of RAM")
    right.bar([i + width / 2 for i in x], table.tok_s_capped.fillna(0), width, label=f"RAM capped at {cap}%")
    labels = [
        f"{row['quant']}\nbytes /{row['bytes_ratio']:.2f}, speed x{_ratio(row['tok_s_ratio'])}, "
        f"capped x{_ratio(row['tok_s_capped_ratio'])}"
        for row in table.to_dict("records")
    ]
    if (table.tok_s.fillna(0) > 0).any():  # a speed spans decades once the cap pages from disk
        right.set_yscale("log")
    right.set(xticks=list(x), ylabel="decode speed (tok/s)", title="Decode on the CPU")
    right.set_xticklabels(labels, fontsize=8)
    right.legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)
