"""The same DAG through SLURM (snakemake-executor-plugin-slurm) on a one-node cluster started here."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from slurm_cluster import ensure_installed, one_node_cluster
from workflow_helpers import SNAKEMAKE, snakemake, workflow_copy

pytestmark = [pytest.mark.slurm, pytest.mark.llamacpp]
CFG = {
    **yaml.safe_load((ROOT / "config/config.yaml").read_text()),
    "models": {"tiny-qwen3moe": {"twin": "config/models/tiny-qwen3moe.yaml"}},
    "contexts": [1024],
    "bench": {"prompt": 32, "gen": 8, "repetitions": 2, "n_cpu_moe": [0, 4, 8]},
}
TARGET = "results/figures/ncmoe_1k.png"
STABLE = ["model", "ctx", "n_cpu_moe", "variant", "test", "status", "samples", "device", "threads", "repetitions"]


def test_pipeline_runs_through_slurm_like_at_home(tmp_path):
    ensure_installed()
    local = workflow_copy(tmp_path / "local", CFG)
    assert snakemake(local, TARGET).returncode == 0

    cluster = workflow_copy(tmp_path / "cluster", CFG)
    profile = yaml.safe_load((ROOT / "profiles/slurm/config.v9+.yaml").read_text())
    profile["default-resources"]["slurm_partition"] = "main"
    for rule in profile["set-resources"].values():  # the test node has no GPU and 2 cores
        rule.pop("gpu", None)
        rule["cpus_per_task"] = 1
    # No accounting database here: job states come from squeue, which keeps finished jobs for MinJobAge.
    profile.update(
        jobs=1,
        **{
            "latency-wait": 5,
            "slurm-status-command": "squeue",
            "slurm-no-account": True,
            "slurm-init-seconds-before-status-checks": 5,
        },
    )
    (cluster / "profiles/slurm/config.v9+.yaml").write_text(yaml.safe_dump(profile))
    with one_node_cluster(tmp_path / "slurm") as env:
        run = subprocess.run(
            [SNAKEMAKE, "--workflow-profile", "profiles/slurm", TARGET],
            cwd=cluster,
            env=env,
            capture_output=True,
            text=True,
            timeout=3000,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        submitted = re.findall(r"sched: Allocate JobId=\d+", (tmp_path / "slurm/slurmctld.log").read_text())
        completed = (tmp_path / "slurm/jobcomp.log").read_text()
    # llamacpp, twin and three bench jobs went through the cluster; the cheap rules stayed local.
    assert len(submitted) >= 5, submitted
    assert completed.count("JobState=COMPLETED") >= 5
    here = pd.read_csv(local / "results/tables/measured/ctx1024.csv")[STABLE]
    there = pd.read_csv(cluster / "results/tables/measured/ctx1024.csv")[STABLE]
    assert here.equals(there)
    assert (cluster / TARGET).exists()
