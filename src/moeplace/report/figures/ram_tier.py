"""Stage 'ram_tier': decode speed and page faults against the RAM cap."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # no pyplot: no global figure state

from ...measure.ram_tier import LOCK_MODES
from ...runtime.outputs import atomic_path


def ram_tier_figure(table: pd.DataFrame, path: str | Path, title: str) -> None:
    """Decode tok/s and major faults per token against the RAM cap (one model, one readahead), side by
    side: one line per lock mode, the uncapped run as a dotted reference, the prediction where the table
    has it; rows that did not run are marked with their status and listed under the panels."""
    fig = Figure(figsize=(12, 5.5))
    axes = fig.subplots(1, 2)
    ref = table[table.cap_pct.isna() & (table.status == "ok")]
    capped = table[table.cap_pct.notna()]
    labels = {"none": "no locking", "non_expert": "non-expert tensors mlock'ed"}
    for ax, column, ylabel in (
        (axes[0], "tok_s", "decode speed (llama-bench tg), tokens/s"),
        (axes[1], "faults_per_token", "major page faults per generated token"),
    ):
        if len(ref):
            value = float(ref[column].iloc[0])
            ax.axhline(value, color="tab:gray", ls=":", label=f"no cap ({value:.3g})")
        if column == "tok_s" and "tok_s_predicted" in capped and capped.tok_s_predicted.notna().any():
            p = capped.drop_duplicates("cap_pct").sort_values("cap_pct")
            ax.plot(p.cap_pct, p.tok_s_predicted, "x--", color="black", lw=1, label="predicted (RAM + disk bandwidth)")
        for k, lock in enumerate(m for m in LOCK_MODES if m in set(capped.lock)):
            c = capped[capped.lock == lock].sort_values("cap_pct")
            ok = c[c.status == "ok"]
            ax.plot(ok.cap_pct, ok[column], "o-", color=f"C{k}", label=labels[lock] if len(ok) else None)
            for r in c[c.status != "ok"].itertuples():
                ax.annotate(
                    str(r.status).upper(),
                    (r.cap_pct, 0),
                    xytext=(0, 4 + 10 * k),
                    textcoords="offset points",
                    xycoords=("data", "axes fraction"),
                    ha="center",
                    fontsize=8,
                    color="tab:red",
                )
        values = pd.concat([ref[column], capped[column]]).dropna()
        positive = values[values > 0]
        if column == "tok_s" and len(positive) and positive.max() / positive.min() > 30:
            ax.set_yscale("log")  # speeds under a cap can be orders of magnitude apart
        else:
            ax.set_ylim(bottom=0)
        if len(capped):
            ax.set_xlim(max(capped.cap_pct.max() + 5, 105), min(capped.cap_pct.min() - 5, 0))  # less RAM to the right
        ax.set_xlabel("RAM cap: % of the model's file bytes, on top of anon peak + slack")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    notes = sorted({f"{r.status}: {str(r.error)[:150]}" for r in table[table.status != "ok"].itertuples()})[:4]
    for i, note in enumerate(notes):
        fig.text(0.01, 0.01 + 0.03 * i, note, fontsize=7, color="tab:red")
    readahead = "; ".join(sorted(set(table.readahead.dropna())))
    fig.suptitle(f"{title}\nreadahead: {readahead}" if readahead else title, fontsize=10)
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
