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

import logging
import os
import re
import resource
from collections.abc import Callable
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.config import RamTierSettings
from ..core.errors import MoeplaceError
from ..core.records import LlamaBenchRow
from ..model.gguf_file import GGUFHeader, read_header, shard_paths
from ..model.meta import ModelMeta
from ..model.metadata import tensor_role
from ..runtime.build import Build
from ..runtime.cgroup import MIB, CgroupSite, cgroup_site, memory_cgroup
from ..runtime.llamacpp import require_binary, require_flags
from ..runtime.native import build_native
from ..runtime.pagecache import PAGE, evict_page_cache, readahead_control
from ..runtime.pagelock import ShimReport, merge_ranges, parse_shim, shim_env
from ..runtime.process import Finished, classify, run, sigterm_raises, tail
from ..runtime.provenance import build_facts, host_facts, pipeline_revision
from ..runtime.tool_output import bench_records
from .ram_tier_table import RamTierRecord

log = logging.getLogger("moeplace")

LOCK_MODES = ("none", "non_expert")

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


# ---------------------------------------------------------------------------------------------
# non-expert byte ranges


def tensor_ranges(
    header: GGUFHeader, wanted: Callable[[str], bool], page: int = PAGE
) -> list[tuple[Path, list[tuple[int, int]]]]:
    """Per model file (all shards): the page-rounded, merged file ranges holding the wanted tensors' data."""
    spans: list[list[tuple[int, int]]] = [[] for _ in header.paths]
    for t in header.tensors:
        if wanted(t.name):
            _, offset, n_bytes = header.file_range(t)
            spans[t.shard].append((offset, n_bytes))
    files = zip(header.paths, spans, header.file_sizes)
    return [(Path(path), merge_ranges(found, page, limit=size)) for path, found, size in files]


def is_expert_tensor(name: str) -> bool:
    m = _LAYER.match(name)
    return m is not None and tensor_role(m[2]) == "expert"


def non_expert_ranges(model_path: str | Path, page: int = PAGE) -> list[tuple[Path, list[tuple[int, int]]]]:
    """Per model file (all shards): the page-rounded, merged file ranges holding non-expert tensor data."""
    return tensor_ranges(read_header(model_path), lambda name: not is_expert_tensor(name), page)


# ---------------------------------------------------------------------------------------------
# one run


# Decode only, once, no warmup (the G1 and G2 runs load alike), on the CPU, weights left in the file mapping.
_BENCH_ARGS = "-p 0 -r 1 --no-warmup -ngl 0 --repack 0 -lm mmap -o jsonl".split()


def ram_tier_command(manifest: Build, model: str, gen: int, threads: int) -> list[str]:
    return [str(require_binary(manifest, "llama-bench")), "-m", model, "-n", str(gen), "-t", str(threads), *_BENCH_ARGS]


@dataclass
class CappedRun:
    """One llama-bench run, and what its memory cgroup saw (None/0 without one)."""

    result: Finished
    cgroup_peak_bytes: int | None
    oom_kills: int


def _raise_memlock() -> None:
    """In the child: as much lockable memory as we may (the pagelock shim mlocks the non-expert ranges)."""
    limit = resource.RLIM_INFINITY if os.geteuid() == 0 else resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    with suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))


def run_capped(
    cmd: list[str], env: dict[str, str], limit_bytes: int | None, timeout_s: float, site: CgroupSite | None = None
) -> CappedRun:
    """Run `cmd` as a fresh process, in its own memory cgroup under `site` limited to `limit_bytes` (None:
    unlimited), with the cgroup's peak charge and OOM kills. Without a site it runs in no cgroup of ours,
    which only an uncapped run can."""
    if site is None and limit_bytes is not None:
        raise MoeplaceError("a memory cap needs a memory cgroup")
    with memory_cgroup(site, limit_bytes) if site else nullcontext() as cg:

        def setup() -> None:
            if cg is not None:
                cg.join()
            _raise_memlock()

        result = run(cmd, env=env, timeout_s=timeout_s, before_exec=setup)
        return CappedRun(result, cg.peak_bytes() if cg else None, cg.oom_kills() if cg else 0)


def _tg_result(stdout: str) -> LlamaBenchRow | None:
    return next((r for r in bench_records(stdout) if r.get("n_gen")), None)


def classify_run(run: CappedRun, capped: bool) -> tuple[str, str]:
    """('ok', '') or (oom/crash/timeout/error, why): the common classifier, and a run must print its tg result."""
    status, reason = classify(run.result, run.oom_kills, capped)
    if status == "ok" and _tg_result(run.result.stdout) is None:
        return "error", "llama-bench printed no tg result"
    return status, reason


# ---------------------------------------------------------------------------------------------
# the sweep


def _measure(tier: _Tier, env: dict[str, str], cap_bytes: int | None, expect_locked: int) -> RamTierRecord:
    """Both generation lengths, each evicted and fresh; the derived row fields."""
    runs: list[CappedRun] = []
    evicts: list[tuple[str, int]] = []
    status, error = "ok", ""
    shim: ShimReport | None = None
    for g in tier.settings.gen:
        evicts.append(evict_page_cache(tier.files))
        if cap_bytes is not None and evicts[-1][1] > 0.05 * tier.model_bytes:
            status = "error"
            error = (
                f"{evicts[-1][1] / MIB:.1f} MiB of the model stayed in the page cache after eviction (tmpfs? "
                "mapped by another process?); those pages escape the cap, so the run would not be capped"
            )
            break
        runs.append(_logged_run(tier, g, env, cap_bytes))
        status, error, shim = _checked(runs[-1], cap_bytes is not None, expect_locked)
        if status != "ok":
            break
    return _derived(tier.settings.gen, runs, evicts, status, error, shim["locked_bytes"] if shim else None)


def _logged_run(tier: _Tier, gen: int, env: dict[str, str], cap_bytes: int | None) -> CappedRun:
    """One llama-bench run generating `gen` tokens under the cap (None: uncapped), its stderr in the stage's log."""
    cmd = tier.command(gen)
    log.info("$ %s  (cap %s)", " ".join(cmd), "none" if cap_bytes is None else f"{cap_bytes} bytes")
    run = run_capped(cmd, env, cap_bytes, tier.settings.timeout_s, tier.site)
    with tier.log_path.open("a") as f:
        f.write(f"$ {' '.join(cmd)}  # cap {cap_bytes}\n{run.result.stderr}\n")
    return run


def _checked(run: CappedRun, capped: bool, expect_locked: int) -> tuple[str, str, ShimReport]:
    """(status, why, what the pagelock shim reported): classify_run's verdict, then the shim must have seen the
    model mapped and locked exactly `expect_locked` bytes; a failure's reason ends in the stderr's tail."""
    stderr = run.result.stderr
    status, error = classify_run(run, capped)
    shim = parse_shim(stderr)
    if status == "ok" and shim["mapped"] == 0:
        status, error = "error", "the pagelock shim never saw the model file mapped (was it loaded with mmap?)"
    if status == "ok" and (shim["locked_bytes"] != expect_locked or shim["problems"]):
        status = "error"
        error = f"locked {shim['locked_bytes']} of {expect_locked} bytes: " + " | ".join(shim["problems"])
    if status != "ok":
        error = f"{error}: {tail(stderr)}" if stderr.strip() else error
    return status, error, shim


def _derived(
    gen: tuple[int, int],
    runs: list[CappedRun],
    evicts: list[tuple[str, int]],
    status: str,
    error: str,
    locked_bytes: int | None,
) -> RamTierRecord:
    """The row fields of a pair of runs: what each saw, and where both ran, faults per token and the speeds."""
    peaks = [r.cgroup_peak_bytes for r in runs if r.cgroup_peak_bytes is not None]
    row: RamTierRecord = {
        "status": status,
        "error": error,
        "evict": evicts[-1][0] if evicts else None,
        "evict_left_bytes": max((e[1] for e in evicts), default=None),
        "majflt": [r.result.majflt for r in runs],
        "wall_s": [round(r.result.wall_s, 3) for r in runs],
        "anon_peak_bytes": max((r.result.anon_peak_bytes for r in runs), default=None),
        "cgroup_peak_bytes": max(peaks, default=None),
        "oom_kills": sum(r.oom_kills for r in runs),
        "locked_bytes": locked_bytes,
        "faults_per_token": None,
        "tok_s": None,
        "tok_s_marginal": None,
    }
    if status == "ok":
        (g1, g2), (short, long_) = gen, (r.result for r in runs)
        result = _tg_result(long_.stdout)
        assert long_.majflt is not None and short.majflt is not None and result is not None  # both ran: status ok
        row["faults_per_token"] = (long_.majflt - short.majflt) / (g2 - g1)
        row["tok_s"] = float(result["avg_ts"])
        if long_.wall_s > short.wall_s:  # else too noisy to say
            row["tok_s_marginal"] = (g2 - g1) / (long_.wall_s - short.wall_s)
    return row


def run_ram_tier(
    *,
    model_name: str,
    model_path: str,
    meta: ModelMeta,
    manifest: Build,
    settings: RamTierSettings,
    log_path: Path,
    workdir: Path,
) -> list[RamTierRecord]:
    """An uncapped reference run, then every cap (percent of the model's file bytes) x lock mode.

    One record per row, failed ones included (status oom/crash/timeout/error and the stderr tail).
    Where no memory cgroup can be made, the capped rows have status 'skipped' and the reason; where
    the reference fails, a single 'error' row (cap_pct and lock None) stands for all of them.
    """
    g1, g2 = settings.gen
    if not 0 < g1 < g2:
        raise MoeplaceError(f"ram tier: the generation lengths must be 0 < G1 < G2, got {settings.gen}.")
    unknown = [m for m in settings.lock_modes if m not in LOCK_MODES]
    if unknown:
        raise MoeplaceError(f"ram tier: unknown lock mode(s) {unknown}; use {list(LOCK_MODES)}.")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    files = [f.path for f in meta.files] or [str(p) for p in shard_paths(Path(model_path))]
    site = cgroup_site()
    skip, cgroup = (site, None) if isinstance(site, str) else (None, site)
    if skip:
        log.warning("RAM tier: only the uncapped reference runs, the caps are skipped: %s", skip)
    require_flags(manifest, ("--repack", "--load-mode", "--no-warmup"), "the RAM tier (weights left in the mmap)")
    with sigterm_raises(), readahead_control(files, settings.readahead_kb) as ra:
        shim = build_native("pagelock", log_path, shared=True)
        tier = _Tier(
            model_name, model_path, manifest, settings, files, cgroup, shim, non_expert_ranges(model_path), log_path, ra
        )
        tier.common = _common(tier, meta, workdir)
        return _rows(tier, skip)


@dataclass
class _Tier:
    """One model's RAM-tier runs: its files, the cgroup site, the pagelock shim and the non-expert ranges it
    can lock, the readahead in force, and what every record shares."""

    model_name: str
    model_path: str
    manifest: Build
    settings: RamTierSettings
    files: list[str]
    site: CgroupSite | None
    shim: Path
    targets: list[tuple[Path, list[tuple[int, int]]]]
    log_path: Path
    readahead: Any
    common: RamTierRecord = field(default_factory=RamTierRecord)
    model_bytes: int = 0  # the model's files
    locked_bytes: int = 0  # what locking the non-expert ranges holds

    def __post_init__(self) -> None:
        self.model_bytes = sum(os.path.getsize(f) for f in self.files)
        self.locked_bytes = sum(n for _, ranges in self.targets for _, n in ranges)

    def command(self, gen: int) -> list[str]:
        return ram_tier_command(self.manifest, self.model_path, gen, self.settings.threads)

    def measure(self, cap_pct: int | None, lock: str, cap: RamTierRecord) -> RamTierRecord:
        """One row: both generation lengths under this cap (none: uncapped) and lock mode."""
        locking = lock == "non_expert"
        lock_targets = self.targets if locking else [(path, []) for path, _ in self.targets]
        preload = " ".join(filter(None, [str(self.shim), os.environ.get("LD_PRELOAD", "")]))
        env = {**os.environ, "LD_PRELOAD": preload, **shim_env(lock_targets, self.readahead.madvise)}
        row = _measure(self, env, cap.get("cap_bytes"), self.locked_bytes if locking else 0)
        record: RamTierRecord = {**self.common, "cap_pct": cap_pct, "lock": lock, **row, **cap}
        record["lock_expected_bytes"] = self.locked_bytes if locking else 0
        shown = "none" if cap_pct is None else f"{cap_pct}%"
        log.info(
            "ram tier %s cap %s lock %s: %s, %s tok/s (%s marginal), %s faults/token",
            self.model_name,
            shown,
            lock,
            record["status"],
            record["tok_s"],
            record["tok_s_marginal"],
            record["faults_per_token"],
        )
        return record


def _common(tier: _Tier, meta: ModelMeta, workdir: Path) -> RamTierRecord:
    """What every record of a model's RAM-tier runs carries."""
    ra, site = tier.readahead, tier.site
    return {
        "model": tier.model_name,
        "model_bytes": tier.model_bytes,
        "non_expert_bytes": meta.non_expert_bytes,
        "expert_bytes": meta.expert_bytes,
        "gen": list(tier.settings.gen),
        "threads": tier.settings.threads,
        "load_mode": "mmap",
        "repack": False,
        "slack_bytes": tier.settings.slack_bytes,
        **build_facts(tier.manifest),
        "model_files": meta.file_records(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **host_facts(),
        **pipeline_revision(workdir),
        "readahead": ra.description,
        "readahead_kb": ra.kib,
        "readahead_effective_kib": ra.effective_kib,
        "readahead_note": ra.note,
        "madvise": ra.madvise,
        "cgroup": f"cgroup v{site.version} under {site.path}" if site else None,
        "command": tier.command(tier.settings.gen[1]),
    }


def _rows(tier: _Tier, skip: str | None) -> list[RamTierRecord]:
    """The uncapped reference, then each cap x lock mode, sized from what the reference used."""
    settings, model_bytes = tier.settings, tier.model_bytes
    ref = tier.measure(None, "none", {})
    anon, other, charged = ref["anon_peak_bytes"], None, ref["cgroup_peak_bytes"]
    if ref["status"] == "ok" and charged and anon is not None:
        # Charged to the uncapped run besides its anonymous memory and the (fully mapped) model.
        other = max(0, charged - anon - model_bytes)
    ref["other_charged_bytes"] = other
    records = [ref]
    if ref["status"] != "ok":
        caps = ", ".join(f"{p}%" for p in settings.caps_pct)
        why = f"the uncapped reference run failed ({ref['status']}), so no cap ({caps}) could be sized or run"
        return [*records, tier.common | {"cap_pct": None, "lock": None, "status": "error", "error": why}]
    assert anon is not None  # an ok run's peak
    for pct in settings.caps_pct:
        for lock in settings.lock_modes:
            if skip:
                records.append(tier.common | {"cap_pct": pct, "lock": lock, "status": "skipped", "error": skip})
                continue
            share = round(pct / 100 * model_bytes)
            cap = anon + settings.slack_bytes + share
            cap_parts: RamTierRecord = {
                "cap_bytes": cap,
                "cap_model_bytes": share,
                # What the model's pages can really have: the cap less what the reference run charged besides.
                "model_room_pct": None if other is None else 100 * (cap - anon - other) / model_bytes,
                "anon_peak_bytes": anon,  # the reference's, which sized the cap
                "other_charged_bytes": other,
            }
            records.append(tier.measure(pct, lock, cap_parts))
    return records
