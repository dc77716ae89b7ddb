"""Faults injected into the bench stage itself (its real script, run as Snakemake runs it, on the pinned llama.cpp and
the emulated device): a truncated llama-bench, Ctrl-C mid-sweep, a disk that fills mid-sweep. Each asserts the one
line the user sees, that no output is cached as done, and that a rerun measures only what is missing."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from conftest import ROOT
from llamacpp_helpers import manifest, tiny_twin

from moeplace.core.config import BenchSettings, DeviceTarget
from moeplace.core.errors import MoeplaceError
from moeplace.measure import bench
from moeplace.measure.sweep_records import side_file
from moeplace.model.meta import to_json
from moeplace.model.metadata import inspect_model
from moeplace.runtime.build import Build
from moeplace.runtime.device import DeviceSetup
from moeplace.runtime.outputs import read_jsonl, write_json

pytestmark = pytest.mark.llamacpp
# Holds the tiny twin at 4K with its experts on the host (n = 8: 19.5 MiB of weights, KV and compute), not with
# them on it (n = 0: 48.5 MiB).
CAP = 32 * 2**20
# Slow enough at n = 8 (tens of seconds) to be interrupted in the middle of it.
SLOW = BenchSettings(prompt=512, gen=64, repetitions=3, threads=2, timeout_s=300)

# The bench stage's script as Snakemake runs it: `snakemake` holds the job's inputs, output, params and log.
STAGE = """
import json, runpy, sys
from types import SimpleNamespace

class Named(list):  # Snakemake's named lists: items by position and by name
    def __init__(self, **named):
        super().__init__(named.values())
        self.__dict__.update(named)

    def get(self, key, default=None):
        return self.__dict__.get(key, default)

job = json.loads(sys.argv[1])
snakemake = SimpleNamespace(
    input=Named(**job["input"]), output=Named(records=job["output"]), log=[job["log"]],
    wildcards=SimpleNamespace(model="tiny"), params=SimpleNamespace(**job["params"]),
)
runpy.run_path(sys.argv[2], init_globals={"snakemake": snakemake}, run_name="__main__")
"""


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Path:
    return tiny_twin(tmp_path_factory.mktemp("twin"))


def bench_job(folder: Path, twin: Path, values: list[int], settings: BenchSettings, build=None) -> list[str]:
    """The command that runs the bench stage on `twin` at 4K over `values`, its files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "metadata.json", to_json(inspect_model(twin).named("tiny")))
    write_json(folder / "llamacpp.json", (build or manifest()).to_json())
    job = {
        "input": {"model": [str(twin)], "metadata": str(folder / "metadata.json"),
                  "llamacpp": str(folder / "llamacpp.json")},
        "output": str(folder / "4k.jsonl"),
        "log": str(folder / "bench.log"),
        "params": {"settings": asdict(settings), "device": asdict(DeviceTarget("emulated", "test device", CAP)),
                   "ctx": 4096, "n_cpu_moe": values},
    }  # fmt: skip
    return [sys.executable, "-c", STAGE, json.dumps(job), str(ROOT / "workflow/scripts/bench.py")]


def own_build(folder: Path) -> Build:
    """The pinned build copied into `folder`: its processes are this test's alone (other runs share the cache)."""
    shutil.copytree(manifest().bin_dir, folder / "bin")
    return replace(manifest(), bin_dir=folder / "bin")


def running(build: Build) -> list[str]:
    """The processes still running from `build`'s binaries (a device server, a llama-bench)."""
    found = subprocess.run(["pgrep", "-af", str(build.bin_dir)], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if "pgrep" not in line]


def said(stderr: str) -> list[str]:
    """The stage's own lines on stderr, warnings aside."""
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("moeplace:") and "moeplace: warning:" not in line]


def measured_values(log: str) -> list[str]:
    """The -ncmoe values of each llama-bench command in a stage log, in order."""
    commands = [line for line in log.splitlines() if line.startswith("$ ") and " -ncmoe " in line]
    return [line.split(" -ncmoe ")[1].split()[0] for line in commands]


@pytest.mark.fault(
    fault="a truncated llama-bench in the build a run reuses",
    injected="the pinned build copied, its llama-bench cut to 64 KiB; the bench stage run on it",
    sees="the job fails: moeplace: tiny at 4,096 tokens measured nothing usable (n=4 ..., n=8 ...); likely a broken "
    "llama.cpp build (<bin>/llama-bench --version failed (...)): delete resources/llamacpp/ and run the pipeline again",
    kept="no output cached as done; each value's record in the side file",
)
def test_a_truncated_llama_bench_fails_the_sweep_naming_the_build(twin, tmp_path):
    build = own_build(tmp_path)
    copy = build.bin_dir
    with (copy / "llama-bench").open("r+b") as f:
        f.truncate(64 * 1024)
    run = subprocess.run(bench_job(tmp_path / "job", twin, [4, 8], SLOW, build), cwd=ROOT, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 1
    (line,) = said(run.stderr)
    assert line.startswith("moeplace: tiny at 4,096 tokens measured nothing usable (n=4 ")
    assert f"likely a broken llama.cpp build ({copy}/llama-bench --version failed (" in line
    assert "delete resources/llamacpp/ and run the pipeline again" in line
    assert not (tmp_path / "job/4k.jsonl").exists()
    assert {r["n_cpu_moe"] for r in read_jsonl(side_file(tmp_path / "job/4k.jsonl"))} == {4, 8}
    assert running(build) == []


@pytest.mark.fault(
    fault="Ctrl-C in the middle of a sweep",
    injected="SIGINT to the bench stage's process group while n = 8 is measured (n = 0 done: out of memory)",
    sees="one line: moeplace: interrupted (Ctrl-C): 1 of 2 n_cpu_moe values of tiny at 4,096 tokens were "
    "done and are kept in <output>.partial; a rerun measures only the rest",
    kept="n = 0's records; the rerun runs llama-bench for n = 8 only, and its output holds both",
)
def test_ctrl_c_mid_sweep_is_one_line_and_the_rerun_measures_only_the_rest(twin, tmp_path):
    folder, build = tmp_path / "job", own_build(tmp_path)
    command = bench_job(folder, twin, [0, 8], SLOW, build)
    side = side_file(folder / "4k.jsonl")
    stage = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    log = folder / "bench.log"
    # n = 8 under way: its first timed run started (n = 8 takes ~4 s in all, so a fixed wait could miss it)
    while not (side.exists() and len(read_jsonl(side)) == 2 and log.read_text().count("prompt run 1/")):
        assert time.monotonic() < deadline, "n = 8 never started"
        time.sleep(0.05)
    os.killpg(stage.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    stderr = stage.communicate(timeout=60)[1]
    assert stage.returncode == 1
    assert said(stderr) == [f"moeplace: interrupted (Ctrl-C): 1 of 2 n_cpu_moe values of tiny at 4,096 tokens were "
                            f"done and are kept in {side}; a rerun measures only the rest"]  # fmt: skip
    assert [(r["n_cpu_moe"], r["status"]) for r in read_jsonl(side)] == [(0, "oom"), (0, "oom")]
    assert not (folder / "4k.jsonl").exists() and running(build) == []
    kept = read_jsonl(side)
    logged = len(log.read_text())
    rerun = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert measured_values(log.read_text()[logged:]) == ["8"]
    records = read_jsonl(folder / "4k.jsonl")
    assert records[:2] == kept and [(r["n_cpu_moe"], r["status"]) for r in records[2:]] == [(8, "ok"), (8, "ok")]
    assert not side.exists()


@pytest.mark.fault(
    fault="the disk fills in the middle of a sweep",
    injected="ENOSPC on writing n = 8's records, n = 0's already on disk",
    sees="moeplace: no space left on device: <output>.partial (<N> MiB free there): the values measured before are "
    "kept in <output>.partial; make room and run again to measure only the rest",
    kept="n = 0's records, given back as they were by the rerun, which measures n = 8 only",
)
def test_a_disk_that_fills_mid_sweep_keeps_what_was_measured(twin, tmp_path, monkeypatch):
    quick = BenchSettings(prompt=16, gen=4, repetitions=1, threads=2, timeout_s=300)
    job = bench.BenchJob("tiny", str(twin), inspect_model(twin).files, 4096, 0)
    rig = bench.Rig(quick, DeviceSetup("emulated", "test device", CAP), manifest(), tmp_path / "bench.log", ROOT)
    side = tmp_path / "4k.jsonl.partial"
    appended = bench.append_jsonl

    def fills_after_the_first(path, records):
        if path.exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        appended(path, records)

    monkeypatch.setattr(bench, "append_jsonl", fills_after_the_first)
    with pytest.raises(MoeplaceError) as e:
        bench.run_sweep(job, [0, 8], rig, side)
    assert str(e.value).startswith(f"no space left on device: {side} (")
    assert f"MiB free there): the values measured before are kept in {side}; make room and run again" in str(e.value)
    kept = read_jsonl(side)
    assert [(r["n_cpu_moe"], r["status"]) for r in kept] == [(0, "oom"), (0, "oom")]
    monkeypatch.undo()
    logged = len(rig.log_path.read_text())
    records = bench.run_sweep(job, [0, 8], rig, side)
    assert records[:2] == kept  # as measured, not measured again
    assert [(r["n_cpu_moe"], r["status"]) for r in records[2:]] == [(8, "ok"), (8, "ok")]
    assert measured_values(rig.log_path.read_text()[logged:]) == ["8"]
