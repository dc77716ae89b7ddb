"""Stage 'model_zoo': every full-size model spec in config/models/ as a header-only twin, summarised in one table.

A row per MoE spec (tiny-* specs are the architectures' test variants, not models): its architecture, layer
kinds, experts, bytes by role at the spec's quant recipe, KV cache at 32K, recurrent state, and whether a tiny
variant of the architecture exists (the tests load each tiny variant in the pinned llama-bench).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from ..core.records import Row
from ..core.units import GB
from .describe import structure
from .kvcache import kv_bytes
from .memory import state_bytes
from .metadata import inspect_model
from .twin import load_spec, write_twin

CONTEXT = 32768
COLUMNS = {
    "model": "model",
    "architecture": "architecture",
    "layers": "layers",
    "experts": "experts (used/routed+shared)",
    "expert_gb": "expert GB",
    "non_expert_gb": "non-expert GB",
    "kv_32k_mib": "KV at 32K, f16 (MiB)",
    "kv_per_token_kib": "KV per token at 32K (KiB)",
    "state_mib": "recurrent state (MiB/seq)",
    "tiny_variant": "tiny variant loads (CI)",
}


def zoo_row(spec_path: Path, tiny_architectures: set[str], workdir: Path) -> Row | None:
    spec = load_spec(spec_path)
    if not spec.n_expert:
        return None
    meta = inspect_model(write_twin(spec, workdir / f"{spec_path.stem}.gguf", "none"))
    shared = f"+{meta.n_expert_shared}" if meta.n_expert_shared else ""
    kv = kv_bytes(meta, CONTEXT)
    return {
        "model": spec.name,
        "architecture": spec.architecture,
        "layers": structure(meta),
        "experts": f"{meta.n_expert_used}/{meta.n_expert}{shared}",
        "expert_gb": round(meta.expert_bytes / GB, 2),
        "non_expert_gb": round(meta.non_expert_bytes / GB, 2),
        "kv_32k_mib": round(kv / 2**20, 1),
        "kv_per_token_kib": round(kv / CONTEXT / 1024, 2),
        "state_mib": round(state_bytes(meta) / 2**20, 2),
        "tiny_variant": "yes" if spec.architecture in tiny_architectures else "no",
    }


def zoo_table(specs: list[Path]) -> pd.DataFrame:
    """One row per full-size MoE spec among `specs`, by architecture then name."""
    tiny = {load_spec(p).architecture for p in specs if p.name.startswith("tiny-")}
    with tempfile.TemporaryDirectory(prefix="moeplace-zoo-") as scratch:
        rows = [zoo_row(p, tiny, Path(scratch)) for p in sorted(specs) if not p.name.startswith("tiny-")]
    table = pd.DataFrame([r for r in rows if r], columns=list(COLUMNS))
    return table.sort_values(["architecture", "model"]).reset_index(drop=True)


def markdown(table: pd.DataFrame) -> str:
    header = [COLUMNS[c] for c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"
