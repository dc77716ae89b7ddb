"""The pagelock shim's Python side (native/pagelock.c, preloaded into llama-bench): which byte ranges of the
model's mapping it mlocks, its environment, and what it reports."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from .pagecache import PAGE

_SHIM_LINE = re.compile(r"^pagelock: locked (\d+) bytes in \d+ ranges", re.MULTILINE)
_SHIM_PROBLEM = re.compile(r"^pagelock: (?!locked \d+ bytes).*$", re.MULTILINE)


def merge_ranges(spans: Sequence[tuple[int, int]], page: int = PAGE, limit: int | None = None) -> list[tuple[int, int]]:
    """(offset, length) spans rounded out to whole pages, clipped to `limit` (rounded up), merged where
    they overlap or touch; sorted. The pagelock shim relies on this: it only clips them to the mapping."""
    end_cap = None if limit is None else -(-limit // page) * page
    rounded = []
    for off, length in spans:
        if length <= 0:
            continue
        lo, hi = off // page * page, -(-(off + length) // page) * page
        if end_cap is not None:
            hi = min(hi, end_cap)
        if hi > lo:
            rounded.append((lo, hi))
    merged: list[list[int]] = []
    for lo, hi in sorted(rounded):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in merged]


def shim_env(targets: Sequence[tuple[Path, list[tuple[int, int]]]], madvise: str) -> dict[str, str]:
    """The pagelock shim's variables: every model file (ranges may be empty) and the madvise mode."""
    env = {"MOEPLACE_MADVISE": madvise}
    for i, (path, ranges) in enumerate(targets):
        suffix = f"_{i}" if i else ""
        env[f"MOEPLACE_PAGELOCK_FILE{suffix}"] = str(path)
        env[f"MOEPLACE_PAGELOCK_RANGES{suffix}"] = ",".join(f"{o}:{n}" for o, n in ranges)
    return env


class ShimReport(TypedDict):
    """What the pagelock shim printed (a RAM tier row carries it)."""

    mapped: int  # model mappings it saw
    locked_bytes: int
    problems: list[str]  # a failed mlock or madvise, as it printed it


def parse_shim(stderr: str) -> ShimReport:
    """How many model mappings the shim saw, the bytes it locked in them, and its complaints (any one of which,
    a failed mlock or madvise, spoils the run)."""
    locked = _SHIM_LINE.findall(stderr)
    return {"mapped": len(locked), "locked_bytes": sum(map(int, locked)), "problems": _SHIM_PROBLEM.findall(stderr)}
