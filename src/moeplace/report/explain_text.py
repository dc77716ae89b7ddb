"""The account `moeplace explain` prints of a log: the backend and the cards, the buffers per device and on the
host, the experts in host RAM, llama.cpp's own memory table, pipeline parallelism, and how the run ended with
what to do about it.
"""

from __future__ import annotations

from ..core.records import LlamaBenchRow
from .explain import Explanation, copies


def render(found: Explanation) -> str:
    """The account as a person reads it."""
    if found["kind"] != "llama.cpp log":
        return _render_bench(found["records"])
    lines = [f"backend: {found['backend'] or 'unknown'}" + (f" ({', '.join(found['gpus'])})" if found["gpus"] else "")]
    if found["n_ctx"]:
        lines.append(f"context: {found['n_ctx']} tokens")
    lines += _buffer_lines(found) + _part_lines(found)
    experts = found["experts_on_host"]
    if experts:
        at_least = "at least " if experts["at_least"] else ""
        cut = " (the paste looks cut: lines are missing)" if experts["at_least"] else ""
        lines.append(f"experts in host RAM: {at_least}{experts['tensors']} tensors in {experts['layers']} layers{cut}")
    elif found["expert_logging"]:
        lines.append("experts in host RAM: not logged (run with -v to see each tensor's buffer)")
    if found["unified"]:
        lines.append(f"unified memory: {found['unified']}.")
    if found["flash_attention"]:
        lines.append(f"flash attention: {found['flash_attention']}.")
    return "\n".join(lines + _layout_lines(found) + _status_lines(found))


_ROLE_WORDS = {
    "main": "the model and its context",
    "draft": "the draft model (-md) and its context",
    "mtp": "the MTP head's context (--spec-type mtp)",
    "projector": "the projector (--mmproj)",
}


def _part_lines(found: Explanation) -> list[str]:
    """What each live part holds, where there are several (the totals above are their sum)."""
    if not found["parts"]:
        return []
    lines = ["of which (each part is held at the same time):"]
    for role, rows in found["parts"].items():
        cells = ", ".join(f"{name} {mib['total']:,.1f}" for name, mib in rows.items() if mib["total"])
        lines.append(f"  {_ROLE_WORDS[role]}: {cells or 'nothing in this text'} MiB")
    return lines


def _table_lines(found: Explanation) -> list[str]:
    """Whether the buffer lines add up to llama.cpp's own table, which counts the main model and context only."""
    checks = found["breakdown_check"]
    if not checks:
        return []
    same = [name for name, check in checks.items() if check["matches"]]
    lines = []
    if same:
        lines.append(f"  the buffer lines add up to this table on {', '.join(same)} (to the MiB)")
    for name, check in checks.items():
        if not check["matches"]:
            ours, table = check["buffers"], check["table"]
            cols = ("model", "context", "compute")
            lines.append(
                f"  on {name} the buffer lines give model, context, compute = "
                + ", ".join(f"{ours[c]:,.0f}" for c in cols)
                + " MiB, the table "
                + ", ".join(f"{table[c]:,}" for c in cols)
                + ": lines are missing from the paste, or the table is from another try (--fit prints one per try)"
            )
    if found["parts"]:
        others = ", ".join(_ROLE_WORDS[role] for role in found["parts"] if role != "main")
        lines.append(
            f"  the table counts the main model and its context only: {others} are not in it (at exit llama.cpp "
            "puts them in its 'unaccounted')"
        )
    return lines


def _render_bench(records: list[LlamaBenchRow]) -> str:
    lines = [f"llama-bench results: {len(records)} records"]
    for r in records:
        test = f"pp{r.get('n_prompt', 0)}" if not r.get("n_gen") else f"tg{r['n_gen']}"
        depth = f" @ d{r['n_depth']}" if r.get("n_depth") else ""
        given: object = r.get("n_cpu_moe")  # a pasted table's cell may be empty
        ncmoe = f", -ncmoe {given}" if given not in (None, "") else ""
        lines.append(f"  {test}{depth}{ncmoe}: {r.get('avg_ts', float('nan')):.2f} tok/s")
    return "\n".join(lines)


def _buffer_lines(found: Explanation) -> list[str]:
    """The table of buffers per device and on the host (MiB)."""
    if not found["devices"] and not found["host"]["buffers"]:
        free = ", ".join(f"{name} {mib:,.0f}" for name, mib in found["free_at_load"].items())
        return ["buffers: none in this text (llama.cpp logs them as it loads: paste the log from its start)"] + (
            [f"free at load (MiB): {free}"] if free else []
        )
    lines = [f"{'':<22}{'weights':>10}{'KV':>10}{'compute':>10}{'output':>10}{'total':>11}  MiB"]
    for name, mib in found["devices"].items():
        lines.append(_buffer_row(name, mib))
    if found["host"]["buffers"]:
        lines.append(_buffer_row("host", found["host"]) + f"  [{', '.join(found['host']['buffers'])}]")
    return lines


def _buffer_row(name: str, mib: dict[str, float]) -> str:
    cells = "".join(f"{mib.get(k, 0):>10,.1f}" for k in ("weights", "kv", "compute", "output"))
    free = f"  ({mib['free_at_load']:,.0f} free at load)" if "free_at_load" in mib else ""
    return f"{name:<22}{cells}{mib['total']:>11,.1f}{free}"


def _layout_lines(found: Explanation) -> list[str]:
    """The layers offloaded, llama.cpp's own memory table, pipeline parallelism and a dry run."""
    lines: list[str] = []
    if found["offloaded_layers"]:
        lines.append(f"layers offloaded: {found['offloaded_layers'][0]}/{found['offloaded_layers'][1]}")
    if found["breakdown"]:
        columns = list(next(iter(found["breakdown"].values())))
        lines.append("llama.cpp's own memory table (MiB): " + ", ".join(columns))
        for device, row in found["breakdown"].items():
            lines.append(f"  {device:<20}" + "".join(f"{row[c]:>10,}" if c in row else f"{'':>10}" for c in columns))
        lines += _table_lines(found)
    if found["pipeline_parallel"]:
        n = found["pipeline_copies"] or 4
        lines.append(f"pipeline parallelism: on ({copies(n)} of the compute buffers' inputs per device)")
    if retried := found["pipeline_retried"]:
        asked = f"{retried['requested_mib']:,.2f} MiB" if retried["requested_mib"] else "its compute buffers"
        lines.append(
            f"pipeline parallelism: its copies made the compute buffers too large ({asked} asked on "
            f"{retried['device'] or 'a device'}), so llama.cpp retried without it (1 copy)"
        )
    if found["dry_run"]:
        lines.append(f"dry run: {found['dry_run']['why']}.")
    return lines


def _status_lines(found: Explanation) -> list[str]:
    """How the run ended: out of memory, another error, a dry run or ok, and what to do."""
    lines: list[str] = []
    if found["status"] == "oom":
        oom = found["oom"]
        assert oom is not None  # status oom: where, why and what to do
        lines.append(
            f"{'allocation failed: ' if oom['cause'] == 'allocation-limit' else 'out of memory: '}{oom['why']}"
        )
        lines.append(f"  the line: {oom['line']}")
        if oom["todo"]:
            lines.append(f"  what to do: {oom['todo']}")
        if oom["cause"] != "allocation-limit":
            lines.append(f"  plan it: {found['fix']}")
    elif found["status"] == "error":
        error = found["error"]
        assert error is not None  # status error: why, the line and what to do
        lines.append(f"error: {error['why']}")
        lines.append(f"  the line: {error['line']}")
        lines.append(f"  what to do: {error['todo']}.")
    elif found["dry_run"]:
        lines.append("status: dry run (nothing was allocated, so nothing could fail)")
    elif found["pipeline_retried"]:
        lines.append("status: ok (the one failed allocation was recovered from: llama.cpp retried without the copies)")
    else:
        lines.append("status: ok (no allocation failed in this text)")
    return lines
