"""Which backend a machine gets, told apart with stand-in nvidia-smi/nvcc/rocminfo/vulkaninfo on the PATH."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from cli_helpers import moeplace as run_here


def stand_ins(folder: Path, **programs: str) -> dict[str, str]:
    """Executables printing the given text; an environment whose PATH has them and the system's basics only."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in programs.items():
        exe = folder / name
        exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\n")
        exe.chmod(0o755)
    # CUDA_HOME/ROCM_PATH: no toolkit at its usual place either (this machine may have one without a GPU).
    return {**os.environ, "PATH": f"{folder}:/usr/bin:/bin", "CUDA_HOME": str(folder), "ROCM_PATH": str(folder)}


def moeplace(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The command in this process, in `env`; ROCM_PATH as a new process would read it when the module loads."""
    from moeplace.runtime import backend

    with mock.patch.object(backend, "ROCM", env["ROCM_PATH"]):
        return run_here(*args, env=env)


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return moeplace(env, "doctor", *args)


def test_cpu_here_and_cuda_with_an_nvidia_gpu_and_nvcc(tmp_path):
    plain = doctor(stand_ins(tmp_path / "none"), "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout)["name"] == "cpu"
    env = stand_ins(tmp_path / "nvidia", **{"nvidia-smi": "NVIDIA H200, 143771, 142597, 9.0", "nvcc": "nvcc 13"})
    cuda = json.loads(doctor(env, "--json").stdout)
    assert cuda["name"] == "cuda" and cuda["cmake_options"] == ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    assert cuda["devices"][0]["free_bytes"] == 142597 * 2**20 and cuda["toolkit"].endswith("nvcc")
    assert "NVIDIA H200 found" in doctor(env).stdout


def test_a_gpu_without_its_compiler_says_what_to_install(tmp_path):
    env = stand_ins(tmp_path / "smi", **{"nvidia-smi": "NVIDIA GeForce RTX 4090, 24564, 23000, 8.9"})
    out = json.loads(doctor(env, "--json").stdout)
    assert out["name"] == "cpu" and "CUDA toolkit" in out["install"]
    forced = doctor(env, "--backend", "cuda")
    assert forced.returncode == 2 and "install the CUDA toolkit" in forced.stderr and "Traceback" not in forced.stderr


@pytest.mark.parametrize(
    ("programs", "name", "option"),
    [
        ({"rocminfo": "Agent 1\n  Name: AMD EPYC\nAgent 2\n  Name: gfx1100", "hipcc": ""}, "hip",
         "-DAMDGPU_TARGETS=gfx1100"),
        ({"vulkaninfo": "deviceName = AMD Radeon RX 9070 XT\ndeviceName = llvmpipe (LLVM 17)", "glslc": ""}, "vulkan",
         "-DGGML_VULKAN=ON"),
    ],
)  # fmt: skip
def test_amd_and_vulkan(tmp_path, programs, name, option):
    out = json.loads(doctor(stand_ins(tmp_path / name, **programs), "--json").stdout)
    assert out["name"] == name and option in out["cmake_options"] and len(out["devices"]) == 1


def test_the_build_key_follows_the_backend(tmp_path, monkeypatch):
    from moeplace.runtime import backend, llamacpp

    env = stand_ins(tmp_path / "nvidia", **{"nvidia-smi": "NVIDIA H200, 143771, 142597, 9.0", "nvcc": ""})
    for key in ("PATH", "CUDA_HOME", "ROCM_PATH"):
        monkeypatch.setenv(key, env[key])
    cuda = backend.detect("auto")
    options = [*llamacpp.BASE_OPTIONS, *cuda.cmake_options]
    assert llamacpp.build_key("1", options) != llamacpp.build_key("1", list(llamacpp.BASE_OPTIONS))
    assert backend.detect("cpu").cmake_options == []


@pytest.mark.parametrize(("card", "gbps"), [("NVIDIA GeForce RTX 4090", 1008), ("NVIDIA GeForce RTX 3060", 640)])
def test_a_plan_for_this_machines_card_takes_its_datasheet_bandwidth(tmp_path, small_moe, card, gbps):
    """--vram auto reads the card's name; a card the table knows gets its datasheet bandwidth, with the source
    said; one it cannot tell apart (the 3060's two buses) keeps moeplace's default (640 GB/s), and says why. The
    host's RAM is measured here in either case (not the default 57.6 GB/s)."""
    env = stand_ins(tmp_path / "nvidia", **{"nvidia-smi": f"{card}, 24564, 23000, 8.9"})
    cmd = ["recommend", str(small_moe), "--vram", "auto", "--ctx", "4096"]
    plan = moeplace(env, *cmd, "--json")
    assert plan.returncode == 0, plan.stderr
    (row,) = json.loads(plan.stdout)  # one context
    assumed = row["assumptions"]
    assert assumed["bw_vram_gbps"] == gbps and assumed["bw_ddr_gbps"] != 57.6 and assumed["bw_ddr_gbps"] > 0.5
    assert "the host: measured here" in assumed["speed_source"]
    text = moeplace(env, *cmd).stdout
    said = "RTX 4090's datasheet (nvidia.com" if gbps == 1008 else "RTX 3060 is not in moeplace's table of cards"
    assert said in text


def test_a_machine_with_two_cards_gets_a_plan_over_both(tmp_path, small_moe):
    """--vram auto with two cards (a 24 GB and a 12 GB, as nvidia-smi lists them): a layer split over both, each
    card's free memory as read, the backend's --vram auto margin kept on each."""
    smi = "NVIDIA GeForce RTX 3090, 24576, 23000, 8.6\nNVIDIA GeForce RTX 3060, 12288, 11000, 8.6"
    env = stand_ins(tmp_path / "nvidia", **{"nvidia-smi": smi})
    cmd = ["recommend", str(small_moe), "--vram", "auto", "--ctx", "4096"]
    (plan,) = json.loads(moeplace(env, *cmd, "--json").stdout)
    assert [d["vram_bytes"] for d in plan["devices"]] == [23000 * 2**20, 11000 * 2**20]
    assert {d["margin_bytes"] for d in plan["devices"]} == {768 * 2**20} and plan["fits"]
    text = moeplace(env, *cmd).stdout
    assert "free now on NVIDIA GeForce RTX 3090, NVIDIA GeForce RTX 3060 (nvidia-smi)" in text and " -ts " in text


def test_vram_auto_reads_the_cards_free_memory_once(small_moe, monkeypatch, capsys):
    """--vram auto on one card reads its free memory once: the plan is made for the figure it says it read (a second
    read, as free memory changes, could plan for another)."""
    from moeplace.cli import main
    from moeplace.plan import recommend

    reads = []

    def free_now(backend: str):
        reads.append(backend)
        return [((23000 - 1000 * len(reads)) * 2**20, "NVIDIA GeForce RTX 4090")], "nvidia-smi"

    monkeypatch.setattr(recommend, "gpu_free_memory", free_now)
    argv = ["recommend", str(small_moe), "--vram", "auto", "--backend", "cuda", "--bw-ddr", "60", "--ctx", "4096"]
    assert main([*argv, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert reads == ["cuda"] and row["assumptions"]["vram_bytes"] == 22000 * 2**20
