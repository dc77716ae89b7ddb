"""Stage 'calibrate': the speed model's coefficients fitted to llama-bench runs of one model.

Runs come as llama-bench `-o jsonl` records, the pipeline's own (results/bench/...) or a user's from another
machine made with -ncmoe/-ot/-d/-ub; each record's placement (n_cpu_moe, and -ot patterns matched to the
model's tensors as llama.cpp matches them), depth, test size, ubatch and KV cache types are read from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from ..core.errors import MoeplaceError
from ..core.records import BenchRecord, JsonObject, LlamaBenchRow
from ..model.meta import ModelMeta
from ..runtime.llamacpp_args import DEFAULT_BATCH, DEFAULT_UBATCH
from .offload import matching_tensors
from .speed import Run, SpeedModel
from .speed_fit import fit

# What calibrate reads: our bench records, or llama-bench's own rows (-o jsonl) from any run.
Measured: TypeAlias = BenchRecord | LlamaBenchRow


def runs_from_records(meta: ModelMeta, records: Sequence[Measured]) -> list[Run]:
    """Successful tests as Runs: pipeline records (status ok) and raw llama-bench JSONL alike."""
    names = [n for layer in meta.layers for n in layer.expert_tensors]
    runs = []
    for record in records:
        r: Mapping[str, Any] = record  # either kind, read by the keys they share
        if r.get("status", "ok") != "ok" or not r.get("avg_ts"):
            continue
        overrides = r.get("overrides") or r.get("tensor_buft_overrides") or ""
        if overrides == "none":
            overrides = ""
        gen = int(r.get("n_gen") or 0)
        test = r.get("test") or ("pp" if gen == 0 else "tg")
        runs.append(
            Run(
                n_cpu_moe=int(r.get("n_cpu_moe") or 0),
                depth=int(r.get("n_depth") or 0),
                test=test,
                n_tokens=gen if test == "tg" else int(r.get("n_prompt") or 0),
                # llama.cpp caps the ubatch at the batch
                ubatch=min(int(r.get("n_ubatch") or DEFAULT_UBATCH), int(r.get("n_batch") or DEFAULT_BATCH)),
                type_k=r.get("type_k") or "f16",
                type_v=r.get("type_v") or "f16",
                host_tensors=frozenset(matching_tensors(overrides, names)),
                # the pipeline's records give their median (a slow spell does not pull it); llama-bench's rows a mean
                tok_s=float(r.get("median_ts") or r["avg_ts"]),
            )
        )
    return runs


def read_runs(paths: list[str | Path]) -> list[Measured]:
    """Records from JSONL files (llama-bench -o jsonl, or the pipeline's); a bad line is one clear error."""
    records = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise MoeplaceError(f"{path}: cannot read it ({e.strerror}).") from None
        except UnicodeDecodeError:
            raise MoeplaceError(f"{path}: not a text file; pass llama-bench -o jsonl output.") from None
        for no, line in enumerate(lines, 1):
            if not line.strip().startswith("{"):
                continue  # llama-bench's other output
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise MoeplaceError(f"{path}:{no}: not a JSON record ({e.msg}); pass llama-bench -o jsonl output.")
    return records


def calibration_file(meta: ModelMeta, records: Sequence[Measured], base: SpeedModel) -> JsonObject:
    """What the pipeline's calibrate stage writes: the fitted model, or where the sweep cannot calibrate one
    (every run out of memory, say) an empty model and the reason, so that the rest of the run goes on."""
    partial = sum(1 for r in records if r.get("partial") and r.get("status") != "ok")
    left_out = {"left_out_partial": partial} if partial else {}
    try:
        return {**calibrate(meta, records, base).to_json(), "status": "calibrated", **left_out}
    except MoeplaceError as e:
        return {"tests": {}, "status": "not_calibrated", "not_calibrated": str(e), **left_out}


def calibrate(meta: ModelMeta, records: Sequence[Measured], base: SpeedModel) -> SpeedModel:
    """The speed model for `meta` fitted to `records`, the prior `base` (speed.prior) for what the runs cannot
    tell apart."""
    runs = runs_from_records(meta, records)
    if not runs:
        raise MoeplaceError("no successful llama-bench runs to calibrate from.")
    return fit(meta, runs, base)
