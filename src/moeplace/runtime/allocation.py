"""llama.cpp's own account of device memory: its buffer log lines, its reserve without allocating
(llama-fit-params --fit-print: the model's header only, no weights read), a real allocation probe
(llama-completion at the full context: load, allocate, generate a few tokens) and its own fitted placement.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import MoeplaceError
from .build import Build
from .llama_buffers import Buffers, parse_buffers
from .llamacpp import require_binary
from .process import classify, run, run_checked
from .tool_output import fitted_args

PROBE_TOKENS = 4
LOG_TRIES = 5  # runs at most of a tool whose log lost its end (_whole)


def _placement_args(
    manifest: Build, model: str, args: list[str], n_cpu_moe: int, rpc: str | None, overrides: str | None
) -> list[str]:
    cmd = ["--rpc", rpc] if rpc else []
    # -ot before -ncmoe: llama.cpp's first matching rule wins, and a user's pins come first.
    cmd += ["-m", model, "-ngl", "99", *(["-ot", overrides.replace(";", ",")] if overrides else [])]
    return cmd + ["-ncmoe", str(n_cpu_moe), *args]


def _whole(loads: list[Buffers]) -> bool:
    """Whether a log kept its last load's buffers to the end: the host's compute buffer (CPU, CUDA_Host, ...) is
    logged last. llama.cpp logs from a thread that the process does not wait for at exit (llama.cpp#22142): a run's
    last lines can be lost, the more often the busier the cores are."""
    return bool(loads) and "compute" in loads[-1].host


def reserve(
    manifest: Build,
    model: str,
    workload_args: list[str],
    n_cpu_moe: int,
    rpc: str | None,
    log_path: str | Path,
    overrides: str | None = None,
) -> Buffers:
    """llama.cpp's buffers for this placement, reserved without allocating (exactly what a load allocates)."""
    cmd = [str(require_binary(manifest, "llama-fit-params"))]
    cmd += _placement_args(manifest, model, workload_args, n_cpu_moe, rpc, overrides) + ["-fitp", "on", "-v"]
    for _ in range(LOG_TRIES):
        out = run_checked(cmd, f"llama-fit-params reserving memory for {Path(model).name}", log_path, timeout_s=600)
        if _whole(loads := parse_buffers(out.stderr)):
            return loads[-1]
    raise MoeplaceError(f"llama-fit-params logged no compute buffer for {model}; see {log_path}.")


def load_probe(
    manifest: Build,
    model: str,
    workload_args: list[str],
    n_cpu_moe: int,
    rpc: str | None,
    log_path: str | Path,
    timeout_s: float = 600,
) -> tuple[str, Buffers | None]:
    """Load, allocate at the full context and generate a few tokens ('ok', buffers) or (oom/crash/..., None):
    what a server started with these flags does before its first request."""
    cmd = [str(require_binary(manifest, "llama-completion"))]
    cmd += _placement_args(manifest, model, workload_args, n_cpu_moe, rpc, None)
    cmd += ["-n", str(PROBE_TOKENS), "-p", "Hello", "-no-cnv", "--no-warmup", "-fit", "off", "--temp", "0", "-v"]
    for _ in range(LOG_TRIES):
        status, _ = classify(result := run(cmd, log_path=log_path, timeout_s=timeout_s))
        loads = parse_buffers(result.stderr)
        if status != "ok" or _whole(loads):
            break
    return status, loads[-1] if status == "ok" and loads else None


def fitted_placement_args(stdout: str) -> tuple[int, str | None, str | None]:
    """llama-fit-params' printed arguments as llama-bench takes them: its -ngl, its -ot value and, over several
    devices, its -ts value (None: none). It joins -ot patterns and -ts shares with ',' (llama-server's separator);
    llama-bench wants ';' and '/'."""
    args = fitted_args(stdout)
    overrides = args[args.index("-ot") + 1].replace(",", ";") if "-ot" in args else None
    tensor_split = args[args.index("-ts") + 1].replace(",", "/") if "-ts" in args else None
    return int(args[args.index("-ngl") + 1]), overrides, tensor_split


def fitted_placement(
    manifest: Build, model: str, workload_args: list[str], rpc: str | None, log_path: Path
) -> tuple[int | None, str | None, str | None]:
    """llama-fit-params' own placement with no margin, as fitted_placement_args gives it, or Nones where it found
    none. It may also keep whole layers on the host (a lower -ngl)."""
    cmd = [str(require_binary(manifest, "llama-fit-params"))]
    cmd += (["--rpc", rpc] if rpc else []) + ["-m", model, *workload_args, "-fitt", "0"]
    result = run(cmd, log_path=log_path, timeout_s=600)
    if not result.ok or not result.stdout.strip():
        return None, None, None
    return fitted_placement_args(result.stdout)
