"""The parts of a run explain shows (the main model with its context, a draft model's, an MTP head's, a
projector's) and llama.cpp's own memory table beside the buffer lines of the main part, which is all it counts.
"""

from __future__ import annotations

from typing import TypedDict

from ..runtime.llama_log import LogReport, memory_tables
from ..runtime.llama_names import MiB


def mib_row(kinds: dict[str, int]) -> dict[str, float]:
    """Bytes per kind as MiB (two decimals), with their total."""
    mib = {kind: round(size / MiB, 2) for kind, size in kinds.items()}
    return mib | {"total": round(sum(kinds.values()) / MiB, 2)}


# llama.cpp's own table prints each column as whole MiB rounded down (common/fit.cpp, common_memory_breakdown_print);
# the buffer lines print two decimals each, so their sum may sit a hundredth or two either side.
_TABLE_COLUMNS = {"model": ("weights",), "context": ("kv",), "compute": ("compute",)}


class TableCheck(TypedDict):
    """One row of llama.cpp's memory table beside the same sums of the log's buffer lines for the main model and
    its context (MiB)."""

    buffers: dict[str, float]  # model, context, compute, self
    table: dict[str, int]
    matches: bool


def table_check(report: LogReport) -> dict[str, TableCheck]:
    """Per device row of llama.cpp's own memory table, the main model's and context's buffer lines
    summed as the table sums them: model = weights, context = KV and recurrent state, compute = compute buffers
    (output buffers are not counted: llama_context::memory_breakdown). The table counts the main context only
    (llama-server prints it for its main context at exit: tools/server/server.cpp), so a draft model's, an MTP
    head's and a projector's buffers are left out of it. Rows the buffer lines say nothing of are left out."""
    main = report.main
    tables = memory_tables(report.text)
    out: dict[str, TableCheck] = {}
    for row_name, row in report.breakdown.items():
        if "total" not in row or "self" not in row:  # the Host row: mapped weights are counted otherwise there
            continue
        kinds = main.device(row_name)
        if not kinds:
            continue
        ours = {col: sum(kinds.get(k, 0) for k in ks) / MiB for col, ks in _TABLE_COLUMNS.items()}
        ours["self"] = sum(ours.values())
        # the main model's table: the last whose model column is these weights (a draft's or an MTP head's, which
        # --fit prints beside it in 2026 builds, holds other weights)
        rows = [t[row_name] for t in tables if row_name in t and abs(t[row_name]["model"] - ours["model"]) < 1.05]
        row = rows[-1] if rows else row
        matches = all(row[col] - 0.05 <= ours[col] < row[col] + 1.05 for col in ours)
        table = {col: row[col] for col in ours}
        out[row_name] = {"buffers": {k: round(v, 2) for k, v in ours.items()}, "table": table, "matches": matches}
    return out


def parts(report: LogReport) -> dict[str, dict[str, dict[str, float]]] | None:
    """Per live part (the model, a draft model, an MTP head, a projector), its MiB per device and on the host;
    None where the model is all there is."""
    parts = report.parts
    if len(parts) < 2:
        return None
    return {
        part.role: {name: mib_row(kinds) for name, kinds in part.devices.items()} | {"host": mib_row(part.host)}
        for part in parts
    }
