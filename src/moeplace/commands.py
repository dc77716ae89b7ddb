"""Ready-to-paste llama.cpp command lines for a placement (what `recommend` and `tune` print)."""

from __future__ import annotations

import json
import shlex

from .kvcache import DEFAULT_UBATCH, cache_args
from .runtime.model_ref import is_remote


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
    source = ["-mu", model] if is_remote(model) else ["-m", model]  # -mu downloads it
    cmd = ["llama-server", *source, "-c", str(ctx * parallel), "-ngl", "99", *placement]
    cmd += [*cache_args(type_k, type_v, flash_attn, ubatch), *(["--parallel", str(parallel)] if parallel > 1 else [])]
    return shlex.join(cmd)


def llama_bench(
    model: str, ctx: int, n_cpu_moe: int, type_k: str, type_v: str, flash_attn: str = "auto", ubatch: int = 512
) -> str:
    """The `llama-bench` run that checks it: decode and prefill with the KV cache filled so that the prefill test
    holds exactly `ctx` cells."""
    cmd = ["llama-bench", "-m", model, "-d", str(max(ctx - 512, 0)), "-p", "512", "-n", "128", "-ngl", "99"]
    cmd += ["-ncmoe", str(n_cpu_moe), "-r", "5", *cache_args(type_k, type_v, flash_attn, ubatch)]
    return shlex.join(cmd)


def llama_swap(name: str, server_line: str) -> str:
    """A llama-swap `models:` entry that starts this server on the port llama-swap gives it."""
    cmd = server_line.replace("llama-server ", "llama-server --port ${PORT} ", 1)
    return f"models:\n  {json.dumps(name)}:\n    cmd: {cmd}\n"  # a JSON string is a YAML string


def ollama_modelfile(
    source: str, ctx: int, n_cpu_moe: int, type_k: str, type_v: str, supports_ncmoe: bool | None
) -> str:
    """An Ollama Modelfile for this plan. Ollama keeps whole layers on the CPU (num_gpu); only builds that read
    num_cpu_moe keep just the experts there. `supports_ncmoe`: what the installed ollama binary knows (None: none
    found)."""
    lines = [f"FROM {source}", f"PARAMETER num_ctx {ctx}", "PARAMETER num_gpu 999"]
    if supports_ncmoe is False:
        lines += [
            "# Your Ollama has no num_cpu_moe option: it cannot keep only the experts in RAM and would drop whole",
            f"# layers instead. Run llama-server with --n-cpu-moe {n_cpu_moe} (moeplace recommend --emit server).",
        ]
    else:
        if supports_ncmoe is None:
            lines.append("# num_cpu_moe needs an Ollama build that has it (no ollama binary was found to ask).")
        lines.append(f"PARAMETER num_cpu_moe {n_cpu_moe}")
    if (type_k, type_v) != ("f16", "f16"):
        lines.append(
            f"# KV cache {type_k}: start the server with OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE={type_k}"
        )
    return "\n".join(lines) + "\n"
