"""`moeplace recommend`: the smallest --n-cpu-moe for each context, every device buffer counted, with the
expected speeds and ready-to-paste command lines (the allocator without the pipeline)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import budget as budget_mod
from . import commands
from .errors import MoeplaceError
from .kvcache import needs_flash_attn
from .memory import Workload
from .metadata import from_constants, inspect_model, structure
from .placement import pinned_tensors
from .units import GB, parse_size


def parse_contexts(text: str, flag: str = "--ctx", allow_zero: bool = False) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MoeplaceError(
            f"{flag}: {text!r} is not a comma-separated list of token counts, e.g. 8192,32768."
        ) from None
    if not values or any(v < (0 if allow_zero else 1) for v in values):
        what = "token counts of 0 or more" if allow_zero else "positive token counts"
        raise MoeplaceError(f"{flag}: {text!r} must list {what}, e.g. 8192,32768.")
    return values


def _print_optimal(meta: dict[str, Any], model: Any, device: Any, ctx: int, args: argparse.Namespace) -> None:
    """The feasible placements and KV cache types at this context, best first by --objective."""
    from .placement import host_layers, ot_value, rank_placements

    kv_types = list(dict.fromkeys([(args.cache_type_k, args.cache_type_v), ("q8_0", "q8_0")]))
    ubatches = list(dict.fromkeys([args.ubatch, 512, 2048]))  # yours first: it wins ties
    ranked = rank_placements(meta, device, ctx, model, args.objective, kv_types, ubatches)
    if not ranked or ranked[0]["score"] is None:
        why = "prefill needs --calibration" if args.objective != "decode" else "nothing fits"
        print(f"  placements by {args.objective}: cannot rank ({why}).")
        return
    print(f"  placements by {args.objective} at {ctx} tokens, best first:")
    for r in ranked:
        ncmoe = r["placement"] == "ncmoe"
        tensors, layers = len(r["host_tensors"]), len(host_layers(r["host_tensors"]))
        what = (
            f"--n-cpu-moe {r['n_cpu_moe']}"
            if ncmoe
            else f"-ot ({tensors} expert tensors on the host, in {layers} layers)"
        )
        print(f"    {what}, KV {r['type_k']}/{r['type_v']}, -ub {r['ubatch']}: decode {speed_text(r['tg'])}, "
              f"prefill {speed_text(r['pp'])}")  # fmt: skip
    best = ranked[0]
    overrides = ot_value(set(best["host_tensors"]), separator=",") if best["placement"] != "ncmoe" else None
    print("  " + commands.llama_server(args.model, ctx, best["n_cpu_moe"], best["type_k"], best["type_v"], overrides,
                                       args.flash_attn, best["ubatch"]))  # fmt: skip


def cmd_recommend(args: argparse.Namespace) -> int:
    contexts = parse_contexts(args.ctx)
    if args.placement == "optimal" and not args.model:
        raise MoeplaceError("--placement optimal needs a MODEL.gguf: it places individual expert tensors.")
    if args.model:
        meta = inspect_model(args.model)
        if args.vram is None:
            raise MoeplaceError("--vram is required, e.g. --vram 16GB.")
        device = budget_mod.Device(parse_size(args.vram, "--vram"), args.margin * 2**20)
    else:
        missing = [
            f
            for f in ("vram_gb", "non_expert_gb", "expert_gb", "layers", "kv_bytes_per_token")
            if getattr(args, f) is None
        ]
        if missing:
            raise MoeplaceError(
                "give a MODEL.gguf, or all of "
                + ", ".join("--" + m.replace("_", "-") for m in missing)
                + " for the constants mode."
            )
        sizes = {"expert": f"{args.expert_gb}GB", "non_expert": f"{args.non_expert_gb}GB"}
        meta = from_constants(
            "constants", {"layers": args.layers, **sizes, "kv_bytes_per_token": args.kv_bytes_per_token}
        )
        device = budget_mod.Device(round(args.vram_gb * GB), round(args.overhead_gb * GB))
    if args.flash_attn == "off" and needs_flash_attn(args.cache_type_v):
        raise MoeplaceError(f"--cache-type-v {args.cache_type_v} needs flash attention: drop --flash-attn off.")
    extra = Path(args.mmproj).stat().st_size if args.mmproj else 0
    pinned = pinned_tensors(meta, args.override_tensor) if args.model else frozenset()
    workloads = [
        Workload(ctx, args.ubatch, args.flash_attn, args.cache_type_k, args.cache_type_v, args.parallel)
        for ctx in contexts
    ]
    plans = [budget_mod.plan(meta, device, w, extra_bytes=extra, pinned=pinned) for w in workloads]
    model = speed_model(args) if args.model else None
    for p in plans:
        if model and p["n_cpu_moe"] is not None:
            p["speed"] = expected(meta, model, p["n_cpu_moe"], p["ctx"], args)
    emit = "json" if args.json else args.emit
    if emit not in ("server", "json") and not args.model:
        raise MoeplaceError(f"--emit {emit} needs a MODEL.gguf (or ollama:/lmstudio:/hf: reference).")
    if emit == "json":
        json.dump(plans, sys.stdout, indent=1)
        print()
    if emit == "server" and args.model:
        print(f"{meta['name']}: {structure(meta)}")
    status = 0
    for p in plans:
        if p["status"] != budget_mod.FITS:
            print(f"moeplace: {budget_mod.does_not_fit_message(p, device.vram_bytes)}", file=sys.stderr)
            if args.explain and args.model:
                w = next(w for w in workloads if w.ctx == p["ctx"])
                for fix in budget_mod.fixes(meta, device, w, None, extra, pinned) or ["none found: a larger card"]:
                    print(f"  fix: {fix}", file=sys.stderr)
            status = 1
        elif emit not in ("server", "json"):
            print(_emission(emit, meta, p, args))
        elif emit == "server":
            _print_plan(meta, model, device, p, args)
    return status


def _server_line(p: dict[str, Any], args: argparse.Namespace) -> str:
    kv = (args.cache_type_k, args.cache_type_v)
    return commands.llama_server(args.model, p["ctx"], p["n_cpu_moe"], *kv, None, args.flash_attn, args.ubatch,
                                 args.parallel, args.override_tensor)  # fmt: skip


def _emission(emit: str, meta: dict[str, Any], p: dict[str, Any], args: argparse.Namespace) -> str:
    """--emit bench, llama-swap or ollama: a ready-to-paste text for one context's plan."""
    from .runtime.model_ref import ollama_knows
    from .units import Context

    kv = (args.cache_type_k, args.cache_type_v)
    if emit == "bench":
        return commands.llama_bench(args.model, p["ctx"], p["n_cpu_moe"], *kv, args.flash_attn, args.ubatch)
    if emit == "llama-swap":
        return commands.llama_swap(f"{meta['name']}-{Context(p['ctx']).label}", _server_line(p, args))
    source = args.model_ref.removeprefix("ollama:") if args.model_ref.startswith("ollama:") else args.model
    return commands.ollama_modelfile(source, p["ctx"], p["n_cpu_moe"], *kv, ollama_knows("num_cpu_moe"))


def _print_plan(meta: dict[str, Any], model: Any, device: Any, p: dict[str, Any], args: argparse.Namespace) -> None:
    """One context's plan as text: the buffers, the n, the server line and the expected speeds."""
    print(
        f"ctx={p['ctx']:>6}  KV={p['kv_bytes'] / GB:5.2f} GB  "
        + (f"compute={p['compute_bytes'] / GB:5.2f} GB  " if p["compute_bytes"] is not None else "")
        + f"budget={p['budget_bytes'] / GB:5.2f} GB  "
        f"resident_layers={p['resident_layers']:>2}  --n-cpu-moe {p['n_cpu_moe']}"
    )
    if args.model:
        print("  " + _server_line(p, args))
        print("  expected: " + describe_speed(p["speed"], p["ctx"]))
    if args.placement == "optimal":
        _print_optimal(meta, model, device, p["ctx"], args)


def speed_model(args: argparse.Namespace):  # noqa: ANN202
    """--calibration's fitted model, else the bandwidths' prior (decode only)."""
    from .predict import Bandwidths
    from .speed import SpeedModel, prior

    if getattr(args, "calibration", None):
        try:
            data = json.loads(Path(args.calibration).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise MoeplaceError(f"--calibration {args.calibration}: cannot read it ({e}).") from None
        return SpeedModel.from_json(data, f"--calibration {args.calibration}")
    return prior(Bandwidths(args.bw_vram_gbps, args.bw_ddr_gbps))


def expected(meta: dict[str, Any], model: Any, n: int, depth: int, args: argparse.Namespace) -> dict[str, Any]:
    """Decode at an empty context and at `depth`, prefill of a prompt's last batch up to `depth`: tok/s with ~95%
    intervals (None: unknown)."""
    from .speed import Run, prefill_up_to

    kv = (args.cache_type_k, args.cache_type_v)
    ubatch = getattr(args, "ubatch", 512)
    return {
        "tg_empty": model.predict(meta, Run(n, 0, "tg", 128, ubatch, *kv)),
        "tg_at_depth": model.predict(meta, Run(n, depth, "tg", 128, ubatch, *kv)),
        "pp_at_depth": model.predict(meta, prefill_up_to(n, depth, ubatch, *kv)),
    }


def speed_text(p: dict[str, float] | None) -> str:
    return "unknown" if p is None else f"{p['tok_s']:.1f} tok/s ({p['low']:.1f}-{p['high']:.1f})"


def describe_speed(speed: dict[str, Any], depth: int) -> str:
    prefill = speed_text(speed["pp_at_depth"]) if speed["pp_at_depth"] else "unknown without --calibration"
    return (
        f"decode {speed_text(speed['tg_empty'])} at an empty context, {speed_text(speed['tg_at_depth'])} "
        f"at {depth} tokens; prefill {prefill}"
    )
