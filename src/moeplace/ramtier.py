"""Stage 'ramtier': decode speed when RAM is smaller than the model (mmap'd weights under a memory cap).

Each measurement is llama-bench decode (`-p 0 -n G`, weights mmap'd, `--repack 0` so they stay
file-backed: repacked weights are anonymous memory and a cap would OOM-kill them) in a fresh
process inside a memory cgroup made for it (cgroup v1 memory.limit_in_bytes or v2 memory.max)
under our own, removed afterwards. Before every run the model's pages are evicted from the page
cache: a cached page stays charged to whoever touched it first, so pages left over from an
earlier run would escape the cap. Two generation lengths G1 < G2 give major faults per token
((F(G2) - F(G1)) / (G2 - G1), loading excluded) from the child's rusage; tok/s is llama-bench's
tg average of the G2 run.

The cap is anon_peak + slack + pct% of the model's file bytes, where anon_peak is the
anonymous memory (RssAnon, sampled) of an uncapped run of the same command: what cannot be
evicted, KV cache and compute buffers included, plus a slack (default 4 MiB) for page tables,
kernel memory and library pages not yet cached. Every part is recorded, and so is what the uncapped run
had charged besides its anonymous memory and the model (other_charged_bytes), which gives the
share of the model the cap really leaves room for (model_room_pct).

Where no memory cgroup can be made (not root, cgroup v2 without a delegated memory controller),
the sweep is one row with status 'skipped' and the reason (cgroup_support() says it up front).

Disk readahead decides what one fault costs (with the 8 MB default each fault reads megabytes
and a capped run collapses); it is an explicit parameter: read_ahead_kb of the device behind
the model (set when writable, always restored), or MADV_RANDOM on the mapping via the pagelock
shim where it cannot be set. Note that llama.cpp calls posix_fadvise(SEQUENTIAL) on the model
file, which doubles the window the kernel uses for that file.

Locking: llama.cpp's --mlock is all-or-nothing; lock mode "non_expert" mlocks only the byte
ranges of the non-expert tensors inside llama.cpp's mapping (the pagelock shim), so the page
cache the cap leaves serves the experts. "none" locks nothing.
"""

from __future__ import annotations

import ctypes
import errno
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from .bench import _die_with_parent, _tail, host_facts, pipeline_revision
from .errors import MoeplaceError
from .gguf_file import shard_paths
from .llamacpp import build_native, require_binary
from .metadata import tensor_role

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
_SHIM_LINE = re.compile(r"^pagelock: locked (\d+) bytes in (\d+) ranges \(madvise=(\w+)\)", re.MULTILINE)
_SHIM_PROBLEM = re.compile(r"^pagelock: (?!locked \d+ bytes).*$", re.MULTILINE)


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
        try:
            probe.rmdir()
        except OSError:
            pass
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


def cgroup_support() -> str | None:
    """None when capped memory cgroups can be made here, else a one-line reason saying what to do."""
    site = _find_site()
    if isinstance(site, str):
        return site
    return _probe(site)


@dataclass
class MemoryCgroup:
    """A child memory cgroup with a limit (None: unlimited, for accounting only)."""

    path: Path
    version: int
    limit_bytes: int | None

    def join(self) -> None:
        """Move the calling process in (in a child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def _stat(self, name: str) -> dict[str, int]:
        out = {}
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
        except OSError:
            pass
        return out

    def oom_kills(self) -> int:
        return self._stat("memory.oom_control" if self.version == 1 else "memory.events").get("oom_kill", 0)

    def peak_bytes(self) -> int | None:
        try:
            return int((self.path / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")).read_text())
        except (OSError, ValueError):
            return None

    def describe(self) -> str:
        return f"cgroup v{self.version} {self.path.parent}"


_serial = 0


def _remove_stale(site: CgroupSite) -> None:
    """Cgroups left by a job that was killed outright (its pid gone) and now empty."""
    for child in site.path.glob(f"{CGROUP_PREFIX}*"):
        m = re.match(rf"{CGROUP_PREFIX}(?:probe-)?(\d+)-", child.name)
        if m and not Path(f"/proc/{m[1]}").exists():
            try:
                child.rmdir()
            except OSError:
                pass


@contextmanager
def memory_cgroup(limit_bytes: int | None) -> Iterator[MemoryCgroup]:
    """A memory cgroup under our own with the given limit; its processes are killed and it is removed after."""
    global _serial
    site = _find_site()
    if isinstance(site, str):
        raise MoeplaceError(f"cannot make a memory cgroup: {site}.")
    _remove_stale(site)
    _serial += 1
    path = site.path / f"{CGROUP_PREFIX}{os.getpid()}-{_serial}"
    try:
        path.mkdir()
    except OSError as e:
        raise MoeplaceError(f"cannot create the memory cgroup {path} ({e.strerror}).") from None
    cg = MemoryCgroup(path, site.version, limit_bytes)
    try:
        limit = str(limit_bytes) if limit_bytes is not None else ("-1" if site.version == 1 else "max")
        try:
            (path / site.limit_file).write_text(limit)
            # Swap would let anonymous memory leave the cap instead of being OOM-killed.
            swap = path / ("memory.memsw.limit_in_bytes" if site.version == 1 else "memory.swap.max")
            if swap.exists() and limit_bytes is not None:
                try:
                    swap.write_text(limit if site.version == 1 else "0")
                except OSError:
                    log.warning("could not cap swap in %s; no swap is assumed", path)
        except OSError as e:
            raise MoeplaceError(f"cannot set {site.limit_file}={limit} on {path} ({e.strerror}).") from None
        yield cg
    finally:
        _remove_cgroup(cg)


def _remove_cgroup(cg: MemoryCgroup) -> None:
    deadline = time.monotonic() + 10
    while (pids := cg.pids()) and time.monotonic() < deadline:
        kill = cg.path / "cgroup.kill"
        if kill.exists():
            try:
                kill.write_text("1")
            except OSError:
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
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


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def cached_bytes(paths: Sequence[str | Path]) -> int:
    """How many bytes of these files are in the page cache now (mincore over a fresh mapping)."""
    libc = _libc()
    total = 0
    chunk = 1 << 30
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {p} failed")
            try:
                for start in range(0, size, chunk):
                    length = min(chunk, size - start)
                    vec = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
                    if libc.mincore(ctypes.c_void_p(addr + start), length, vec) != 0:
                        raise OSError(ctypes.get_errno(), f"mincore on {p} failed")
                    total += sum(b & 1 for b in bytes(vec)) * PAGE
            finally:
                libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)
    return total


def evict_page_cache(paths: Sequence[str | Path]) -> tuple[str, int]:
    """Drop the files' pages from the page cache; (how, bytes still cached afterwards).

    posix_fadvise(DONTNEED) after fsync (dirty pages, e.g. of a freshly written model, are not
    dropped); if pages remain and we may, the global drop_caches as well.
    """
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            try:
                os.fsync(fd)
            except OSError:
                pass
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    method = "posix_fadvise DONTNEED"
    left = cached_bytes(paths)
    if left and os.access(DROP_CACHES, os.W_OK):
        os.sync()
        try:
            DROP_CACHES.write_text("1")
            method += " + drop_caches"
            left = cached_bytes(paths)
        except OSError:
            pass
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
    """What the runs use: a description for the records and whether the shim must advise MADV_RANDOM."""

    description: str
    kb: int | None
    madvise: str  # "random" or "none"
    note: str = ""  # why the fallback, or what is unknown
    restore: list[tuple[Path, str]] = field(default_factory=list)


@contextmanager
def readahead_control(paths: Sequence[str | Path], kb: int | None) -> Iterator[Readahead]:
    """kb None: leave the devices' readahead as it is. Else set read_ahead_kb on the devices behind
    `paths` (restored afterwards, whatever happens), or where that cannot be done fall back to
    MADV_RANDOM on the mapping (no read-around at all)."""
    found = [block_device(p) for p in paths]
    devices = list({d.name: d for d in found if isinstance(d, BlockDevice)}.values())
    problems = [d for d in found if isinstance(d, str)]
    names = ", ".join(d.name for d in devices)
    if kb is None:
        current = sorted({d.read_ahead.read_text().strip() for d in devices})
        if devices and not problems:
            ra = Readahead(f"device default {'/'.join(current)} KB (device {names})", None, "none")
        else:
            ra = Readahead("device default", None, "none", note=problems[0])
        yield ra
        return
    ra = Readahead(f"{kb} KB (device {names})", kb, "none")
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
        log.warning("readahead: madvise random instead of %d KB (%s)", kb, ra.note)
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
            log.error("could not restore %s to %s KB (%s); set it by hand", path, old, e.strerror)


# ---------------------------------------------------------------------------------------------
# non-expert byte ranges


def merge_ranges(spans: Sequence[tuple[int, int]], page: int = PAGE, limit: int | None = None) -> list[tuple[int, int]]:
    """(offset, length) spans rounded out to whole pages, clipped to `limit` (rounded up), merged where
    they overlap or touch; sorted."""
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
    from gguf import GGUFReader

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
    lines = _SHIM_LINE.findall(stderr)
    return {
        "mapped": len(lines),
        "locked_bytes": sum(int(n) for n, _, _ in lines),
        "locked_ranges": sum(int(m) for _, m, _ in lines),
        "madvise": sorted({a for _, _, a in lines}),
        "problems": _SHIM_PROBLEM.findall(stderr),
    }


# ---------------------------------------------------------------------------------------------
# one run


def ram_tier_command(manifest: dict[str, Any], model: str, gen: int, threads: int) -> list[str]:
    return [
        str(require_binary(manifest, "llama-bench")),
        "-m",
        model,
        "-p",
        "0",
        "-n",
        str(gen),
        "-r",
        "1",
        "--no-warmup",
        "-ngl",
        "0",
        "-t",
        str(threads),
        "--repack",
        "0",
        "-lm",
        "mmap",
        "-o",
        "jsonl",
    ]


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
    file_rss_peak_bytes: int
    cgroup_peak_bytes: int | None
    oom_kills: int
    stdout: str
    stderr: str
    start_error: str = ""


def _proc_status(pid: int) -> tuple[int, int] | None:
    """(RssAnon, RssFile) of a live process in bytes."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = dict(re.findall(r"^(RssAnon|RssFile):\s+(\d+) kB", text, re.MULTILINE))
    if len(values) < 2:
        return None
    return int(values["RssAnon"]) * 1024, int(values["RssFile"]) * 1024


def _child_setup(cg: MemoryCgroup) -> None:
    """In the child before exec: own process group and death with the parent, into the cgroup, memlock."""
    _die_with_parent()
    try:
        cg.join()
    except OSError as e:
        os.write(2, f"moeplace: cannot join the memory cgroup {cg.path}: {e.strerror}\n".encode())
        raise
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        if os.geteuid() == 0:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        else:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    except (OSError, ValueError):
        pass


def run_capped(
    cmd: list[str], env: dict[str, str], limit_bytes: int | None, timeout_s: float, max_poll_s: float = 0.05
) -> RunResult:
    """Run `cmd` as a fresh process in its own memory cgroup: rusage major faults, wall time, and the peaks
    of RssAnon/RssFile (sampled from /proc/<pid>/status) and of the cgroup's charge."""
    with (
        memory_cgroup(limit_bytes) as cg,
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, preexec_fn=lambda: _child_setup(cg))
        except (OSError, subprocess.SubprocessError) as e:
            err.seek(0)
            return RunResult(None, False, 0.0, None, 0, 0, None, 0, "", err.read(), start_error=str(e))
        anon = file = 0
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
                if (sample := _proc_status(proc.pid)) is not None:
                    anon, file = max(anon, sample[0]), max(file, sample[1])
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
            file_rss_peak_bytes=file,
            cgroup_peak_bytes=cg.peak_bytes(),
            oom_kills=cg.oom_kills(),
            stdout=out.read(),
            stderr=err.read(),
        )


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
    cmd_for: Any,
    gen: tuple[int, int],
    env: dict[str, str],
    files: list[str],
    cap_bytes: int | None,
    expect_locked: int | None,
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
        run = run_capped(cmd, env, cap_bytes, timeout_s)
        runs.append(run)
        with log_path.open("a") as f:
            f.write(f"$ {' '.join(cmd)}  # cap {cap_bytes}\n{run.stderr}\n")
        status, error = classify(run, cap_bytes is not None)
        shim = parse_shim(run.stderr)
        if status == "ok" and shim["mapped"] == 0:
            status, error = "error", "the pagelock shim never saw the model file mapped (was it loaded with mmap?)"
        if status == "ok" and expect_locked is not None and shim["locked_bytes"] != expect_locked:
            status = "error"
            error = f"locked {shim['locked_bytes']} of {expect_locked} bytes: " + " | ".join(shim["problems"])
        if status != "ok":
            error = f"{error}: {_tail(run.stderr)}" if run.stderr.strip() else error
            break
    row: dict[str, Any] = {
        "status": status,
        "error": error,
        "evict": evicts[-1][0] if evicts else None,
        "evict_left_bytes": max((e[1] for e in evicts), default=None),
        "majflt": [r.majflt for r in runs],
        "wall_s": [round(r.wall_s, 3) for r in runs],
        "run_anon_peak_bytes": max((r.anon_peak_bytes for r in runs), default=None),
        "file_rss_peak_bytes": max((r.file_rss_peak_bytes for r in runs), default=None),
        "cgroup_peak_bytes": max((r.cgroup_peak_bytes or 0 for r in runs), default=None),
        "oom_kills": sum(r.oom_kills for r in runs),
        "locked_bytes": shim.get("locked_bytes"),
        "locked_ranges": shim.get("locked_ranges"),
        "shim_madvise": ",".join(shim.get("madvise", [])) or None,
        "faults_per_token": None,
        "tok_s": None,
        "tok_s_short": None,
        "s_per_token_wall": None,
    }
    if status == "ok":
        short, long_ = (_tg_result(r.stdout) for r in runs)
        assert short is not None and long_ is not None
        g1, g2 = gen
        row["faults_per_token"] = (runs[1].majflt - runs[0].majflt) / (g2 - g1)
        row["tok_s"] = float(long_["avg_ts"])
        row["tok_s_short"] = float(short["avg_ts"])
        row["s_per_token_wall"] = (runs[1].wall_s - runs[0].wall_s) / (g2 - g1)
    return row


def _skipped(base: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    return [{**base, "cap_pct": None, "lock": "none", "status": "skipped", "error": reason}]


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

    One record per row, failed ones included (status oom/crash/timeout/error and the stderr tail);
    where no memory cgroup can be made, a single row with status 'skipped' and the reason.
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
    base: dict[str, Any] = {
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
    }
    reason = cgroup_support()
    if reason:
        log.warning("RAM tier skipped: %s", reason)
        return _skipped(base, reason)
    _check_flags(manifest)
    shim = build_native("pagelock", log_path, shared=True)
    targets = non_expert_ranges(model_path)
    expect = sum(n for _, ranges in targets for _, n in ranges)
    no_ranges = [(path, []) for path, _ in targets]
    site = _find_site()
    assert not isinstance(site, str)

    def cmd_for(g: int) -> list[str]:
        return ram_tier_command(manifest, model_path, g, threads)

    records: list[dict[str, Any]] = []
    with _sigterm_raises(), readahead_control(files, readahead_kb) as ra:
        common = {
            **base,
            "readahead": ra.description,
            "readahead_kb": ra.kb,
            "readahead_note": ra.note,
            "madvise": ra.madvise,
            "cgroup": f"cgroup v{site.version} under {site.path}",
            "command": cmd_for(g2),
        }

        def env_for(lock: str) -> dict[str, str]:
            preload = " ".join(filter(None, [str(shim), os.environ.get("LD_PRELOAD", "")]))
            lock_targets = targets if lock == "non_expert" else no_ranges
            return {**os.environ, "LD_PRELOAD": preload, **shim_env(lock_targets, ra.madvise)}

        def measure(cap_pct: int | None, lock: str, ref: dict[str, Any] | None) -> dict[str, Any]:
            parts: dict[str, Any] = {"cap_bytes": None, "cap_model_bytes": None, "model_room_pct": None}
            if cap_pct is not None and ref is not None:
                share = round(cap_pct / 100 * model_bytes)
                cap = ref["run_anon_peak_bytes"] + slack_bytes + share
                # What the model's pages can really have: the cap less what the reference run charged besides them.
                room = cap - ref["run_anon_peak_bytes"] - ref["other_charged_bytes"]
                parts = {"cap_bytes": cap, "cap_model_bytes": share, "model_room_pct": 100 * room / model_bytes}
            row = _measure(
                cmd_for=cmd_for,
                gen=gen,
                env=env_for(lock),
                files=files,
                cap_bytes=parts["cap_bytes"],
                expect_locked=expect if lock == "non_expert" else 0,
                model_bytes=model_bytes,
                timeout_s=timeout_s,
                log_path=log_path,
            )
            anon_ref = (ref or row)["run_anon_peak_bytes"]
            other = None
            if ref is None and row["status"] == "ok" and row["cgroup_peak_bytes"]:
                # Charged to the uncapped run besides its anonymous memory and the (fully mapped) model.
                other = max(0, row["cgroup_peak_bytes"] - row["run_anon_peak_bytes"] - model_bytes)
            record = {
                **common,
                "cap_pct": cap_pct,
                **parts,
                "anon_peak_bytes": anon_ref,
                "other_charged_bytes": other if ref is None else ref["other_charged_bytes"],
                "lock": lock,
                "lock_expected_bytes": expect if lock == "non_expert" else 0,
                **row,
            }
            log.info(
                "ram tier %s cap %s lock %s: %s %s tok/s, %s faults/token",
                model_name,
                "none" if cap_pct is None else f"{cap_pct}%",
                lock,
                record["status"],
                record["tok_s"],
                record["faults_per_token"],
            )
            return record

        reference = measure(None, "none", None)
        records.append(reference)
        for pct in caps_pct:
            for lock in lock_modes:
                if reference["status"] != "ok":
                    records.append(
                        {
                            **common,
                            "cap_pct": pct,
                            "cap_bytes": None,
                            "lock": lock,
                            "status": "error",
                            "error": "the uncapped reference run failed, so no cap could be sized: "
                            + reference["error"],
                        }
                    )
                    continue
                records.append(measure(pct, lock, reference))
    return records


# ---------------------------------------------------------------------------------------------
# table and figure


TABLE_COLUMNS = [
    "model",
    "cap_pct",
    "cap_gb",
    "lock",
    "tok_s",
    "faults_per_token",
    "locked_mb",
    "readahead",
    "status",
    "error",
]


def ram_tier_table(records: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per model x readahead x cap x lock mode; the uncapped reference (cap_pct NaN) first."""
    rows = []
    for r in records:
        cap = r.get("cap_bytes")
        locked = r.get("locked_bytes")
        rows.append(
            {
                "model": r.get("model"),
                "cap_pct": r.get("cap_pct"),
                "cap_gb": cap / 1e9 if cap is not None else None,
                "lock": r.get("lock", "none"),
                "tok_s": r.get("tok_s"),
                "faults_per_token": r.get("faults_per_token"),
                "locked_mb": locked / 1e6 if locked is not None else None,
                "readahead": r.get("readahead"),
                "status": r.get("status"),
                "error": r.get("error") or "",
            }
        )
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for column in ("cap_pct", "cap_gb", "tok_s", "faults_per_token", "locked_mb"):
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    table["uncapped"] = table.cap_pct.isna()
    table["lock_order"] = table.lock.map({m: i for i, m in enumerate(LOCK_MODES)}).fillna(len(LOCK_MODES))
    table = table.sort_values(
        ["model", "readahead", "uncapped", "cap_pct", "lock_order"],
        ascending=[True, True, False, False, True],
        kind="stable",
    )
    return table.drop(columns=["uncapped", "lock_order"]).reset_index(drop=True)


def predicted_column(
    table: pd.DataFrame, meta: dict[str, Any], ddr_gbps: float | None, disk_gbps: float | None
) -> pd.DataFrame:
    """The table with tok_s_predicted: predict.ram_tier_tok_s with cap_pct% of the model's file bytes as the
    weights' page cache (all of it uncapped); NaN where a bandwidth it needs is unknown."""
    from .predict import ram_tier_tok_s

    model_bytes = sum(f["size"] for f in meta.get("files") or []) or meta["total_bytes"]

    def one(cap_pct: float) -> float:
        if not ddr_gbps:
            return math.nan
        weight_ram = None if pd.isna(cap_pct) else round(cap_pct / 100 * model_bytes)
        try:
            return ram_tier_tok_s(meta, weight_ram, ddr_gbps, disk_gbps)  # type: ignore[arg-type]
        except MoeplaceError:  # pages from disk, but no disk bandwidth
            return math.nan

    return table.assign(tok_s_predicted=[one(c) for c in table.cap_pct])


def plot_ram_tier(table: pd.DataFrame, path: str | Path, title: str) -> None:
    """Decode tok/s and major faults per token against the RAM cap: one line per lock mode (colour) and
    model x readahead (line style), the uncapped run as a dotted reference, failed rows marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .outputs import atomic_path

    fig, axes = plt.subplots(1, 2, figsize=(13, 6.2))
    colors = {"none": "tab:blue", "non_expert": "tab:orange"}
    labels = {"none": "no locking", "non_expert": "non-expert tensors mlock'ed"}
    styles = ["o-", "s--", "^-.", "d:"]
    shown = table[table.status != "skipped"]
    series = list(shown.groupby(["model", "readahead"], dropna=False).groups)
    skipped = table[table.status == "skipped"]
    for ax, column, ylabel in (
        (axes[0], "tok_s", "decode speed (tg), tokens/s"),
        (axes[1], "faults_per_token", "major page faults per generated token"),
    ):
        for k, (model, readahead) in enumerate(series):
            t = shown[(shown.model == model) & (shown.readahead == readahead)]
            prefix = ", ".join(
                str(v)
                for v, n in ((model, shown.model.nunique()), (f"readahead {readahead}", shown.readahead.nunique()))
                if n > 1
            )
            prefix = f"{prefix}: " if prefix else ""
            ref = t[t.cap_pct.isna() & (t.status == "ok")]
            if len(ref):
                value = float(ref[column].iloc[0])
                ax.axhline(value, color="tab:gray", ls=styles[k % len(styles)][1:], lw=1, alpha=0.8,
                           label=f"{prefix}no cap ({value:.3g} tok/s)" if column == "tok_s" else None)  # fmt: skip
            capped = t[t.cap_pct.notna()]
            if column == "tok_s" and "tok_s_predicted" in t and t.tok_s_predicted.notna().any():
                p = capped.drop_duplicates("cap_pct").sort_values("cap_pct")
                ax.plot(p.cap_pct, p.tok_s_predicted, "x" + styles[k % len(styles)][1:], color="black", lw=1,
                        label=f"{prefix}predicted (RAM + disk bandwidth)")  # fmt: skip
            for lock in sorted(capped.lock.unique(), key=lambda m: (LOCK_MODES + (m,)).index(m)):
                c = capped[capped.lock == lock].sort_values("cap_pct")
                ok = c[c.status == "ok"]
                ax.plot(ok.cap_pct, ok[column], styles[k % len(styles)], color=colors.get(lock, "tab:green"),
                        label=f"{prefix}{labels.get(lock, lock)}")  # fmt: skip
                for r in c[c.status != "ok"].itertuples():
                    ax.annotate(str(r.status).upper(), (r.cap_pct, 0), xytext=(0, 4 + 10 * k),
                                textcoords="offset points", ha="center", fontsize=8, color="tab:red",
                                xycoords=("data", "axes fraction"))  # fmt: skip
        ax.set_xlabel("RAM cap: % of the model's file bytes, on top of anon peak + slack")
        ax.set_ylabel(ylabel)
        values = pd.to_numeric(shown[column], errors="coerce")
        positive = values[values > 0]
        if column == "tok_s" and len(positive) and positive.max() / positive.min() > 30:
            ax.set_yscale("log")  # speeds under a cap can be orders of magnitude apart
        else:
            ax.set_ylim(bottom=0)
        caps = shown.cap_pct.dropna()
        if len(caps):
            ax.set_xlim(max(caps.max() + 5, 105), min(caps.min() - 5, 0))  # less RAM to the right
        ax.grid(alpha=0.3, which="both")
        if len(skipped):
            ax.text(0.5, 0.5, "skipped: " + str(skipped.error.iloc[0]), transform=ax.transAxes, ha="center",
                    va="center", fontsize=8, wrap=True)  # fmt: skip
    handles, names = axes[0].get_legend_handles_labels()  # the same lines in both panels: one legend
    rows = -(-len(names) // 2)
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8, frameon=False)
    readahead = "; ".join(sorted(set(shown.readahead.dropna())))
    fig.suptitle(f"{title}\nreadahead: {readahead}" if readahead else title, fontsize=10)
    fig.tight_layout(rect=(0, min(0.45, 0.035 * rows + 0.01), 1, 1))
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=130, format="png")
    plt.close(fig)
