"""Stage 'ram_tier': decode speed when RAM is smaller than the model (mmap'd weights under a memory cap).

Each measurement is llama-bench decode (`-p 0 -n G`, weights mmap'd, `--repack 0` so they stay
file-backed: repacked weights are anonymous memory and a cap would OOM-kill them) in a fresh
process inside a memory cgroup made for it (cgroup v1 memory.limit_in_bytes or v2 memory.max)
under our own, removed afterwards. Before every run the model's pages are evicted from the page
cache: a cached page stays charged to whoever touched it first, so pages left over from an
earlier run would escape the cap. Two generation lengths G1 < G2 give, with loading excluded,
major faults per token ((F(G2) - F(G1)) / (G2 - G1), from the child's rusage) and tok_s_marginal
((G2 - G1) / (wall(G2) - wall(G1)), whole-process wall times). tok_s is llama-bench's tg average
of the G2 run: it includes the faults of the first tokens that bring the evicted weights in
(--no-warmup), so tok_s_marginal is the steady decode speed.

The cap is anon_peak + slack + pct% of the model's file bytes, where anon_peak is the
anonymous memory (RssAnon, sampled) of an uncapped run of the same command: what cannot be
evicted, KV cache and compute buffers included, plus a slack (default 4 MiB) for page tables,
kernel memory and library pages not yet cached. Every part is recorded, and so is what the uncapped run
had charged besides its anonymous memory and the model (other_charged_bytes), which gives the
share of the model the cap really leaves room for (model_room_pct).

Where no memory cgroup can be made (not root, cgroup v2 without a delegated memory controller;
cgroup_support() says it up front), the uncapped reference still runs, as a plain process (no
cgroup peak, so no model_room_pct), and every capped row has status 'skipped' and the reason.

Disk readahead decides what one fault costs (with an 8192 KiB read_ahead_kb each fault reads
megabytes and a capped run collapses); it is an explicit parameter: read_ahead_kb of the device
behind the model (set when writable, always restored), or MADV_RANDOM on the mapping via the
pagelock shim where it cannot be set. llama.cpp calls posix_fadvise(SEQUENTIAL) on the model
file, which doubles the window the kernel reads around a fault in that file: the records'
readahead_effective_kib (0 with MADV_RANDOM: no read-around).

Locking: llama.cpp's --mlock is all-or-nothing; lock mode "non_expert" mlocks only the byte
ranges of the non-expert tensors inside llama.cpp's mapping (the pagelock shim), so the page
cache the cap leaves serves the experts. "none" locks nothing.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import logging
import math
import mmap
import os
import re
import resource
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from gguf import GGUFReader
from matplotlib.figure import Figure  # no pyplot: no backend or global figure state

from .bench import _tail, die_with_parent, host_facts, pipeline_revision
from .errors import MoeplaceError
from .gguf_file import shard_paths
from .llamacpp import build_native, require_binary
from .metadata import tensor_role
from .outputs import atomic_path
from .predict import ram_tier_tok_s
from .units import parse_size

log = logging.getLogger("moeplace")

PAGE = mmap.PAGESIZE
MIB = 2**20
DEFAULT_SLACK_BYTES = 4 * MIB
LOCK_MODES = ("none", "non_expert")
# Where the kernel describes this process and the block devices (tests point these elsewhere).
PROC_SELF = Path("/proc/self")
SYS_DEV_BLOCK = Path("/sys/dev/block")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
CGROUP_PREFIX = "moeplace-ramtier-"

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_SHIM_LINE = re.compile(r"^pagelock: locked (\d+) bytes in \d+ ranges", re.MULTILINE)
_SHIM_PROBLEM = re.compile(r"^pagelock: (?!locked \d+ bytes).*$", re.MULTILINE)
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


# ---------------------------------------------------------------------------------------------
# memory cgroups


@dataclass(frozen=True)
class CgroupSite:
    """Our own memory cgroup, under which the capped child cgroups are made."""

    version: int  # 1 or 2
    path: Path

    @property
    def limit_file(self) -> str:
        return "memory.limit_in_bytes" if self.version == 1 else "memory.max"


def _mountinfo() -> list[tuple[str, Path, str, set[str]]]:
    """(root inside the hierarchy, mount point, fs type, super options) of every mount."""
    mounts = []
    for line in (PROC_SELF / "mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mounts.append((fields[3], Path(fields[4].replace("\\040", " ")), tail[0], set(tail[2].split(","))))
    return mounts


def _inside(mount_root: str, cgroup_path: str, mount_point: Path) -> Path | None:
    """The directory of `cgroup_path` under a mount of the hierarchy rooted at `mount_root`."""
    root = mount_root.rstrip("/")
    if root and not (cgroup_path == root or cgroup_path.startswith(root + "/")):
        return None
    rel = cgroup_path[len(root) :].lstrip("/")
    path = mount_point / rel if rel else mount_point
    return path if path.is_dir() else None


def _probe(site: CgroupSite) -> str | None:
    """Make and remove a child cgroup with a limit: None if that works, else why not."""
    probe = site.path / f"{CGROUP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
    try:
        probe.mkdir()
    except OSError as e:
        return (
            f"cannot create a memory cgroup under {site.path} ({e.strerror}); run as root, or in a cgroup "
            "delegated to this user (e.g. systemd-run --user --scope -p Delegate=yes)"
        )
    try:
        (probe / site.limit_file).write_text(str(64 * MIB))
    except OSError as e:
        return (
            f"cannot set {site.limit_file} in a child of {site.path} ({e.strerror}); the memory controller is unusable"
        )
    finally:
        with suppress(OSError):
            probe.rmdir()
    return None


def _find_site() -> CgroupSite | str:
    try:
        membership = (PROC_SELF / "cgroup").read_text().splitlines()
        mounts = _mountinfo()
    except OSError as e:
        return f"cannot read this process's cgroups ({e}); is /proc mounted?"
    v1_path = v2_path = None
    for line in membership:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    if v1_path is not None:  # the memory controller is bound to a v1 hierarchy
        for root, point, fstype, opts in mounts:
            if fstype == "cgroup" and "memory" in opts and (path := _inside(root, v1_path, point)):
                return CgroupSite(1, path)
        return (
            f"this process is in the cgroup v1 memory cgroup {v1_path}, but no mount of the memory "
            "hierarchy shows it (a container without /sys/fs/cgroup/memory?); mount it or run on the host"
        )
    if v2_path is not None:
        for root, point, fstype, _opts in mounts:
            if fstype == "cgroup2" and (path := _inside(root, v2_path, point)):
                try:
                    controllers = (path / "cgroup.controllers").read_text().split()
                    subtree = (path / "cgroup.subtree_control").read_text().split()
                except OSError as e:
                    return f"cannot read the cgroup v2 controllers of {path} ({e.strerror})"
                if "memory" not in controllers:
                    return (
                        f"the cgroup v2 memory controller is not available in {path} (cgroup.controllers: "
                        f"'{' '.join(controllers)}'); enable it in the parent, or run in a systemd scope with "
                        "Delegate=yes"
                    )
                if "memory" not in subtree:
                    return (
                        f"the cgroup v2 memory controller is not enabled for children of {path} "
                        f"(cgroup.subtree_control: '{' '.join(subtree)}'; it cannot be enabled while {path} holds "
                        "processes); start the pipeline in a cgroup whose subtree_control has memory, e.g. as "
                        "`systemd-run --scope -p Delegate=yes` moved into a leaf, or skip the RAM tier"
                    )
                return CgroupSite(2, path)
        return f"this process is in cgroup v2 {v2_path}, but no cgroup2 mount shows it; mount cgroup2 at /sys/fs/cgroup"
    return "no memory cgroup: neither a cgroup v1 memory hierarchy nor cgroup v2 is in use (/proc/self/cgroup)"


def cgroup_site() -> CgroupSite | str:
    """Our memory cgroup, checked by making a capped child (stale children of killed jobs removed first),
    or a one-line reason saying what to do."""
    site = _find_site()
    if isinstance(site, str):
        return site
    _remove_stale(site)
    return _probe(site) or site


def cgroup_support() -> str | None:
    """None when capped memory cgroups can be made here, else a one-line reason saying what to do."""
    site = cgroup_site()
    return site if isinstance(site, str) else None


@dataclass
class MemoryCgroup:
    path: Path
    version: int

    def oom_kills(self) -> int:
        try:
            text = (self.path / ("memory.oom_control" if self.version == 1 else "memory.events")).read_text()
        except OSError:
            return 0
        return int(m[1]) if (m := re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)) else 0

    def peak_bytes(self) -> int | None:
        try:
            return int((self.path / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")).read_text())
        except (OSError, ValueError):
            return None


_serial = itertools.count(1)


def _remove_stale(site: CgroupSite) -> None:
    """Cgroups left by a job that was killed outright (its pid gone) and now empty."""
    for child in site.path.glob(f"{CGROUP_PREFIX}*"):
        m = re.match(rf"{CGROUP_PREFIX}(?:probe-)?(\d+)-", child.name)
        if m and not Path(f"/proc/{m[1]}").exists():
            with suppress(OSError):
                child.rmdir()


@contextmanager
def memory_cgroup(site: CgroupSite, limit_bytes: int | None) -> Iterator[MemoryCgroup]:
    """A child of `site` limited to `limit_bytes` (None: unlimited, for accounting only); removed after."""
    path = site.path / f"{CGROUP_PREFIX}{os.getpid()}-{next(_serial)}"
    try:
        path.mkdir()
    except OSError as e:
        raise MoeplaceError(f"cannot create the memory cgroup {path} ({e.strerror}).") from None
    cg = MemoryCgroup(path, site.version)
    try:
        if limit_bytes is not None:  # a new cgroup starts unlimited
            try:
                (path / site.limit_file).write_text(str(limit_bytes))
            except OSError as e:
                raise MoeplaceError(f"cannot set {site.limit_file}={limit_bytes} on {path} ({e.strerror}).") from None
            # Swap would let anonymous memory leave the cap instead of being OOM-killed.
            swap = path / ("memory.memsw.limit_in_bytes" if site.version == 1 else "memory.swap.max")
            if swap.exists():
                try:
                    swap.write_text(str(limit_bytes) if site.version == 1 else "0")
                except OSError:
                    log.warning("could not cap swap in %s; no swap is assumed", path)
        yield cg
    finally:
        _remove_cgroup(cg)


def _remove_cgroup(cg: MemoryCgroup) -> None:
    """run_capped has killed and reaped the process group; kill what left it, then rmdir, which fails with
    EBUSY until the kernel has let go of the dead processes."""
    pids = []
    with suppress(OSError):
        pids = (cg.path / "cgroup.procs").read_text().split()
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:
        try:
            cg.path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("could not remove the memory cgroup %s (%s); remove it with rmdir", cg.path, e.strerror)
                return
            time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# page cache and readahead


def cached_bytes(paths: Sequence[str | Path]) -> int:
    """How many bytes of these files are in the page cache now (mincore over a fresh mapping)."""
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        vec = np.zeros(-(-size // PAGE), np.uint8)
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = np.frombuffer(m, np.uint8)  # only for the mapping's address
            rc = _LIBC.mincore(view.ctypes.data, size, vec.ctypes.data)
            del view  # the mapping cannot be closed while a view of it exists
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"mincore on {p} failed")
        total += int(np.count_nonzero(vec & 1)) * PAGE
    return total


def evict_page_cache(paths: Sequence[str | Path]) -> tuple[str, int]:
    """Drop the files' pages from the page cache; (how, bytes still cached afterwards).

    posix_fadvise(DONTNEED) after fsync (dirty pages, e.g. of a freshly written model, are not
    dropped); if pages remain and we may, the global drop_caches as well.
    """
    for p in paths:
        with open(p, "rb") as f:
            with suppress(OSError):
                os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    method = "posix_fadvise DONTNEED"
    left = cached_bytes(paths)
    if left and os.access(DROP_CACHES, os.W_OK):
        os.sync()
        with suppress(OSError):
            DROP_CACHES.write_text("1")
            method += " + drop_caches"
            left = cached_bytes(paths)
    return method, left


@dataclass(frozen=True)
class BlockDevice:
    name: str
    read_ahead: Path  # .../queue/read_ahead_kb


def block_device(path: str | Path) -> BlockDevice | str:
    """The block device whose readahead applies to `path` (the disk, for a partition), or why none."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    node = SYS_DEV_BLOCK / f"{major}:{minor}"
    if major == 0 or not node.exists():
        return f"{path} is on device {major}:{minor}, which is not a block device (overlayfs, btrfs, tmpfs, NFS?)"
    real = node.resolve()
    if (real / "partition").exists():
        real = real.parent
    ra = real / "queue" / "read_ahead_kb"
    if not ra.exists():
        return f"block device {real.name} has no queue/read_ahead_kb"
    return BlockDevice(real.name, ra)


@dataclass
class Readahead:
    """What the runs use: a label for the records, the read_ahead_kb in force (None: unknown, or MADV_RANDOM)
    and whether the shim must advise MADV_RANDOM."""

    description: str
    kib: int | None
    madvise: str  # "random" or "none"
    note: str = ""  # why the fallback, or what is unknown
    restore: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def effective_kib(self) -> int | None:
        """The window read around a fault in llama.cpp's mapping: its posix_fadvise(SEQUENTIAL) doubles the
        file's read_ahead_kb; MADV_RANDOM turns read-around off (0)."""
        if self.madvise == "random":
            return 0
        return None if self.kib is None else 2 * self.kib


@contextmanager
def readahead_control(paths: Sequence[str | Path], kb: int | None) -> Iterator[Readahead]:
    """kb None: leave the devices' readahead as it is. Else set read_ahead_kb (KiB) on the devices behind
    `paths` (restored afterwards, whatever happens), or where that cannot be done fall back to
    MADV_RANDOM on the mapping (no read-around at all)."""
    found = [block_device(p) for p in paths]
    devices = list({d.name: d for d in found if isinstance(d, BlockDevice)}.values())
    problems = [d for d in found if isinstance(d, str)]
    names = ", ".join(d.name for d in devices)
    if kb is None:
        current = sorted({int(d.read_ahead.read_text()) for d in devices})
        if devices and not problems:
            values = "/".join(map(str, current))
            yield Readahead(f"device default {values} KiB (device {names})", max(current), "none")
        else:
            yield Readahead("device default", None, "none", note=problems[0])
        return
    ra = Readahead(f"{kb} KiB (device {names})", kb, "none")
    try:
        if problems:
            raise OSError(problems[0])
        for d in devices:
            old = d.read_ahead.read_text().strip()
            try:
                d.read_ahead.write_text(str(kb))
            except OSError as e:
                raise OSError(f"cannot write {d.read_ahead} ({e.strerror})") from None
            ra.restore.append((d.read_ahead, old))
            if d.read_ahead.read_text().strip() != str(kb):
                raise OSError(f"{d.read_ahead} reads {d.read_ahead.read_text().strip()} after writing {kb}")
    except OSError as e:
        _restore(ra)
        why = e.args[0] if len(e.args) == 1 else e
        ra = Readahead("madvise random", None, "random", note=f"read_ahead_kb not settable: {why}")
        log.warning("readahead: madvise random instead of %d KiB (%s)", kb, ra.note)
    try:
        yield ra
    finally:
        _restore(ra)


def _restore(ra: Readahead) -> None:
    while ra.restore:
        path, old = ra.restore.pop()
        try:
            path.write_text(old)
        except OSError as e:
            log.error("could not restore %s to %s KiB (%s); set it by hand", path, old, e.strerror)


# ---------------------------------------------------------------------------------------------
# non-expert byte ranges


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


def is_expert_tensor(name: str) -> bool:
    m = _LAYER.match(name)
    return bool(m) and tensor_role(m[2]) == "expert"


def non_expert_ranges(model_path: str | Path, page: int = PAGE) -> list[tuple[Path, list[tuple[int, int]]]]:
    """Per model file (all shards): the page-rounded, merged file ranges holding non-expert tensor data."""
    out = []
    for shard in shard_paths(Path(model_path)):
        reader = GGUFReader(shard, "r")
        spans = [(int(t.data_offset), int(t.n_bytes)) for t in reader.tensors if not is_expert_tensor(t.name)]
        out.append((shard, merge_ranges(spans, page, limit=shard.stat().st_size)))
    return out


def shim_env(targets: Sequence[tuple[Path, list[tuple[int, int]]]], madvise: str) -> dict[str, str]:
    """The pagelock shim's variables: every model file (ranges may be empty) and the madvise mode."""
    env = {"MOEPLACE_MADVISE": madvise}
    for i, (path, ranges) in enumerate(targets):
        suffix = f"_{i}" if i else ""
        env[f"MOEPLACE_PAGELOCK_FILE{suffix}"] = str(path)
        env[f"MOEPLACE_PAGELOCK_RANGES{suffix}"] = ",".join(f"{o}:{n}" for o, n in ranges)
    return env


def parse_shim(stderr: str) -> dict[str, Any]:
    """How many model mappings the shim saw, the bytes it locked in them, and its complaints (any one of which,
    a failed mlock or madvise, spoils the run)."""
    locked = _SHIM_LINE.findall(stderr)
    return {"mapped": len(locked), "locked_bytes": sum(map(int, locked)), "problems": _SHIM_PROBLEM.findall(stderr)}


# ---------------------------------------------------------------------------------------------
# one run


# Decode only, once, no warmup (the G1 and G2 runs load alike), on the CPU, weights left in the file mapping.
_BENCH_ARGS = "-p 0 -r 1 --no-warmup -ngl 0 --repack 0 -lm mmap -o jsonl".split()


def ram_tier_command(manifest: dict[str, Any], model: str, gen: int, threads: int) -> list[str]:
    return [str(require_binary(manifest, "llama-bench")), "-m", model, "-n", str(gen), "-t", str(threads), *_BENCH_ARGS]


def _check_flags(manifest: dict[str, Any]) -> None:
    bench = require_binary(manifest, "llama-bench")
    usage = subprocess.run([str(bench), "--help"], capture_output=True, text=True, timeout=60)
    text = usage.stdout + usage.stderr
    missing = [flag for flag in ("--repack", "--load-mode", "--no-warmup") if flag not in text]
    if missing:
        raise MoeplaceError(
            f"{bench} does not offer {', '.join(missing)}, which the RAM tier needs (weights left in the mmap, "
            "mmap load mode); update llama.cpp or unset llamacpp.bin_dir to use the pinned build."
        )


@dataclass
class RunResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    majflt: int | None
    anon_peak_bytes: int
    cgroup_peak_bytes: int | None  # None without a cgroup
    oom_kills: int
    stdout: str
    stderr: str
    start_error: str = ""


def _rss_anon(pid: int) -> int | None:
    """RssAnon of a live process in bytes."""
    try:
        m = re.search(r"^RssAnon:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m[1]) * 1024 if m else None


def _child_setup(cg: MemoryCgroup | None) -> None:
    """In the child before exec: own process group and death with the parent, into the cgroup, memlock."""
    die_with_parent()
    if cg is not None:
        try:
            (cg.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as e:
            os.write(2, f"moeplace: cannot join the memory cgroup {cg.path}: {e.strerror}\n".encode())
            raise
    limit = resource.RLIM_INFINITY if os.geteuid() == 0 else resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    with suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))


def run_capped(
    cmd: list[str],
    env: dict[str, str],
    limit_bytes: int | None,
    timeout_s: float,
    site: CgroupSite | None = None,
    max_poll_s: float = 0.05,
) -> RunResult:
    """Run `cmd` as a fresh process: rusage major faults, wall time, the peak of RssAnon (sampled from
    /proc/<pid>/status) and, in its own memory cgroup under `site` limited to `limit_bytes` (None:
    unlimited), the cgroup's peak charge and OOM kills. Without a site it runs in no cgroup of ours,
    which only an uncapped run can."""
    if site is None and limit_bytes is not None:
        raise MoeplaceError("a memory cap needs a memory cgroup")
    with (
        memory_cgroup(site, limit_bytes) if site else nullcontext() as cg,
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=lambda: _child_setup(cg))
        except (OSError, subprocess.SubprocessError) as e:
            err.seek(0)
            return RunResult(None, False, 0.0, None, 0, None, 0, "", err.read(), start_error=str(e))
        anon = 0
        timed_out = False
        kill_at = math.inf
        status = 0
        rusage = None
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    rusage = usage
                    break
                anon = max(anon, _rss_anon(proc.pid) or 0)
                if time.monotonic() - t0 > timeout_s and not timed_out:
                    timed_out = True
                    _kill_group(proc.pid, signal.SIGTERM)
                    kill_at = time.monotonic() + 5
                elif time.monotonic() > kill_at:
                    _kill_group(proc.pid, signal.SIGKILL)
                # Often at first (a tiny model decodes in milliseconds), then at most every max_poll_s.
                time.sleep(min(max_poll_s, max(0.002, (time.monotonic() - t0) / 50)))
        finally:
            if rusage is None:  # interrupted (SIGTERM of the job): leave nothing running
                _kill_group(proc.pid, signal.SIGKILL)
                _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return RunResult(
            returncode=proc.returncode,
            timed_out=timed_out,
            wall_s=wall,
            majflt=rusage.ru_majflt,
            anon_peak_bytes=anon,
            cgroup_peak_bytes=cg.peak_bytes() if cg else None,
            oom_kills=cg.oom_kills() if cg else 0,
            stdout=out.read(),
            stderr=err.read(),
        )


def _kill_group(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tg_result(stdout: str) -> dict[str, Any] | None:
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("n_gen"):
                return r
    return None


def classify(run: RunResult, capped: bool) -> tuple[str, str]:
    """('ok', '') or (oom/crash/timeout/error, why) for one llama-bench run."""
    if run.start_error:
        return "error", f"could not start llama-bench: {run.start_error}"
    if run.timed_out:
        return "timeout", "no result before the per-run timeout"
    if run.oom_kills:
        return "oom", f"killed by the memory cgroup's OOM killer ({run.oom_kills} kill(s))" + (
            "" if capped else " without a cap: the machine itself is out of memory"
        )
    if run.returncode is not None and run.returncode < 0:
        return "crash", f"killed by {signal.Signals(-run.returncode).name}"
    if run.returncode != 0:
        return "error", f"llama-bench exited with code {run.returncode}"
    if _tg_result(run.stdout) is None:
        return "error", "llama-bench printed no tg result"
    return "ok", ""


# ---------------------------------------------------------------------------------------------
# the sweep


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM (how Snakemake stops a job) unwinds like an exception, so readahead and cgroups are restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(
    *,
    cmd_for: Callable[[int], list[str]],
    gen: tuple[int, int],
    env: dict[str, str],
    files: list[str],
    site: CgroupSite | None,
    cap_bytes: int | None,
    expect_locked: int,
    model_bytes: int,
    timeout_s: float,
    log_path: Path,
) -> dict[str, Any]:
    """Both generation lengths, each evicted and fresh; the derived row fields."""
    runs: list[RunResult] = []
    evicts: list[tuple[str, int]] = []
    status, error = "ok", ""
    shim: dict[str, Any] = {}
    for g in gen:
        evicts.append(evict_page_cache(files))
        if cap_bytes is not None and evicts[-1][1] > 0.05 * model_bytes:
            status = "error"
            error = (
                f"{evicts[-1][1] / MIB:.1f} MiB of the model stayed in the page cache after eviction (tmpfs? "
                "mapped by another process?); those pages escape the cap, so the run would not be capped"
            )
            break
        cmd = cmd_for(g)
        log.info("$ %s  (cap %s)", " ".join(cmd), "none" if cap_bytes is None else f"{cap_bytes} bytes")
        run = run_capped(cmd, env, cap_bytes, timeout_s, site)
        runs.append(run)
        with log_path.open("a") as f:
            f.write(f"$ {' '.join(cmd)}  # cap {cap_bytes}\n{run.stderr}\n")
        status, error = classify(run, cap_bytes is not None)
        shim = parse_shim(run.stderr)
        if status == "ok" and shim["mapped"] == 0:
            status, error = "error", "the pagelock shim never saw the model file mapped (was it loaded with mmap?)"
        if status == "ok" and (shim["locked_bytes"] != expect_locked or shim["problems"]):
            status = "error"
            error = f"locked {shim['locked_bytes']} of {expect_locked} bytes: " + " | ".join(shim["problems"])
        if status != "ok":
            error = f"{error}: {_tail(run.stderr)}" if run.stderr.strip() else error
            break
    peaks = [r.cgroup_peak_bytes for r in runs if r.cgroup_peak_bytes is not None]
    row: dict[str, Any] = {
        "status": status,
        "error": error,
        "evict": evicts[-1][0] if evicts else None,
        "evict_left_bytes": max((e[1] for e in evicts), default=None),
        "majflt": [r.majflt for r in runs],
        "wall_s": [round(r.wall_s, 3) for r in runs],
        "anon_peak_bytes": max((r.anon_peak_bytes for r in runs), default=None),
        "cgroup_peak_bytes": max(peaks, default=None),
        "oom_kills": sum(r.oom_kills for r in runs),
        "locked_bytes": shim.get("locked_bytes"),
        "faults_per_token": None,
        "tok_s": None,
        "tok_s_marginal": None,
    }
    if status == "ok":
        (g1, g2), (short, long_) = gen, runs
        row["faults_per_token"] = (long_.majflt - short.majflt) / (g2 - g1)
        row["tok_s"] = float(_tg_result(long_.stdout)["avg_ts"])  # type: ignore[index]
        if long_.wall_s > short.wall_s:  # else too noisy to say
            row["tok_s_marginal"] = (g2 - g1) / (long_.wall_s - short.wall_s)
    return row


def settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config's ram_tier section as run_ram_tier's sweep keywords (the quant comparison runs the same sweep)."""
    return {
        "readahead_kb": cfg["readahead_kb"],
        "gen": tuple(cfg["gen"]),
        "timeout_s": cfg["timeout_s"],
        "slack_bytes": parse_size(cfg["slack"], "ram_tier.slack"),
    }


def run_ram_tier(
    *,
    model_name: str,
    model_path: str,
    meta: dict[str, Any],
    manifest: dict[str, Any],
    caps_pct: list[int],
    readahead_kb: int | None,
    lock_modes: list[str],
    gen: tuple[int, int],
    threads: int,
    timeout_s: float,
    log_path: Path,
    workdir: Path,
    slack_bytes: int = DEFAULT_SLACK_BYTES,
) -> list[dict[str, Any]]:
    """An uncapped reference run, then every cap (percent of the model's file bytes) x lock mode.

    One record per row, failed ones included (status oom/crash/timeout/error and the stderr tail).
    Where no memory cgroup can be made, the capped rows have status 'skipped' and the reason; where
    the reference fails, a single 'error' row (cap_pct and lock None) stands for all of them.
    """
    g1, g2 = gen
    if not 0 < g1 < g2:
        raise MoeplaceError(f"ram tier: the generation lengths must be 0 < G1 < G2, got {gen}.")
    unknown = [m for m in lock_modes if m not in LOCK_MODES]
    if unknown:
        raise MoeplaceError(f"ram tier: unknown lock mode(s) {unknown}; use {list(LOCK_MODES)}.")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    files = [str(f["path"]) for f in meta["files"]] or [str(p) for p in shard_paths(Path(model_path))]
    model_bytes = sum(os.path.getsize(f) for f in files)
    site = cgroup_site()
    skip = site if isinstance(site, str) else None
    if skip:
        log.warning("RAM tier: only the uncapped reference runs, the caps are skipped: %s", skip)
    cg_site = None if skip else site
    _check_flags(manifest)
    shim = build_native("pagelock", log_path, shared=True)
    targets = non_expert_ranges(model_path)
    expect = sum(n for _, ranges in targets for _, n in ranges)
    no_ranges = [(path, []) for path, _ in targets]

    def cmd_for(g: int) -> list[str]:
        return ram_tier_command(manifest, model_path, g, threads)

    records: list[dict[str, Any]] = []
    with _sigterm_raises(), readahead_control(files, readahead_kb) as ra:
        common: dict[str, Any] = {
            "model": model_name,
            "model_bytes": model_bytes,
            "non_expert_bytes": meta.get("non_expert_bytes"),
            "expert_bytes": meta.get("expert_bytes"),
            "gen": list(gen),
            "threads": threads,
            "load_mode": "mmap",
            "repack": False,
            "slack_bytes": slack_bytes,
            "llamacpp_version": manifest.get("version"),
            "llamacpp_commit": manifest.get("build_commit"),
            "llamacpp_build": manifest.get("build_number"),
            "model_files": meta["files"],
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **host_facts(),
            **pipeline_revision(workdir),
            "readahead": ra.description,
            "readahead_kb": ra.kib,
            "readahead_effective_kib": ra.effective_kib,
            "readahead_note": ra.note,
            "madvise": ra.madvise,
            "cgroup": f"cgroup v{cg_site.version} under {cg_site.path}" if cg_site else None,
            "command": cmd_for(g2),
        }

        def measure(cap_pct: int | None, lock: str, cap: dict[str, Any]) -> dict[str, Any]:
            lock_targets = targets if lock == "non_expert" else no_ranges
            preload = " ".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD", "")]))
            row = _measure(
                cmd_for=cmd_for,
                gen=gen,
                env={**os.environ, "LD_PRELOAD": preload, **shim_env(lock_targets, ra.madvise)},
                files=files,
                site=cg_site,
                cap_bytes=cap.get("cap_bytes"),
                expect_locked=expect if lock == "non_expert" else 0,
                model_bytes=model_bytes,
                timeout_s=timeout_s,
                log_path=log_path,
            )
            record = {**common, "cap_pct": cap_pct, "lock": lock, **row, **cap}
            record["lock_expected_bytes"] = expect if lock == "non_expert" else 0
            log.info(
                "ram tier %s cap %s lock %s: %s, %s tok/s (%s marginal), %s faults/token",
                model_name,
                "none" if cap_pct is None else f"{cap_pct}%",
                lock,
                record["status"],
                record["tok_s"],
                record["tok_s_marginal"],
                record["faults_per_token"],
            )
            return record

        ref = measure(None, "none", {})
        anon = ref["anon_peak_bytes"]
        other = None
        if ref["status"] == "ok" and ref["cgroup_peak_bytes"]:
            # Charged to the uncapped run besides its anonymous memory and the (fully mapped) model.
            other = max(0, ref["cgroup_peak_bytes"] - anon - model_bytes)
        ref["other_charged_bytes"] = other
        records.append(ref)
        if ref["status"] != "ok":
            caps = ", ".join(f"{p}%" for p in caps_pct)
            why = f"the uncapped reference run failed ({ref['status']}), so no cap ({caps}) could be sized or run"
            records.append({**common, "cap_pct": None, "lock": None, "status": "error", "error": why})
            return records
        for pct in caps_pct:
            for lock in lock_modes:
                if skip:
                    records.append({**common, "cap_pct": pct, "lock": lock, "status": "skipped", "error": skip})
                    continue
                share = round(pct / 100 * model_bytes)
                cap = anon + slack_bytes + share
                cap_parts = {
                    "cap_bytes": cap,
                    "cap_model_bytes": share,
                    # What the model's pages can really have: the cap less what the reference run charged besides.
                    "model_room_pct": None if other is None else 100 * (cap - anon - other) / model_bytes,
                    "anon_peak_bytes": anon,  # the reference's, which sized the cap
                    "other_charged_bytes": other,
                }
                records.append(measure(pct, lock, cap_parts))
    return records


# ---------------------------------------------------------------------------------------------
# table and figure


TABLE_COLUMNS = [
    "model",
    "cap_pct",
    "cap_gb",
    "model_room_pct",
    "lock",
    "tok_s",
    "tok_s_marginal",
    "faults_per_token",
    "locked_mb",
    "readahead",
    "readahead_effective_kib",
    "status",
    "error",
]
_NUMERIC = ["cap_pct", "cap_gb", "model_room_pct", "tok_s", "tok_s_marginal", "faults_per_token", "locked_mb"]


def ram_tier_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per record, in run_ram_tier's order: the uncapped reference (cap_pct NaN) first."""
    table = pd.DataFrame(
        [
            {
                **{c: r.get(c) for c in TABLE_COLUMNS},
                "cap_gb": None if r.get("cap_bytes") is None else r["cap_bytes"] / 1e9,
                "locked_mb": None if r.get("locked_bytes") is None else r["locked_bytes"] / 1e6,
                "error": r.get("error") or "",
            }
            for r in records
        ],
        columns=TABLE_COLUMNS,
    )
    table[_NUMERIC] = table[_NUMERIC].apply(pd.to_numeric, errors="coerce").astype(float)
    table["readahead_effective_kib"] = pd.to_numeric(table.readahead_effective_kib, errors="coerce").astype("Int64")
    return table


def predicted_column(
    table: pd.DataFrame, meta: dict[str, Any], ddr_gbps: float | None, disk_gbps: float | None
) -> pd.DataFrame:
    """The table with tok_s_predicted: predict.ram_tier_tok_s with the share of the model's file bytes the
    cap left it (model_room_pct where known, else cap_pct) as the weights' page cache (all of it uncapped);
    NaN where a bandwidth it needs is unknown."""
    model_bytes = sum(f["size"] for f in meta.get("files") or []) or meta["total_bytes"]

    def one(cap_pct: float, room_pct: float) -> float:
        pct = room_pct if pd.notna(room_pct) else cap_pct
        if not ddr_gbps:
            return math.nan
        weight_ram = None if pd.isna(pct) else round(max(pct, 0) / 100 * model_bytes)
        try:
            return ram_tier_tok_s(meta, weight_ram, ddr_gbps, disk_gbps)  # type: ignore[arg-type]
        except MoeplaceError:  # pages from disk, but no disk bandwidth
            return math.nan

    return table.assign(tok_s_predicted=[one(c, r) for c, r in zip(table.cap_pct, table.model_room_pct)])


def plot_ram_tier(table: pd.DataFrame, path: str | Path, title: str) -> None:
    """Decode tok/s and major faults per token against the RAM cap (one model, one readahead), side by
    side: one line per lock mode, the uncapped run as a dotted reference, the prediction where the table
    has it; rows that did not run are marked with their status and listed under the panels."""
    fig = Figure(figsize=(12, 5.5))
    axes = fig.subplots(1, 2)
    ref = table[table.cap_pct.isna() & (table.status == "ok")]
    capped = table[table.cap_pct.notna()]
    labels = {"none": "no locking", "non_expert": "non-expert tensors mlock'ed"}
    for ax, column, ylabel in (
        (axes[0], "tok_s", "decode speed (llama-bench tg), tokens/s"),
        (axes[1], "faults_per_token", "major page faults per generated token"),
    ):
        if len(ref):
            value = float(ref[column].iloc[0])
            ax.axhline(value, color="tab:gray", ls=":", label=f"no cap ({value:.3g})")
        if column == "tok_s" and "tok_s_predicted" in capped and capped.tok_s_predicted.notna().any():
            p = capped.drop_duplicates("cap_pct").sort_values("cap_pct")
            ax.plot(p.cap_pct, p.tok_s_predicted, "x--", color="black", lw=1, label="predicted (RAM + disk bandwidth)")
        for k, lock in enumerate(m for m in LOCK_MODES if m in set(capped.lock)):
            c = capped[capped.lock == lock].sort_values("cap_pct")
            ok = c[c.status == "ok"]
            ax.plot(ok.cap_pct, ok[column], "o-", color=f"C{k}", label=labels[lock] if len(ok) else None)
            for r in c[c.status != "ok"].itertuples():
                ax.annotate(str(r.status).upper(), (r.cap_pct, 0), xytext=(0, 4 + 10 * k), textcoords="offset points",
                            xycoords=("data", "axes fraction"), ha="center", fontsize=8, color="tab:red")  # fmt: skip
        values = pd.concat([ref[column], capped[column]]).dropna()
        positive = values[values > 0]
        if column == "tok_s" and len(positive) and positive.max() / positive.min() > 30:
            ax.set_yscale("log")  # speeds under a cap can be orders of magnitude apart
        else:
            ax.set_ylim(bottom=0)
        if len(capped):
            ax.set_xlim(max(capped.cap_pct.max() + 5, 105), min(capped.cap_pct.min() - 5, 0))  # less RAM to the right
        ax.set_xlabel("RAM cap: % of the model's file bytes, on top of anon peak + slack")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    notes = sorted({f"{r.status}: {str(r.error)[:150]}" for r in table[table.status != "ok"].itertuples()})[:4]
    for i, note in enumerate(notes):
        fig.text(0.01, 0.01 + 0.03 * i, note, fontsize=7, color="tab:red")
    readahead = "; ".join(sorted(set(table.readahead.dropna())))
    fig.suptitle(f"{title}\nreadahead: {readahead}" if readahead else title, fontsize=10)
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
