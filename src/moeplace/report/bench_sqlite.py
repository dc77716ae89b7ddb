"""llama-bench's SQLite as a published directory holds it: every run in llama-bench's own `llama_bench` table (its
-o sql, which llama.cpp's scripts/compare-llama-bench.py reads) with moeplace's columns beside them, and the runs
that failed in `failed_runs`; a record as a row, the file written and read.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, get_args, get_type_hints

from ..core.records import BenchRecord, LlamaBenchRow, Row
from ..runtime.outputs import atomic_path

SQLITE = "llama-bench.sqlite"
SQL_TABLES = ("llama_bench", "failed_runs")
# llama-bench's SQL table (its -o sql, read by scripts/compare-llama-bench.py): field -> SQL type, from its JSON row's
# fields (a flag is an INTEGER in SQL); the per-sample arrays stay out.
_SQL_TYPES = {str: "TEXT", int: "INTEGER", bool: "INTEGER", float: "REAL"}


def _sql_type(hint: Any) -> str | None:
    """A field's SQL type, an optional one's (`float | None`: NULL where absent) as its value's; None: not a scalar."""
    kinds = [k for k in get_args(hint) if k is not type(None)] if isinstance(hint, UnionType) else [hint]
    return _SQL_TYPES.get(kinds[0]) if len(kinds) == 1 else None


LLAMA_BENCH_FIELDS = {k: sql for k, hint in get_type_hints(LlamaBenchRow).items() if (sql := _sql_type(hint))}
MEASURED = ("avg_ns", "stddev_ns", "avg_ts", "stddev_ts")  # NULL for a run that failed
# moeplace's own columns beside them: what a run measured and where.
OUR_FIELDS = {
    "model": "TEXT", "ctx": "INTEGER", "variant": "TEXT", "status": "TEXT", "repetitions": "INTEGER",
    "ci95_halfwidth_pct": "REAL", "device": "TEXT", "host": "TEXT", "pipeline_commit": "TEXT",
    "pipeline_dirty": "INTEGER", "model_header_sha256": "TEXT", "provenance": "TEXT",
}  # fmt: skip


def sqlite_row(record: BenchRecord, provenance: str) -> Row:
    """One record as a llama_bench row: llama-bench's own fields from its JSON, the means over every batch."""
    own: Mapping[str, Any] = record.get("llama_bench", {})  # llama-bench's JSON, field by field
    row: Row = {k: own.get(k) for k in LLAMA_BENCH_FIELDS}
    row |= {
        "n_cpu_moe": record["n_cpu_moe"],
        "type_k": record["type_k"],
        "type_v": record["type_v"],
        "tensor_buft_overrides": record.get("overrides") or "none",
        "n_depth": record["n_depth"],
        "test_time": row["test_time"] or record.get("started"),
        "build_commit": record.get("llamacpp_commit"),
        "build_number": record.get("llamacpp_build"),
    }
    if record["test"] == "pp":
        row |= {"n_prompt": record["n_prompt"], "n_gen": 0}
    else:
        row |= {"n_prompt": 0, "n_gen": record["n_gen"]}
    samples = record.get("samples_ts") or []
    tokens = record["n_prompt"] if record["test"] == "pp" else record["n_gen"]
    if samples:
        ns = [tokens / ts * 1e9 for ts in samples]
        spread = round(statistics.stdev(ns)) if len(ns) > 1 else 0
        row |= {
            "avg_ts": statistics.fmean(samples),
            "stddev_ts": record.get("stddev_ts") or 0.0,
            "avg_ns": round(statistics.fmean(ns)),
            "stddev_ns": spread,
        }
    for k, kind in LLAMA_BENCH_FIELDS.items():  # SQL never matches NULL = NULL: compare-llama-bench joins on these
        if row[k] is None and k not in MEASURED:
            row[k] = "" if kind == "TEXT" else 0
    files = record.get("model_files")
    ours = (
        "model",
        "ctx",
        "variant",
        "status",
        "repetitions",
        "ci95_halfwidth_pct",
        "device",
        "host",
        "pipeline_commit",
        "pipeline_dirty",
    )
    fields: Mapping[str, Any] = record  # the record's JSON, field by field
    row |= {k: fields.get(k) for k in ours}
    row |= {"model_header_sha256": files[0].get("header_sha256") if files else None, "provenance": provenance}
    return row


def write_sqlite(rows: list[Row], path: Path) -> None:
    """Measured runs in `llama_bench` (what compare-llama-bench.py averages); runs that failed (out of memory,
    crash, timeout) in `failed_runs`, same columns, no numbers."""
    fields = {**LLAMA_BENCH_FIELDS, **OUR_FIELDS}
    columns = ", ".join(f"{k} {v}" for k, v in fields.items())
    with atomic_path(path) as tmp:
        con = sqlite3.connect(tmp)
        for table, keep in ((SQL_TABLES[0], True), (SQL_TABLES[1], False)):
            con.execute(f"CREATE TABLE {table} ({columns})")
            con.executemany(
                f"INSERT INTO {table} VALUES ({', '.join('?' for _ in fields)})",
                [[_sql(row.get(k)) for k in fields] for row in rows if (row.get("avg_ts") is not None) == keep],
            )
        con.commit()
        con.close()


def _sql(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value


def read_sqlite(path: Path) -> list[Row]:
    """Every run of a published SQLite, measured or failed."""
    con = sqlite3.connect(path)
    con.row_factory = sqlite3.Row
    rows = [dict(r) for table in SQL_TABLES for r in con.execute(f"SELECT * FROM {table}")]
    con.close()
    return rows
