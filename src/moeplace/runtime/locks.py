"""Locks: Snakemake's after a run that was killed outright (SIGKILL, power loss), cleared only when their owner is
provably gone; and moeplace's own per device, so that one sweep at a time measures on it (device_lock).

Snakemake's lock files name the locked paths, not who holds them, so the main Snakemake process records
itself (host and pid) beside them when it may take the locks. A later main process clears the locks only
when that owner ran on this host and is no longer a live Snakemake process; a job's own parse of the
Snakefile (on a cluster node or in a local job process) never touches them, and neither does anyone when
the owner is on another host or unknown while a Snakemake process still works in this directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .native import cache_root

log = logging.getLogger("moeplace")

OWNER = "moeplace-owner.json"


def _is_live_snakemake(pid: int, workdir: Path | None = None) -> bool:
    try:
        if b"snakemake" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        return workdir is None or os.readlink(f"/proc/{pid}/cwd") == str(workdir)
    except OSError:
        return False


def _snakemake_here(workdir: Path) -> bool:
    """Whether another Snakemake process on this host works in `workdir` (Linux /proc)."""
    mine = {os.getpid(), os.getppid()}  # this process, and a shell that may have started it
    pids = {int(pid) for pid in os.listdir("/proc") if pid.isdigit()} - mine
    return any(_is_live_snakemake(pid, workdir) for pid in pids)


def _owner_gone(locks: Path, workdir: Path) -> bool:
    try:
        owner = json.loads((locks / OWNER).read_text())
    except (OSError, ValueError):  # locks of a run that left no record: judge by this host alone
        return not _snakemake_here(workdir)
    if owner.get("host") != platform.node():
        return False  # it may still run there: nothing here can prove it gone
    return not _is_live_snakemake(int(owner.get("pid", 0))) and not _snakemake_here(workdir)


def clear_stale_locks(workdir: Path, main_process: bool) -> bool:
    """In the main Snakemake process: remove locks whose owner is provably gone, then record this process as
    the owner of the locks it may take. Job processes do nothing. True when stale locks were removed."""
    if not main_process:
        return False
    workdir = workdir.resolve()
    locks = workdir / ".snakemake" / "locks"
    held = locks.is_dir() and any(p.name != OWNER for p in locks.iterdir())
    removed = False
    if held:
        if not _owner_gone(locks, workdir):
            return False  # a live run holds them: Snakemake itself will say the directory is locked
        shutil.rmtree(locks)
        log.warning("removed the locks of a Snakemake run that was killed in %s", workdir)
        removed = True
    locks.mkdir(parents=True, exist_ok=True)
    (locks / OWNER).write_text(json.dumps({"host": platform.node(), "pid": os.getpid()}))  # the Snakefile is
    return removed  # parsed inside the main Snakemake process itself


_HELD: set[str] = set()  # the devices this process holds: a sweep inside a sweep does not wait for itself


@contextmanager
def device_lock(device: str, log_path: Path) -> Iterator[None]:
    """Hold `device` for one measurement at a time on this host, across runs and folders, whatever Snakemake does
    with its own locks (9.27 deletes .snakemake/locks when any run in the folder ends). A second holder waits,
    saying for whom in its log and on stderr."""
    if device in _HELD:
        yield
        return
    folder = cache_root() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{platform.node()}-{re.sub(r'[^A-Za-z0-9._-]+', '_', device)[:80]}.lock"
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another run"
            log.warning("%s is busy measuring for %s; waiting for it to finish", device, holder)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} in {Path.cwd()} (log {log_path})\n")
        f.flush()
        _HELD.add(device)
        try:
            yield
        finally:
            _HELD.discard(device)
            f.truncate(0)
