"""A killed run's Snakemake locks are cleared by the next plain run, never while their owner may be alive,
and never by a job's own parse of the Snakefile (on a cluster node it cannot see the main process)."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

from moeplace.runtime.locks import OWNER, clear_stale_locks

SEED = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())
TARGET = "results/tables/budget/qwen3-coder-30b-a3b.csv"


def locked(workdir, host: str | None, pid: int) -> None:
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.input.lock").write_text("results/x\n")
    if host is not None:
        (locks / OWNER).write_text(json.dumps({"host": host, "pid": pid}))


def has_locks(workdir) -> bool:
    return (workdir / ".snakemake/locks/0.input.lock").exists()


@pytest.fixture
def live_snakemake():
    """A live process whose command line says snakemake, as a running owner's does."""
    proc = subprocess.Popen(["bash", "-c", "exec -a snakemake-owner sleep 60"])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"snakemake" not in cmdline.read_bytes() and time.monotonic() < deadline:  # forked, not yet exec'd
        time.sleep(0.01)
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_dead_owner_on_this_host_is_cleared_and_the_new_owner_recorded(tmp_path):
    locked(tmp_path, platform.node(), 2**22 + 1)  # no such pid
    assert clear_stale_locks(tmp_path, main_process=True)
    assert not has_locks(tmp_path)
    assert json.loads((tmp_path / ".snakemake/locks" / OWNER).read_text())["host"] == platform.node()


def test_a_job_process_never_clears(tmp_path):
    locked(tmp_path, platform.node(), 2**22 + 1)
    assert not clear_stale_locks(tmp_path, main_process=False)
    assert has_locks(tmp_path)


def test_a_live_owner_or_one_on_another_host_keeps_its_locks(tmp_path, live_snakemake):
    locked(tmp_path, platform.node(), live_snakemake)
    assert not clear_stale_locks(tmp_path, main_process=True) and has_locks(tmp_path)
    locked(tmp_path, "another-node", 2**22 + 1)  # its pid means nothing here
    assert not clear_stale_locks(tmp_path, main_process=True) and has_locks(tmp_path)


def test_locks_without_a_record_are_cleared_only_with_no_snakemake_working_here(tmp_path):
    locked(tmp_path, None, 0)
    assert clear_stale_locks(tmp_path, main_process=True) and not has_locks(tmp_path)


@pytest.mark.fault(
    fault="a killed run left its locks",
    injected="lock files of a dead owner; a job-mode parse, then a plain run",
    sees="a cluster job never clears them; the next plain run does",
    kept="a live run on this or another host keeps its locks",
)
def test_through_the_snakefile_a_job_mode_parse_leaves_them_and_a_plain_run_clears(tmp_path):
    wd = workflow_copy(tmp_path, SEED)
    locked(wd, platform.node(), 2**22 + 1)
    job = snakemake(wd, "--mode", "remote", "-n", TARGET)  # how a cluster job parses the Snakefile
    assert job.returncode == 0, job.stderr[-2000:]
    assert has_locks(wd)
    plain = snakemake(wd, "-n", TARGET)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert not has_locks(wd)
