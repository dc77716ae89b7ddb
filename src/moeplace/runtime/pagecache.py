"""The page cache and disk readahead: what is cached of a file, evicting it, and read_ahead_kb set and restored."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("moeplace")

PAGE = mmap.PAGESIZE
# Where the kernel describes the block devices (tests point these elsewhere).
SYS_DEV_BLOCK = Path("/sys/dev/block")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


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
