"""The same DAG through SLURM (snakemake-executor-plugin-slurm) on a one-node cluster started here."""

from __future__ import annotations

import subprocess
import time

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from slurm_cluster import ensure_installed, one_node_cluster
from workflow_helpers import SNAKEMAKE, snakemake, workflow_copy

pytestmark = [pytest.mark.slurm, pytest.mark.llamacpp, pytest.mark.long]
CFG = {
    **yaml.safe_load((ROOT / "config/config.yaml").read_text()),
    "models": {"tiny-qwen3moe": {"twin": "config/models/tiny-qwen3moe.yaml"}},
    "ceilings": {"enabled": False},  # test_workflow_ceilings_routing_ram_quants measures them; the sweep matters here
    "contexts": [1024],
    "bench": {"prompt": 32, "gen": 8, "repetitions": 2, "n_cpu_moe": [0, 4, 8]},
}
TARGET = "results/figures/ncmoe_1k.png"
STABLE = ["model", "ctx", "n_cpu_moe", "variant", "test", "status", "samples", "device", "threads", "repetitions"]


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory):
    ensure_installed()
    root = tmp_path_factory.mktemp("slurm")
    with one_node_cluster(root) as env:
        yield env, root


def cluster_copy(dest, cfg):
    """A workflow copy whose SLURM profile fits the one CPU-only test node."""
    cluster = workflow_copy(dest, cfg)
    profile = yaml.safe_load((ROOT / "profiles/slurm/config.v9+.yaml").read_text())
    profile["default-resources"]["slurm_partition"] = "main"
    for rule in profile["set-resources"].values():  # the test node has no GPU and 2 cores
        rule.pop("gpu", None)
        rule["cpus_per_task"] = 1
    # No accounting database here: job states come from squeue, which keeps finished jobs for MinJobAge. A job
    # here lasts seconds: asked every second (not every 10, Snakemake's default), it is seen done seconds sooner.
    profile.update(
        jobs=1,
        **{
            "latency-wait": 5,
            "slurm-status-command": "squeue",
            "slurm-no-account": True,
            "slurm-init-seconds-before-status-checks": 1,
            "seconds-between-status-checks": 1,
        },
    )
    (cluster / "profiles/slurm/config.v9+.yaml").write_text(yaml.safe_dump(profile))
    return cluster


def on_cluster(cluster, env, *, wait: bool = True):
    cmd = [SNAKEMAKE, "--workflow-profile", "profiles/slurm", TARGET]
    if not wait:
        return subprocess.Popen(cmd, cwd=cluster, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(cmd, cwd=cluster, env=env, capture_output=True, text=True, timeout=3000)


def test_pipeline_runs_through_slurm_like_at_home(tmp_path, cluster_env):
    env, root = cluster_env
    local = workflow_copy(tmp_path / "local", CFG)
    assert snakemake(local, TARGET).returncode == 0
    cluster = cluster_copy(tmp_path / "cluster", CFG)
    jobcomp = root / "jobcomp.log"  # one line per finished job, however the scheduler started it
    before = jobcomp.read_text().count("\n") if jobcomp.exists() else 0
    run = on_cluster(cluster, env)
    assert run.returncode == 0, run.stderr[-4000:]
    finished = jobcomp.read_text().splitlines()[before:]
    # llamacpp, twin and the bench job went through the cluster; the cheap rules stayed local.
    assert sum("JobState=COMPLETED" in line for line in finished) >= 3, finished
    here = pd.read_csv(local / "results/tables/measured/1k.csv")[STABLE]
    there = pd.read_csv(cluster / "results/tables/measured/1k.csv")[STABLE]
    assert here.equals(there)
    assert (cluster / TARGET).exists()


@pytest.mark.fault(
    fault="the cluster kills a job",
    injected="scancel of a running benchmark job",
    sees="the job failed; the next invocation reruns it",
    kept="no partial output; every other job",
)
def test_a_job_killed_by_slurm_leaves_nothing_and_reruns(tmp_path, cluster_env):
    env, _ = cluster_env
    twins = {name: {"twin": f"config/models/{name}.yaml"} for name in ("tiny-qwen3moe", "tiny-gpt-oss")}
    cfg = {**CFG, "models": twins, "bench": {**CFG["bench"], "repetitions": 5, "n_cpu_moe": [0, 8]}}  # 2 jobs
    cluster = cluster_copy(tmp_path / "cluster", cfg)
    proc = on_cluster(cluster, env, wait=False)
    deadline = time.monotonic() + 600
    killed = None
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        queue = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i %k"], env=env, capture_output=True, text=True)
        for line in queue.stdout.splitlines():
            job, comment = line.split(" ", 1)
            if "bench" in comment:
                time.sleep(3)  # into the measurement
                subprocess.run(["scancel", job], env=env, check=True)
                killed = comment
                break
        time.sleep(0.5)
    assert killed, "no bench job was seen running"
    proc.wait(timeout=1200)
    assert proc.returncode != 0  # the cancelled job failed the run (the others went on: keep-going)
    assert not list((cluster / "results").rglob("*.tmp")), "a partial output survived"
    outputs = list((cluster / "results/bench").rglob("*.jsonl"))
    assert len(outputs) == 1  # the job SLURM killed left nothing; the other finished
    rerun = on_cluster(cluster, env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert len(list((cluster / "results/bench").rglob("*.jsonl"))) == 2
