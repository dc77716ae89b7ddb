"""A sweep's records on disk: the side file each value's records reach as soon as they are measured, what a rerun
takes back from it, the failed values `moeplace retry` measures again, and whether a sweep measured anything usable
(a sweep that did not is an error, not a result)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from ..core.errors import MoeplaceError
from ..core.records import BenchRecord
from ..runtime.build import Build
from ..runtime.llamacpp import build_problem, rebuild
from ..runtime.outputs import append_jsonl, disk_problem, read_jsonl, read_whole_jsonl, write_jsonl

# What a rerun takes from an earlier run's side file: measured answers. A crash, a timeout or an error is measured
# again (the way to retry only the failed values of a sweep: `moeplace retry`).
KEPT_ON_RERUN = ("ok", "oom")
RETRIED = ("crash", "timeout", "error")  # what `moeplace retry` measures again (unsupported would only be refused)


def side_file(output: str | Path) -> Path:
    """Where a sweep's records go as they are measured, beside its output (`moeplace retry` reads it too)."""
    return Path(f"{output}.partial")


def measured_before(
    side: Path | None, configuration: BenchRecord, n_values: list[int], tests: tuple[str, ...]
) -> dict[int, list[BenchRecord]]:
    """The values of `n_values` that `side` holds measured answers of, for every test, in this configuration."""
    if side is None:
        return {}
    written = json.loads(json.dumps(configuration, default=str))  # as the side file holds it (tuples as lists...)
    latest: dict[tuple[int, str], BenchRecord] = {}
    for r in read_whole_jsonl(side):
        if all(r.get(k) == v for k, v in written.items()) and r.get("n_cpu_moe") in n_values:
            latest[r["n_cpu_moe"], r["test"]] = cast(BenchRecord, r)  # a line the bench stage wrote
    by_n: dict[int, list[BenchRecord]] = {}
    for n in n_values:
        records = [latest.get((n, t)) for t in tests]
        if all(r is not None and r["status"] in KEPT_ON_RERUN for r in records):
            by_n[n] = [r for r in records if r is not None]
    return by_n


def write_sweep(output: str | Path, records: list[BenchRecord], side: Path) -> None:
    """The sweep's records as the stage's output, whole; its side file goes only once they are there."""
    try:
        write_jsonl(output, records)
    except OSError as e:
        raise MoeplaceError(
            f"{disk_problem(e, output)}: the {len(records)} records measured are kept in {side}; make room and run "
            "again (a value that ran, or ran out of memory, is not measured again)"
        ) from None
    side.unlink(missing_ok=True)


def retry_failed(output: Path) -> dict[int, str]:
    """Make the sweep `output` measure its failed values again at the next run, and only those: its other records
    go to its side file (synced first), which the rerun resumes from, then the output goes. The values to retry
    with their status (none: nothing failed, the output stays)."""
    records = read_jsonl(output)
    failed = {r["n_cpu_moe"]: r["status"] for r in records if r["status"] in RETRIED}
    if failed:
        append_jsonl(side_file(output), [r for r in records if r["n_cpu_moe"] not in failed])
        output.unlink()
    return dict(sorted(failed.items()))


def values_that_fit(n_values: list[int], budget_csv: str | Path | None, ctx: int) -> list[int]:
    """The values of a sweep the budget says fit the device at `ctx` (all of them without a budget table: values the
    user chose; none where the budget says nothing fits)."""
    if not budget_csv:
        return list(n_values)
    import pandas as pd  # here, not at the top: only the bench stage reads the table

    rows = pd.read_csv(budget_csv).query("ctx == @ctx")
    if rows.empty or rows.status.iloc[0] != "ok":
        return []
    return [n for n in n_values if n >= int(rows.n_cpu_moe.iloc[0])]


def check_sweep(records: list[BenchRecord], fits: list[int], manifest: Build) -> None:
    """A sweep that measured nothing usable is an error, not a result: one line with the likely cause. Usable: an
    ok run of a value the budget says fits (`fits`); where it says none does, a run that went out of memory (its
    proof) will do."""
    if fits:
        if any(r["status"] == "ok" and r["n_cpu_moe"] in fits for r in records):
            return
        failed = [r for r in records if r["n_cpu_moe"] in fits]
    else:
        if any(r["status"] in KEPT_ON_RERUN for r in records):
            return
        failed = records
    first = {r["n_cpu_moe"]: r for r in reversed(failed)}  # each value's first failed test
    said = ", ".join(f"n={n} {r['status']}" for n, r in sorted(first.items()))
    statuses, example = {r["status"] for r in failed}, failed[0]
    if broken := build_problem(manifest.bin_dir, ("llama-bench",), manifest.env):
        cause = f"a broken llama.cpp build ({broken}): {rebuild(manifest)}"
    elif statuses == {"crash"}:
        cause = f"the device or the build (llama-bench {example['error']}; its stderr is in the stage's log)"
    elif statuses == {"oom"}:
        cause = "a device with less free memory than planned: another program on it, or device.vram too large"
    elif statuses == {"timeout"}:
        cause = "a device far slower than expected or busy: free it, or raise bench.timeout_s"
    else:
        cause = f"{example['status']}: {example['error']}"
    raise MoeplaceError(
        f"{example['model']} at {example['ctx']:,} tokens measured nothing usable ({said}); likely {cause}. "
        "Nothing is kept as done: a rerun measures the failed values again."
    )


@contextmanager
def said_what_is_kept(
    side: Path | None, sweep: str, values: int, kept: int, done: dict[int, list[BenchRecord]]
) -> Iterator[None]:
    """Ctrl-C or a full disk in the middle of `sweep` ("<model> at <ctx> tokens") with a side file: one line
    saying how many of its `values` it keeps (`kept` from before, `done` now), and that a rerun measures the rest."""
    try:
        yield
    except KeyboardInterrupt:
        if side is None:
            raise
        raise MoeplaceError(
            f"interrupted (Ctrl-C): {kept + len(done)} of {values} n_cpu_moe values of {sweep} were done"
            f" and are kept in {side}; a rerun measures only the rest"
        ) from None
    except OSError as e:
        if side is None:
            raise
        raise MoeplaceError(
            f"{disk_problem(e, side)}: the values measured before are kept in {side}; make room and run again to "
            "measure only the rest"
        ) from None
