"""Stage 'routing': each layer's expert traffic and the reuse of experts between nearby tokens."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...measure.routing import DISTANCES, RoutingTrace
from ...runtime.outputs import atomic_path


def routing_figure(trace: RoutingTrace, table: pd.DataFrame, path: str | Path, title: str) -> None:
    """Left: each layer's expert activation shares, experts sorted by traffic. Right: expert reuse vs uniform."""
    n_expert, k = trace.n_expert, trace.n_expert_used
    counts = np.stack([np.bincount(trace.ids[:, i, :].ravel(), minlength=n_expert) for i in range(len(trace.layers))])
    share = np.sort(counts, axis=1)[:, ::-1] / max(1, trace.n_tokens * k)
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(13.6, max(4.8, min(9.5, 2.2 + 0.14 * len(trace.layers)))),
        gridspec_kw={"width_ratios": [1.35, 1]},
    )
    image = left.imshow(share, aspect="auto", cmap="viridis", interpolation="nearest", origin="lower")
    cbar = fig.colorbar(image, ax=left, pad=0.01)
    cbar.set_label("share of the layer's expert activations", fontsize=8)
    y = np.arange(len(trace.layers))
    left.plot(
        table.experts_80pct.to_numpy() - 0.5,
        y,
        "D",
        ms=5,
        mfc="white",
        mec="black",
        ls="none",
        label="80% of the layer's activations covered",
    )
    left.axvline(
        table.experts_80pct_uniform.iloc[0] - 0.5,
        color="tab:red",
        ls="--",
        lw=1.2,
        label="80% covered, uniform routing",
    )
    step = max(1, len(y) // 16)
    left.set_yticks(y[::step], [str(layer) for layer in trace.layers[::step]], fontsize=8)
    left.set_xlabel(f"experts of the layer, sorted by activation count (of {n_expert}; {k} per token)")
    left.set_ylabel("layer")
    left.set_title(f"Expert traffic per layer ({trace.n_tokens} tokens)", fontsize=9)
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)

    for d, color in zip(DISTANCES, ("tab:blue", "tab:orange")):
        right.plot(table.layer, table[f"overlap_d{d}"], "o-", color=color, ms=4, label=f"token t vs t+{d}")
    right.plot(
        table.layer, table.overlap_shuffled, ":", color="tab:green", label="same tokens shuffled (skew, no locality)"
    )
    right.axhline(k / n_expert, color="tab:gray", ls="--", label=f"uniform random routing (k/E = {k / n_expert:.3f})")
    right.set_ylim(0, 1.02)
    right.set_xlabel("layer")
    right.set_ylabel("share of a token's experts also used d tokens later")
    right.set_title("Expert reuse between nearby tokens", fontsize=9)
    right.grid(alpha=0.3)
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)

    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)
