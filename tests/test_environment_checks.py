"""Bad environments and configs are caught before the first benchmark, with a line that says what to do."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

from moeplace.core.config import LlamacppSettings
from moeplace.core.errors import MoeplaceError
from moeplace.runtime import llamacpp
from moeplace.runtime.build import Build

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())


def fake_llamacpp(folder: Path, help_text: str) -> Path:
    folder.mkdir()
    bench = folder / "llama-bench"
    bench.write_text(f"#!/bin/sh\necho '{help_text}'\n")
    bench.chmod(bench.stat().st_mode | stat.S_IEXEC)
    return folder


def test_bin_dir_without_llama_bench(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(MoeplaceError, match="has no llama-bench"):
        llamacpp.provision(LlamacppSettings(bin_dir=str(tmp_path / "bin")), tmp_path / "log")


def test_bin_dir_too_old_for_ncmoe(tmp_path):
    old = fake_llamacpp(tmp_path / "old", "version: 1 (build 4000, commit abc) -ot -d, --rpc")
    with pytest.raises(MoeplaceError, match="too old.*-ncmoe"):
        llamacpp.provision(LlamacppSettings(bin_dir=str(old)), tmp_path / "log")


def test_missing_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "cmake" else f"/usr/bin/{tool}")
    with pytest.raises(MoeplaceError, match="apt-get install cmake g\\+\\+"):
        llamacpp.check_build_tools()


def one_line_stop(wd: Path, needle: str, *targets: str) -> None:
    run = snakemake(wd, *targets)
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("moeplace:")]
    assert len(lines) == 1 and needle in lines[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert not (wd / "results/bench").exists()


@pytest.mark.fault(
    fault="a model path that does not exist",
    injected="a config naming a missing GGUF",
    sees="one line before any job: the field and the path to fix",
    kept="nothing starts",
)
def test_unknown_model_path(tmp_path):
    cfg = {**DEFAULT, "models": {"mine": {"gguf": "models/missing.gguf"}}}
    one_line_stop(workflow_copy(tmp_path, cfg), "models.mine.gguf: models/missing.gguf does not exist")


def test_context_shorter_than_the_test(tmp_path):
    short = DEFAULT["bench"]["prompt"] + DEFAULT["bench"]["gen"]  # no depth left before the tests
    cfg = {**DEFAULT, "contexts": [short]}
    one_line_stop(workflow_copy(tmp_path, cfg), f"config contexts: [{short}] leave no room")


def test_n_values_beyond_the_layers(tmp_path, small_moe):
    cfg = {**DEFAULT, "models": {"small": {"gguf": str(small_moe)}}, "contexts": [1024], "bench": {"n_cpu_moe": [0, 5]}}
    one_line_stop(
        workflow_copy(tmp_path, cfg),
        "bench.n_cpu_moe: [5] exceed small's 2 layers",
        "results/tables/measured/1k.csv",
    )


def test_vram_auto_reads_the_gpus_free_memory_and_refuses_without_one(tmp_path):
    from moeplace.core.config import DeviceTarget
    from moeplace.runtime.device import device_setup

    listing = "Available devices:\n  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23575 MiB free)"
    gpu = fake_llamacpp(tmp_path / "gpu", listing)
    setup = device_setup(DeviceTarget("auto", "", None), Build(gpu, gpu_devices=("CUDA0: RTX 4090",)))
    assert setup.kind == "gpu" and setup.cap_bytes == 23575 * 2**20
    with pytest.raises(MoeplaceError, match="vram is auto, but there is no GPU to ask"):
        device_setup(DeviceTarget("auto", "", None), Build(gpu))
