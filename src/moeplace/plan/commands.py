"""Ready-to-paste llama.cpp command lines for a placement (what `recommend` and `tune` print)."""

from __future__ import annotations

import json
import shlex

from ..model.meta import ModelMeta
from ..runtime.llamacpp_args import DEFAULT_UBATCH
from ..runtime.model_ref import is_remote
from .request import Cache, rope_args


def llama_server(
    model: str,
    ctx: int,
    n_cpu_moe: int | None,
    cache: Cache,
    rules: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    n_gpu_layers: int = 99,
) -> str:
    """`llama-server` at this placement: the -ot `rules` (the user's own first: llama.cpp's first matching rule
    wins), joined with ',' as llama-server reads them, then `--n-cpu-moe N` (None: the rules are the placement).
    `extra`: the request's other flags (request_flags). `n_gpu_layers`: a whole-layer split's -ngl (99: every
    layer on the card)."""
    placement = ["-ot", ",".join(rules)] if rules else []
    placement += [] if n_cpu_moe is None else ["--n-cpu-moe", str(n_cpu_moe)]
    return _server(model, ctx, placement, cache, extra, n_gpu_layers)


def llama_server_split(
    model: str, ctx: int, tensor_split: tuple[int, ...], host_rule: str, cache: Cache, extra: tuple[str, ...] = ()
) -> str:
    """`llama-server` over several devices (plan/devices.py): -ts as layer counts and the host's -ot rule alone."""
    placement = ["-ts", ",".join(map(str, tensor_split)), *(["-ot", host_rule] if host_rule else [])]
    return _server(model, ctx, placement, cache, extra)


def _server(
    model: str, ctx: int, placement: list[str], cache: Cache, extra: tuple[str, ...], n_gpu_layers: int = 99
) -> str:
    """-c holds every slot's context; --parallel is always given, since llama-server's own default (4 slots
    sharing one cache) would change the KV cache the plan counted."""
    source = ["-mu", model] if is_remote(model) else ["-m", model]  # -mu downloads it
    cmd = ["llama-server", *source, "-c", str(ctx * cache.parallel), "-ngl", str(n_gpu_layers), *placement]
    cmd += [*cache.args(), "--parallel", str(cache.parallel), *extra]
    return shlex.join(cmd)


def request_flags(
    meta: ModelMeta,
    ctx: int,
    mmproj: str | None,
    no_kv_offload: bool,
    tool: str = "server",
    spec: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """What a line needs beyond placement, cache and batch: RoPE scaling past the trained context, the vision
    projector, the KV cache kept in host RAM, speculative decoding's flags (`spec`: Speculative.llama_args).
    llama-bench takes -nkvo only (it loads no projector and runs no draft, and RoPE scaling changes neither memory
    nor speed)."""
    if tool == "bench":
        return ("-nkvo", "1") if no_kv_offload else ()
    flags = [*rope_args(meta, ctx), *(["--mmproj", mmproj] if mmproj else []), *(["-nkvo"] if no_kv_offload else [])]
    return (*flags, *spec)


# The environment llama-server reads for those flags (common/arg.cpp's set_env), for Ollama's server.
_FLAG_ENV = {
    "--rope-scaling": "LLAMA_ARG_ROPE_SCALING_TYPE",
    "--rope-scale": "LLAMA_ARG_ROPE_SCALE",
    "--yarn-orig-ctx": "LLAMA_ARG_YARN_ORIG_CTX",
    "-md": "LLAMA_ARG_SPEC_DRAFT_MODEL",
    "-ngld": "LLAMA_ARG_N_GPU_LAYERS_DRAFT",
    "--spec-type": "LLAMA_ARG_SPEC_TYPE",
    "--spec-draft-n-max": "LLAMA_ARG_SPEC_DRAFT_N_MAX",
    "-ctkd": "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
    "-ctvd": "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
}


def flags_env(flags: tuple[str, ...]) -> list[str]:
    """request_flags as llama-server's environment (the projector aside: Ollama loads it from the Modelfile)."""
    env, it = [], iter(flags)
    for flag in it:
        if flag in _FLAG_ENV:
            env.append(f"{_FLAG_ENV[flag]}={next(it)}")
        elif flag == "-nkvo":
            env.append("LLAMA_ARG_KV_OFFLOAD=0")
        elif flag == "--mmproj":
            next(it)
    return env


def llama_bench(
    model: str,
    ctx: int,
    n_cpu_moe: int,
    cache: Cache,
    pins: list[str] | None = None,
    tensor_split: tuple[int, ...] | None = None,
    extra: tuple[str, ...] = (),
) -> str:
    """The `llama-bench` run that checks it: decode and prefill with the KV cache filled so that the prefill test
    holds exactly `ctx` cells, the user's pins before -ncmoe (llama-bench joins -ot rules with ';' and -ts shares
    with '/': its ',' would make a sweep of them). Over several devices, -ts and the -ot patterns (`pins`) alone.
    llama-bench runs one sequence: the cache's slots play no part."""
    prompt = min(ctx, 512)
    cmd = ["llama-bench", "-m", model, "-d", str(ctx - prompt), "-p", str(prompt), "-n", "128", "-ngl", "99"]
    cmd += ["-ts", "/".join(map(str, tensor_split))] if tensor_split else []
    cmd += ["-ot", ";".join(pins)] if pins else []
    cmd += [] if tensor_split else ["-ncmoe", str(n_cpu_moe)]
    cmd += ["-r", "5"]
    cmd += [*cache.args(), *extra]
    return shlex.join(cmd)


def llama_swap(servers: dict[str, str]) -> str:
    """One llama-swap config: a `models:` entry per name that starts its server on the port llama-swap gives it."""
    lines = ["models:"]
    for name, server_line in servers.items():
        cmd = server_line.replace("llama-server ", "llama-server --port ${PORT} ", 1)
        lines += [f"  {json.dumps(name)}:", f"    cmd: {json.dumps(cmd)}"]  # a JSON string is a YAML string
    return "\n".join(lines) + "\n"


# Ollama runs llama.cpp's own llama-server, passing it its environment, from version 0.30.0 (ollama commit
# 9db4bdb, "use llama-server exclusively for GGML models"); a Modelfile has no parameter for expert placement,
# and `ollama create` refuses one it does not know.
OLLAMA_LLAMA_SERVER = (0, 30, 0)


def ollama_modelfile(
    source: str,
    ctx: int,
    n_cpu_moe: int,
    cache: Cache,
    pins: list[str],
    version: tuple[int, ...] | None,
    server_line: str,
    flags: tuple[str, ...] = (),
) -> str:
    """An Ollama Modelfile for one context, and how to start Ollama so that the experts stay where planned.
    `cache`: the request's (Ollama sets one KV type, K's, for both). `version`: the installed ollama's (None: none
    found). No num_gpu: without the placement, Ollama's own fit stays safe; with it, llama-server offloads every
    layer but the planned experts. `flags`: request_flags (a projector is a second FROM, as Ollama imports a vision
    model; the rest llama-server's environment)."""
    mmproj = flags[flags.index("--mmproj") + 1] if "--mmproj" in flags else None
    lines = [f"FROM {source}", *([f"FROM {mmproj}"] if mmproj else []), f"PARAMETER num_ctx {ctx}"]
    env = [f"LLAMA_ARG_N_CPU_MOE={n_cpu_moe}", *flags_env(flags)]
    if cache.ubatch != DEFAULT_UBATCH:  # the plan's compute buffer is for this ubatch
        env.append(f"LLAMA_ARG_UBATCH={cache.ubatch}")
    if cache.parallel > 1:  # Ollama's own slots: each holds num_ctx tokens, as the plan counted
        env.append(f"OLLAMA_NUM_PARALLEL={cache.parallel}")
    if pins:
        env.insert(0, f"LLAMA_ARG_OVERRIDE_TENSOR={shlex.quote(','.join(pins))}")
    shown = ".".join(map(str, version)) if version else ""
    found = f"yours is {shown}" if version else "no ollama found here to ask"
    if version is not None and version < OLLAMA_LLAMA_SERVER:
        lines += [
            f"# Ollama has no setting that keeps only the experts in RAM, and Ollama {shown} runs its own engine,",
            "# which no llama.cpp variable reaches. Run llama.cpp's server instead:",
            f"#   {server_line}",
        ]
    else:
        lines += [
            "# Ollama has no Modelfile parameter for expert placement. Ollama 0.30.0 and newer run llama.cpp's",
            f"# llama-server with their environment ({found}); start the Ollama server with",
            f"#   {' '.join(env)} ollama serve",
            "# to keep the planned experts in RAM (it applies to every model that server loads). Older Ollama:",
            f"#   {server_line}",
        ]
    if (cache.type_k, cache.type_v) != ("f16", "f16"):
        kv = cache.type_k
        lines.append(f"# KV cache {kv}: add OLLAMA_FLASH_ATTENTION=1 OLLAMA_KV_CACHE_TYPE={kv} to that line.")
    return "\n".join(lines) + "\n"
