"""Stage 'tune' (the matrix): the recommended --n-cpu-moe and its decode speed per model and context."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...core.units import Context
from ...runtime.llamacpp_args import UNSUPPORTED
from ...runtime.outputs import atomic_path


def matrix_figure(matrix: pd.DataFrame, out: str | Path) -> None:
    """Heatmaps over model x context: the recommended --n-cpu-moe and its decode speed."""
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
