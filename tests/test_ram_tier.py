"""The RAM tier: ranges, the pagelock shim, memory cgroups, readahead control, and a real capped sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

from moeplace.core.config import RamTierSettings
from moeplace.core.errors import MoeplaceError
from moeplace.measure import ram_tier
from moeplace.measure.ram_tier import (
    classify_run,
    non_expert_ranges,
    run_capped,
    run_ram_tier,
)
from moeplace.measure.ram_tier_table import TABLE_COLUMNS, predicted_column, ram_tier_table
from moeplace.model.metadata import inspect_model
from moeplace.report.figures.ram_tier import ram_tier_figure
from moeplace.runtime import cgroup, pagecache
from moeplace.runtime.cgroup import cgroup_support
from moeplace.runtime.native import build_native
from moeplace.runtime.pagecache import PAGE, cached_bytes, readahead_control
from moeplace.runtime.pagelock import merge_ranges, parse_shim, shim_env

CGROUPS = cgroup_support()
needs_cgroups = pytest.mark.skipif(CGROUPS is not None, reason=f"no usable memory cgroup: {CGROUPS}")
needs_cc = pytest.mark.skipif(not shutil.which("cc"), reason="no C compiler for the pagelock shim")


def our_cgroups() -> list[Path]:
    site = cgroup.cgroup_site()
    assert not isinstance(site, str)
    return sorted(site.path.glob(f"{cgroup.CGROUP_PREFIX}{os.getpid()}-*"))


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    from llamacpp_helpers import tiny_twin

    return tiny_twin(tmp_path_factory.mktemp("twin"))


def sweep(tmp_path: Path, model: Path, **kw) -> list[dict]:
    from llamacpp_helpers import manifest

    args = dict(caps_pct=(50,), readahead_kb=128, lock_modes=("none", "non_expert"), gen=(8, 24), timeout_s=120)
    return run_ram_tier(
        model_name="tiny",
        model_path=str(model),
        meta=inspect_model(model),
        manifest=manifest(),
        settings=RamTierSettings(**{"slack_bytes": 4 * 2**20, "threads": 2, **args, **kw}),
        log_path=tmp_path / "ram_tier.log",
        workdir=ROOT,
    )


# --- ranges -----------------------------------------------------------------------------------


def test_merge_ranges_rounds_to_pages_and_merges_overlaps_and_neighbours():
    spans = [(5000, 100), (0, 1), (4096, 10), (3 * 4096 + 1, 4096), (10 * 4096, 0)]
    assert merge_ranges(spans, page=4096) == [(0, 2 * 4096), (3 * 4096, 2 * 4096)]
    # Exactly touching spans merge; a gap does not.
    assert merge_ranges([(0, 10), (10, 5), (20, 5)], page=1) == [(0, 15), (20, 5)]
    # Clipped to the (page-rounded) end of the file.
    assert merge_ranges([(8000, 10_000)], page=4096, limit=9000) == [(4096, 2 * 4096)]


def test_non_expert_ranges_hold_every_non_expert_byte_and_no_expert_page(small_moe):
    meta = inspect_model(small_moe)
    ((path, exact),) = non_expert_ranges(small_moe, page=1)
    assert path == small_moe
    assert sum(n for _, n in exact) == meta.non_expert_bytes
    from gguf import GGUFReader

    experts = [
        (int(t.data_offset), int(t.n_bytes)) for t in GGUFReader(small_moe).tensors if ram_tier.is_expert_tensor(t.name)
    ]
    assert len(experts) == 2 * 3
    (_, paged), *_ = non_expert_ranges(small_moe)
    for off, n in paged:
        assert off % PAGE == 0 and n % PAGE == 0
        for e_off, e_n in experts:  # only pages shared with a neighbour at a tensor's edge
            inner_lo, inner_hi = -(-e_off // PAGE) * PAGE, (e_off + e_n) // PAGE * PAGE
            assert off + n <= inner_lo or off >= inner_hi


def test_shim_variables_and_its_report_line():
    env = shim_env([(Path("/m/a.gguf"), [(0, 4096), (8192, 4096)]), (Path("/m/b.gguf"), [])], "random")
    assert env == {
        "MOEPLACE_MADVISE": "random",
        "MOEPLACE_PAGELOCK_FILE": "/m/a.gguf",
        "MOEPLACE_PAGELOCK_RANGES": "0:4096,8192:4096",
        "MOEPLACE_PAGELOCK_FILE_1": "/m/b.gguf",
        "MOEPLACE_PAGELOCK_RANGES_1": "",
    }
    stderr = (
        "load...\npagelock: locked 8192 bytes in 2 ranges (madvise=random) of /m/a.gguf\n"
        "pagelock: mlock of 4096 bytes at file offset 0 of /m/b.gguf failed: Cannot allocate memory\n"
        "pagelock: locked 0 bytes in 0 ranges (madvise=random) of /m/b.gguf\n"
    )
    shim = parse_shim(stderr)
    assert shim["mapped"] == 2 and shim["locked_bytes"] == 8192
    assert shim["problems"] == [
        "pagelock: mlock of 4096 bytes at file offset 0 of /m/b.gguf failed: Cannot allocate memory"
    ]


@needs_cc
def test_the_shim_locks_only_the_given_ranges_of_the_model_file_inside_each_mapping(tmp_path):
    shim = build_native("pagelock", tmp_path / "build.log", shared=True)
    model = tmp_path / "model.bin"
    model.write_bytes(os.urandom(64 * PAGE))
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(8 * PAGE))
    script = (
        "import mmap\n"
        "maps = []\n"
        "for p, length, offset in [(%r, 0, 0), (%r, 0, 0), (%r, 4 * mmap.PAGESIZE, 8 * mmap.PAGESIZE)]:\n"
        "    f = open(p, 'rb')\n"
        "    maps.append(mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset))\n"
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmLck')][0])\n"
    ) % (str(other), str(model), str(model))
    # merge_ranges makes them whole pages, sorted, merged: (PAGE, PAGE), (10 PAGE, 3 PAGE), (63 PAGE, 10 PAGE).
    ranges = merge_ranges([(PAGE + 1, 10), (PAGE, PAGE), (10 * PAGE, 3 * PAGE), (63 * PAGE, 10 * PAGE)])
    env = {**os.environ, "LD_PRELOAD": str(shim), **shim_env([(model, ranges)], "random")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    # The whole file: the last range clipped to its end; pages 8-11: only pages 10 and 11.
    assert f"pagelock: locked {5 * PAGE} bytes in 3 ranges (madvise=random) of {model}" in out.stderr
    assert f"pagelock: locked {2 * PAGE} bytes in 1 ranges (madvise=random) of {model}" in out.stderr
    assert out.stderr.count("pagelock: locked") == 2  # the other file is not touched
    assert int(out.stdout) * 1024 == 7 * PAGE
    env["MOEPLACE_PAGELOCK_RANGES"] = "12:x"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert "MOEPLACE_PAGELOCK_RANGES is malformed" in out.stderr
    assert "pagelock: locked 0 bytes in 0 ranges (madvise=random)" in out.stderr


# --- table and figure -------------------------------------------------------------------------


def synthetic_records() -> list[dict]:
    base = {"model": "m", "readahead": "128 KiB (device vda)", "readahead_effective_kib": 256, "error": ""}
    return [  # in run_ram_tier's order
        {**base, "cap_pct": None, "cap_bytes": None, "lock": "none", "tok_s": 25.0, "tok_s_marginal": 26.0,
         "faults_per_token": 0.0, "locked_bytes": 0, "status": "ok"},
        {**base, "cap_pct": 50, "cap_bytes": 2_500_000_000, "model_room_pct": 45.0, "lock": "none", "tok_s": 10.0,
         "tok_s_marginal": 11.0, "faults_per_token": 300.0, "locked_bytes": 0, "status": "ok"},
        {**base, "cap_pct": 50, "cap_bytes": 2_500_000_000, "model_room_pct": 45.0, "lock": "non_expert",
         "tok_s": 12.5, "faults_per_token": 120.0, "locked_bytes": 300_000_000, "status": "ok"},
        {**base, "cap_pct": 25, "cap_bytes": 1_250_000_000, "lock": "none", "tok_s": 3.0,
         "faults_per_token": 900.0, "locked_bytes": 0, "status": "ok"},
        {**base, "cap_pct": 25, "cap_bytes": 1_250_000_000, "lock": "non_expert", "tok_s": None,
         "faults_per_token": None, "locked_bytes": None, "status": "oom", "error": "killed"},
    ]  # fmt: skip


def test_table_has_one_row_per_record_in_order():
    table = ram_tier_table(synthetic_records())
    assert list(table.columns) == TABLE_COLUMNS
    assert table.cap_pct.isna().tolist() == [True, False, False, False, False]
    assert table.cap_pct.tolist()[1:] == [50, 50, 25, 25]
    assert table.lock.tolist() == ["none", "none", "non_expert", "none", "non_expert"]
    row = table[(table.cap_pct == 50) & (table.lock == "non_expert")].iloc[0]
    assert row.cap_gb == pytest.approx(2.5) and row.locked_mb == pytest.approx(300) and row.tok_s == 12.5
    assert row.model_room_pct == 45.0 and pd.isna(row.tok_s_marginal)
    assert table.tok_s_marginal.tolist()[:2] == [26.0, 11.0]
    assert (table.readahead_effective_kib == 256).all()
    assert table[table.status == "oom"].tok_s.isna().all()


def test_the_predicted_column_pages_the_missing_experts_from_disk(small_moe):
    meta = inspect_model(small_moe)
    table = predicted_column(ram_tier_table(synthetic_records()), meta, 10.0, 0.1)
    by_cap = table.groupby(table.cap_pct.fillna(100)).tok_s_predicted.first()
    assert by_cap[100] > by_cap[50] > by_cap[25] > 0
    assert predicted_column(ram_tier_table(synthetic_records()), meta, None, None).tok_s_predicted.isna().all()
    no_disk = predicted_column(ram_tier_table(synthetic_records()), meta, 10.0, None)
    assert no_disk.tok_s_predicted.notna().tolist() == [True, False, False, False, False]  # only uncapped


def test_the_prediction_uses_the_room_the_cap_really_left_for_the_model(small_moe):
    meta = inspect_model(small_moe)
    records = [{**r, "model_room_pct": None} for r in synthetic_records()]
    by_cap = predicted_column(ram_tier_table(records), meta, 10.0, 0.1).tok_s_predicted
    roomy = [{**r, "model_room_pct": 25.0 if r["cap_pct"] == 50 else r["model_room_pct"]} for r in records]
    by_room = predicted_column(ram_tier_table(roomy), meta, 10.0, 0.1).tok_s_predicted
    assert by_room[1] == by_room[2] == by_cap[3] < by_cap[1]


def test_figure_is_written(tmp_path):
    out = tmp_path / "ram_tier.png"
    ram_tier_figure(ram_tier_table(synthetic_records()), out, "m: decode under a RAM cap")
    assert out.stat().st_size > 10_000


# --- cgroups, skipping ------------------------------------------------------------------------


def fake_proc(tmp_path: Path, cgroup: str, mounts: list[str]) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(
        "".join(f"{30 + i} 1 0:{30 + i} {line}\n" for i, line in enumerate(["/ /proc rw - proc proc rw", *mounts]))
    )
    return proc


def v2_tree(tmp_path: Path, controllers: str, subtree: str) -> Path:
    leaf = tmp_path / "unified" / "job.scope"
    leaf.mkdir(parents=True)
    (leaf / "cgroup.controllers").write_text(controllers + "\n")
    (leaf / "cgroup.subtree_control").write_text(subtree + "\n")
    return leaf


@pytest.mark.parametrize(
    ("membership", "v2", "expected"),
    [
        ("", None, "no memory cgroup"),
        ("4:memory:/job\n0::/\n", None, "no mount of the memory hierarchy"),
        ("0::/job.scope\n", ("cpu io", ""), "not available in"),
        ("0::/job.scope\n", ("cpu io memory", "cpu"), "not enabled for children"),
    ],
)
def test_unusable_cgroups_give_a_reason_saying_what_to_do(tmp_path, monkeypatch, membership, v2, expected):
    mounts = []
    if v2:
        v2_tree(tmp_path, *v2)
        mounts.append(f"/ {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw")
    monkeypatch.setattr(cgroup, "PROC_SELF", fake_proc(tmp_path, membership, mounts))
    reason = cgroup_support()
    assert reason and expected in reason
    assert "\n" not in reason


def test_a_delegated_v2_cgroup_is_usable(tmp_path, monkeypatch):
    leaf = v2_tree(tmp_path, "cpu memory", "memory")
    proc = fake_proc(tmp_path, "0::/job.scope\n", [f"/ {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw"])
    monkeypatch.setattr(cgroup, "PROC_SELF", proc)
    assert cgroup.cgroup_site() == cgroup.CgroupSite(2, leaf)
    assert [p.name.split("-")[2] for p in leaf.glob("moeplace-*")] == ["probe"]  # (a real cgroupfs removes it)


@pytest.mark.llamacpp
def test_without_cgroups_the_uncapped_reference_still_runs_and_the_caps_are_skipped(tmp_path, monkeypatch, twin):
    monkeypatch.setattr(ram_tier, "cgroup_site", lambda: "no memory cgroup: test")
    records = sweep(tmp_path, twin, caps_pct=(50, 25), lock_modes=("none", "non_expert"))
    assert [(r["cap_pct"], r["lock"], r["status"]) for r in records] == [
        (None, "none", "ok"),
        (50, "none", "skipped"),
        (50, "non_expert", "skipped"),
        (25, "none", "skipped"),
        (25, "non_expert", "skipped"),
    ], [r["error"] for r in records]
    ref = records[0]
    assert ref["tok_s"] > 0 and ref["anon_peak_bytes"] > 0 and ref["cgroup"] is None
    assert ref["cgroup_peak_bytes"] is None and ref["other_charged_bytes"] is None
    assert all(r["error"] == "no memory cgroup: test" for r in records[1:])
    table = ram_tier_table(records)
    assert table.status.tolist() == ["ok"] + ["skipped"] * 4
    ram_tier_figure(table, tmp_path / "skipped.png", "skipped")


@pytest.mark.llamacpp
def test_a_failed_reference_gives_one_error_row_for_all_the_caps(tmp_path, twin):
    records = sweep(tmp_path, twin, caps_pct=(50, 25), timeout_s=0.01)
    assert [(r["cap_pct"], r["lock"], r["status"]) for r in records] == [
        (None, "none", "timeout"),
        (None, None, "error"),
    ]
    assert records[1]["error"].startswith("the uncapped reference run failed")
    ram_tier_figure(ram_tier_table(records), tmp_path / "failed.png", "failed")


@needs_cgroups
def test_a_capped_run_is_oom_killed_and_a_hanging_one_times_out_and_the_cgroups_go(tmp_path):
    site = cgroup.cgroup_site()
    hog = [sys.executable, "-c", "import time; x = bytearray(b'x' * 400 * 2**20); time.sleep(0.2)"]
    run = run_capped(hog, dict(os.environ), 64 * 2**20, timeout_s=60, site=site)
    assert classify_run(run, capped=True)[0] == "oom"
    assert run.cgroup_peak_bytes is None or run.cgroup_peak_bytes <= 64 * 2**20
    run = run_capped(hog, dict(os.environ), None, timeout_s=60, site=site)
    assert run.result.returncode == 0 and run.result.anon_peak_bytes > 400 * 2**20
    assert run.cgroup_peak_bytes > 400 * 2**20
    run = run_capped(["sleep", "30"], dict(os.environ), None, timeout_s=0.5, site=site)
    assert classify_run(run, capped=False)[0] == "timeout" and run.result.wall_s < 10
    assert our_cgroups() == []


def test_an_uncapped_run_needs_no_cgroup(tmp_path):
    hog = [sys.executable, "-c", "import time; x = bytearray(b'x' * 100 * 2**20); time.sleep(0.2)"]
    run = run_capped(hog, dict(os.environ), None, timeout_s=60)
    assert classify_run(run, capped=False) == ("error", "llama-bench printed no tg result")  # but it ran
    assert run.result.returncode == 0 and run.result.anon_peak_bytes > 100 * 2**20
    assert run.cgroup_peak_bytes is None and run.oom_kills == 0 and run.result.majflt is not None
    with pytest.raises(MoeplaceError, match="needs a memory cgroup"):
        run_capped(hog, dict(os.environ), 64 * 2**20, timeout_s=60)


def test_cached_bytes_counts_the_resident_pages(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(os.urandom(3 * PAGE + 1))
    empty = tmp_path / "empty"
    empty.touch()
    assert cached_bytes([f, empty]) == 4 * PAGE  # just written, so all in the page cache


def test_readahead_is_set_and_always_restored(tmp_path, monkeypatch):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"x")
    st = os.stat(model)
    disk = tmp_path / "devices" / "vdq"
    (disk / "queue").mkdir(parents=True)
    (disk / "queue" / "read_ahead_kb").write_text("8192\n")
    part = disk / "vdq1"
    part.mkdir()
    (part / "partition").write_text("1\n")
    block = tmp_path / "dev-block"
    block.mkdir()
    (block / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}").symlink_to(part)
    monkeypatch.setattr(pagecache, "SYS_DEV_BLOCK", block)
    ra_file = disk / "queue" / "read_ahead_kb"
    with readahead_control([model], 128) as ra:
        assert (ra.description, ra.kib, ra.effective_kib, ra.madvise) == ("128 KiB (device vdq)", 128, 256, "none")
        assert ra_file.read_text() == "128"
    assert ra_file.read_text() == "8192"
    with pytest.raises(RuntimeError), readahead_control([model], 256):
        assert ra_file.read_text() == "256"
        raise RuntimeError("a failed sweep")
    assert ra_file.read_text() == "8192"
    with readahead_control([model], None) as ra:
        assert ra.description == "device default 8192 KiB (device vdq)" and ra.madvise == "none"
        assert ra.effective_kib == 2 * 8192  # llama.cpp's posix_fadvise(SEQUENTIAL) doubles it
    monkeypatch.setattr(pagecache, "SYS_DEV_BLOCK", tmp_path / "nowhere")
    with readahead_control([model], 128) as ra:
        assert (ra.description, ra.madvise, ra.effective_kib) == ("madvise random", "random", 0)
        assert ra.note.startswith("read_ahead_kb not settable") and "not a block device" in ra.note


# --- a real capped sweep ----------------------------------------------------------------------


@pytest.mark.llamacpp
@needs_cgroups
def test_a_capped_sweep_on_the_tiny_twin(tmp_path, twin):
    meta = inspect_model(twin)
    device = pagecache.block_device(twin)
    before = device.read_ahead.read_text() if isinstance(device, pagecache.BlockDevice) else None
    # The tiny model is 33 MB: a slack of 32 MiB would leave it uncapped (the default is 4 MiB; said here).
    records = sweep(tmp_path, twin, slack_bytes=4 * 2**20)
    assert [(r["cap_pct"], r["lock"]) for r in records] == [(None, "none"), (50, "none"), (50, "non_expert")]
    assert all(r["status"] in ("ok", "oom") for r in records), [r["error"] for r in records]
    ref, *capped = records
    # a cap of half the model leaves room to decode, paging: a sweep where every capped run died measured nothing
    assert any(r["status"] == "ok" for r in capped), [r["error"] for r in capped]
    assert ref["status"] == "ok" and ref["tok_s"] > 0 and abs(ref["faults_per_token"]) < 1
    assert ref["anon_peak_bytes"] > 0 and ref["evict_left_bytes"] == 0 and ref["other_charged_bytes"] >= 0
    assert ref["readahead"].startswith("128 KiB (device ") or ref["readahead"] == "madvise random"
    non_expert = sum(n for _, ranges in non_expert_ranges(twin) for _, n in ranges)
    assert meta.non_expert_bytes <= non_expert < meta.non_expert_bytes + 2 * PAGE * (4 + 4 * meta.n_layer)
    for r in capped:
        assert r["cap_bytes"] == ref["anon_peak_bytes"] + 4 * 2**20 + round(0.5 * r["model_bytes"])
        assert r["anon_peak_bytes"] == ref["anon_peak_bytes"]
        assert r["model_room_pct"] == pytest.approx(
            100 * (r["cap_bytes"] - ref["anon_peak_bytes"] - ref["other_charged_bytes"]) / r["model_bytes"]
        )
        assert r["model_room_pct"] <= 50 + 100 * 4 * 2**20 / r["model_bytes"]
        if r["status"] == "ok":
            # It paged beyond the reference's one fault-in of the model. Per token (24 tokens' faults less 8's) the
            # tiny twin's paging is a few faults and can come out below 0 (-0.31 in one CI run), so not asserted.
            assert r["majflt"][-1] > ref["majflt"][-1] and r["tok_s"] > 0, (r["majflt"], ref["majflt"])
            assert r["locked_bytes"] == (non_expert if r["lock"] == "non_expert" else 0)
            assert r["cgroup_peak_bytes"] <= r["cap_bytes"]
    if isinstance(device, pagecache.BlockDevice):
        assert device.read_ahead.read_text() == before
    assert our_cgroups() == []
    table = ram_tier_table(records)
    assert len(table) == 3 and table.model_room_pct.notna().tolist() == [False, True, True]
    ram_tier_figure(table, tmp_path / "ram_tier.png", "tiny-qwen3moe under a RAM cap")
