"""Our own native helpers (preload shims, probes, the routing tracer), compiled once per source version.

Everything lands in ${XDG_CACHE_HOME:-~/.cache}/moeplace/native/, named by a hash of its source (and, for
tools linked against llama.cpp, of the build), and appears whole or not at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..core.errors import MoeplaceError
from .build import Build
from .process import run_checked

NATIVE_SOURCES = Path(__file__).parents[1] / "native"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "moeplace"


def _compile_once(out: Path, compiler: str, package: str, args: list[str], log_file: Path) -> Path:
    """Compile `out` with `compiler args -o <temp>` unless it is already cached; it appears whole or not at all."""
    if out.exists():
        return out
    path = shutil.which(compiler)
    if not path:
        raise MoeplaceError(f"compiling {out.name} needs {compiler}; install {package} (apt-get install {package}).")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        run_checked([path, "-O2", "-o", str(tmp), *args], f"compiling {out.name}", log_file)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def build_native(name: str, log_file: Path, *, shared: bool) -> Path:
    """Compile our native helper native/<name>.c (a preload shim or a small tool) once per version of its source
    and of the headers beside it."""
    source = NATIVE_SOURCES / f"{name}.c"
    text = b"".join(p.read_bytes() for p in [source, *sorted(NATIVE_SOURCES.glob("*.h"))])
    digest = hashlib.sha256(text).hexdigest()[:12]
    out = cache_root() / "native" / (f"libmoeplace-{name}-{digest}.so" if shared else f"moeplace-{name}-{digest}")
    kind = ["-shared", "-fPIC"] if shared else []
    return _compile_once(out, "cc", "gcc", [*kind, str(source), "-ldl", "-lpthread"], log_file)


def ram_read_gbps(log_file: Path, threads: int, nbytes: int, seconds: float, trials: int = 3) -> float:
    """Host RAM read bandwidth, GB/s (native/membw.c: `threads` threads summing `nbytes`), the best of a few
    probes: a ceiling, and on a shared host the others are its neighbours' noise."""
    tool = build_native("membw", log_file, shared=False)
    best = 0.0
    for _ in range(trials):
        cmd = [str(tool), str(threads), str(nbytes), str(seconds / trials)]
        out = run_checked(cmd, "the RAM bandwidth probe", log_file, timeout_s=seconds + 120)
        fields = dict(item.split("=", 1) for item in out.stdout.split())
        best = max(best, float(fields["gbps"]))
    return best


def build_tool(name: str, manifest: Build, log_file: Path) -> Path:
    """Compile our C++ tool native/<name>.cpp against the pinned build's static libraries, once per source and build.

    The binary goes to cache_root()/native/moeplace-<name>-<12 hex of the source and the build key>.
    """
    source = NATIVE_SOURCES / f"{name}.cpp"
    root = manifest.bin_dir.parent
    include_dir, lib_dir = root / "include", root / "lib"
    libs = sorted(lib_dir.glob("lib*.a")) if lib_dir.is_dir() else []
    if not (include_dir / "llama.h").exists() or not (lib_dir / "libllama.a").exists():
        raise MoeplaceError(
            f"{name} needs the llama.cpp headers and static libraries in {include_dir} and {lib_dir}, which this "
            "build lacks: routing traces need the pinned build (unset llamacpp.bin_dir)."
        )
    digest = hashlib.sha256(source.read_bytes() + root.name.encode()).hexdigest()[:12]
    out = cache_root() / "native" / f"moeplace-{name}-{digest}"
    args = ["-std=c++17", f"-I{include_dir}", str(source), "-Wl,--start-group", *map(str, libs), "-Wl,--end-group"]
    return _compile_once(out, "c++", "g++", [*args, "-lgomp", "-lpthread", "-ldl", "-lm"], log_file)
