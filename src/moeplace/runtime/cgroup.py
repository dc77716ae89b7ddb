"""Memory cgroups made per run (v1 memory.limit_in_bytes or v2 memory.max) under our own, removed after.

cgroup_site() finds our memory cgroup and checks that a capped child can be made; where it cannot
(not root, cgroup v2 without a delegated memory controller) it says why in one line.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import MoeplaceError

log = logging.getLogger("moeplace")

MIB = 2**20
# Where the kernel describes this process (tests point it elsewhere).
PROC_SELF = Path("/proc/self")
CGROUP_PREFIX = "moeplace-ramtier-"


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

    def join(self) -> None:
        """In a child before exec: move this process into the cgroup (it fails rather than run uncapped)."""
        try:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as e:
            os.write(2, f"moeplace: cannot join the memory cgroup {self.path}: {e.strerror}\n".encode())
            raise

    def oom_kills(self) -> int:
        """How many processes the OOM killer ended in this cgroup. A count that cannot be read is an error,
        not 0: a 0 would turn an out-of-memory kill into a crash."""
        # v2: memory.events.local counts the same kills as memory.events here (our cgroups have no children).
        sources = ("memory.oom_control",) if self.version == 1 else ("memory.events", "memory.events.local")
        failures = []
        for name in sources:
            try:
                text = (self.path / name).read_text()
            except OSError as e:
                failures.append(f"{name}: {e.strerror}")
                continue
            if m := re.search(r"^oom_kill (\d+)$", text, re.MULTILINE):
                return int(m[1])
            failures.append(f"{name}: no oom_kill line")
        raise MoeplaceError(
            f"cannot read the OOM kill count of the memory cgroup {self.path} ({'; '.join(failures)}), so an "
            "out-of-memory kill cannot be told from a crash (the count needs Linux 4.13 or newer)."
        )

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
