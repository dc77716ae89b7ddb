"""A Snakemake run killed with SIGKILL mid-sweep resumes with nothing lost and nothing redone."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from llamacpp_helpers import rpc_servers
from workflow_helpers import SNAKEMAKE, snakemake, workflow_copy

pytestmark = pytest.mark.llamacpp
CFG = {
    **yaml.safe_load((ROOT / "config/config.yaml").read_text()),
    "models": {"tiny-qwen3moe": {"twin": "config/models/tiny-qwen3moe.yaml"}},
    "ceilings": {"enabled": False},  # test_workflow_ceilings_routing_ram_quants measures them; the sweep matters here
    "contexts": [1024, 2048],  # one bench job each: all its n values in one, seconds long
    "bench": {"prompt": 64, "gen": 8, "repetitions": 2, "n_cpu_moe": [0, 4, 8]},
}
TARGETS = [f"results/figures/ncmoe_{k}k.png" for k in (1, 2)]
# What differs between two runs of the same configuration: speeds, their spread, and the machine around them.
TIMING = ["median_ts", "ci95_low_ts", "ci95_high_ts", "avg_ts", "stddev_ts", "outlying", "cv", "ci95_halfwidth_pct",
          "noisy", "contended", "others_running", "started", "load_avg_1m", "error"]  # fmt: skip


def stable(path) -> pd.DataFrame:
    return pd.read_csv(path).drop(columns=TIMING).sort_values(["n_cpu_moe", "test"], ignore_index=True)


@pytest.mark.long
@pytest.mark.fault(
    fault="Snakemake itself is killed",
    injected="SIGKILL to snakemake a moment after a job finished",
    sees="the next plain run starts (stale locks cleared) and redoes only what was missing",
    kept="every finished job; no partial file; tables equal a clean run",
)
def test_sigkill_mid_sweep_then_rerun(tmp_path):
    servers_before = rpc_servers()
    wd = workflow_copy(tmp_path / "killed", CFG)
    bench_dir = wd / "results/bench/tiny-qwen3moe"
    proc = subprocess.Popen(
        [SNAKEMAKE, "--cores", "1", *TARGETS],
        cwd=wd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and len(list(bench_dir.glob("*.jsonl"))) < 1:
        assert proc.poll() is None, "snakemake ended before the kill"
        time.sleep(0.2)
    # A job is finished once Snakemake has recorded it, a moment after its output appears; each
    # job here runs for seconds, so this lands the kill in the middle of the next one (or the tables'
    # between them).
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {p.name: p.stat().st_mtime_ns for p in bench_dir.glob("*.jsonl")}
    assert len(done) == 1, "the kill should land in the second sweep"
    time.sleep(1)
    assert rpc_servers() == servers_before, "the RPC server outlived its job"
    assert subprocess.run(["pgrep", "-f", f"llama-bench.*{wd}"], capture_output=True).returncode == 1
    assert not list((wd / "results").rglob("*.tmp")), "a partial output survived"

    rerun = snakemake(wd, *TARGETS)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = {p.name: p.stat().st_mtime_ns for p in bench_dir.glob("*.jsonl")}
    assert len(after) == 2
    assert all(after[name] == mtime for name, mtime in done.items()), "a finished job was redone"

    clean = workflow_copy(tmp_path / "clean", CFG)
    assert snakemake(clean, *TARGETS).returncode == 0
    for ctx in ("1k", "2k"):
        resumed, fresh = (stable(d / f"results/tables/measured/{ctx}.csv") for d in (wd, clean))
        revision = ["pipeline_commit", "pipeline_dirty"]
        assert resumed.drop(columns=revision).equals(fresh.drop(columns=revision)), ctx
