"""Ready-to-paste llama.cpp command lines for a placement (what `recommend` and `tune` print)."""

from __future__ import annotations

import shlex

from .kvcache import DEFAULT_UBATCH, cache_args


def llama_server(
    model: str,
    ctx: int,
    n_cpu_moe: int,
    type_k: str,
    type_v: str,
    overrides: str | None = None,
    flash_attn: str = "auto",
    ubatch: int = DEFAULT_UBATCH,
    parallel: int = 1,
    pins: list[str] | None = None,
) -> str:
    """`llama-server` at this placement: `--n-cpu-moe N` (after the user's own -ot pins, which match first), or
    `-ot` patterns (joined with ',' as it expects); with --parallel, -c holds every slot's context."""
    placement = ["-ot", overrides] if overrides else ["--n-cpu-moe", str(n_cpu_moe)]
    placement = [*(a for rule in pins or [] for a in ("-ot", rule)), *placement]
    cmd = ["llama-server", "-m", model, "-c", str(ctx * parallel), "-ngl", "99", *placement]
    cmd += [*cache_args(type_k, type_v, flash_attn, ubatch), *(["--parallel", str(parallel)] if parallel > 1 else [])]
    return shlex.join(cmd)


def llama_bench(model: str, ctx: int, n_cpu_moe: int, type_k: str, type_v: str) -> str:
    """The `llama-bench` run that checks it: decode and prefill with the KV cache filled to the context."""
    cmd = ["llama-bench", "-m", model, "-d", str(ctx), "-p", "512", "-n", "128", "-ngl", "99"]
    cmd += ["-ncmoe", str(n_cpu_moe), "-r", "5", *cache_args(type_k, type_v)]
    return shlex.join(cmd)
