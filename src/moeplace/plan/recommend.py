"""`moeplace recommend`: the smallest --n-cpu-moe for each context, every device buffer counted, with the
expected speeds and ready-to-paste command lines (the allocator without the pipeline). Every figure it assumes
(the card's memory, the margin kept free, the bandwidths, the host's RAM) is said with its source."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.config import Device
from ..core.errors import MoeplaceError
from ..core.units import GB, parse_size
from ..model.memory import NO_PINS, SERVER, Pins, Workload, host_bytes
from ..model.metadata import from_constants, inspect_model, structure
from ..runtime.llamacpp_args import needs_flash_attn
from . import budget as budget_mod
from . import commands
from .devices import Speed, several_devices
from .machine import DEFAULT_BANDWIDTHS, DEFAULT_CARD_TFLOPS, DEFAULT_LINK_GBPS, given_host, host_ram, this_machine
from .offload import read_pins

MAX_CONTEXT = 10_000_000  # no GGUF model has a trained context this long: a typo, not a plan


@dataclass(frozen=True)
class Assumptions:
    """What a plan takes as given, each with where it comes from (printed with the plan, kept in its JSON)."""

    backend: str
    backend_source: str
    vram_bytes: int
    vram_source: str
    margin_bytes: int
    margin_source: str
    bw_vram_gbps: float | None
    bw_ddr_gbps: float | None
    card_tflops: float | None
    speed_source: str
    ram_bytes: int | None
    ram_source: str
    ddr_measured: bool = False  # bw_ddr_gbps was measured (--bw-ddr-measured, --vram auto), not a datasheet's


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
    if max(values) > MAX_CONTEXT:
        raise MoeplaceError(f"{flag}: {max(values)} tokens is beyond any model's context; give e.g. 8192,32768.")
    return values


def parse_objective(text: str) -> str:
    """decode, prefill or mix:W (0 < W < 1, the share of decode tokens)."""
    if text in ("decode", "prefill"):
        return text
    kind, _, weight = text.partition(":")
    try:
        ok = kind == "mix" and 0 < float(weight) < 1
    except ValueError:
        ok = False
    if not ok:
        raise MoeplaceError(
            f"--objective {text}: use decode, prefill or mix:W, W the share of decode tokens between 0 and 1 "
            "(e.g. mix:0.8)."
        )
    return text


def check_inputs(args: argparse.Namespace) -> None:
    """Every flag recommend reads, before anything is printed: one line naming the flag and what to give."""
    for flag, value, least in (("--parallel", args.parallel, 1), ("--ubatch", args.ubatch, 1),
                               ("--margin", args.margin, 0)):  # fmt: skip
        if value is not None and value < least:
            raise MoeplaceError(f"{flag} {value}: must be at least {least}.")
    for flag, value in (("--bw-vram", args.bw_vram_gbps), ("--bw-ddr", args.bw_ddr_gbps),
                        ("--bw-link", args.bw_link_gbps)):  # fmt: skip
        if value is not None and not value > 0:
            raise MoeplaceError(f"{flag} {value}: a bandwidth is a positive number of GB/s, e.g. 448.")
    if args.card_tflops is not None and not args.card_tflops > 0:
        raise MoeplaceError(
            f"--card-tflops {args.card_tflops}: a card's FP32 throughput is a positive number, e.g. 48.7."
        )
    args.objective = parse_objective(args.objective)
    if args.mmproj and not Path(args.mmproj).is_file():
        raise MoeplaceError(f"--mmproj {args.mmproj}: no such file; give the projector .gguf the server loads.")
    if args.flash_attn == "off" and needs_flash_attn(args.cache_type_v):
        raise MoeplaceError(f"--cache-type-v {args.cache_type_v} needs flash attention: drop --flash-attn off.")
    if args.emit == "ollama" and len(parse_contexts(args.ctx)) > 1:
        raise MoeplaceError("--emit ollama: a Modelfile holds one context; give one --ctx value per Modelfile.")


def check_context(meta: dict[str, Any], contexts: list[int]) -> None:
    trained = meta.get("n_ctx_train") or 0
    if trained and max(contexts) > trained:
        raise MoeplaceError(
            f"--ctx {max(contexts)}: beyond {meta['name']}'s trained context of {trained} tokens; llama.cpp would "
            "need RoPE scaling (--rope-scaling yarn) and the model may not cope. Give at most "
            f"{trained}."
        )


def _backend(args: argparse.Namespace) -> tuple[str, str]:
    """The card's backend: --backend, else the GPU this machine shows, else CUDA's (the most common) assumed."""
    if args.backend != "auto":
        return args.backend, "--backend"
    from ..runtime.backend import detected_gpu_backend

    found = detected_gpu_backend()
    if found:
        return found, "the GPU on this machine"
    return "cuda", "no GPU here to ask: CUDA assumed; --backend for another"


def _vram(args: argparse.Namespace, backend: str) -> tuple[int, str, str | None]:
    """The card's bytes, where they come from, and the card's name where this machine's card was read."""
    if args.vram != "auto":
        given = f"--vram {args.vram}, as given"
        if args.vram.strip().upper().endswith("GB"):  # cards sold as "16 GB" hold 16 GiB
            given += f"; a card sold as {args.vram} holds {args.vram[:-2].strip()}GiB"
        return parse_size(args.vram, "--vram"), given, None
    from ..runtime.backend import free_gpu_memory

    free, card, what = free_gpu_memory(backend)
    return free, f"free on {what} now (--vram auto)", card


def given_speeds(args: argparse.Namespace) -> tuple[float, float, float]:
    """--bw-vram, --bw-ddr and --card-tflops, moeplace's defaults for those not given."""
    vram, ddr = DEFAULT_BANDWIDTHS
    return args.bw_vram_gbps or vram, given_host(args)[0] or ddr, args.card_tflops or DEFAULT_CARD_TFLOPS


def assumptions(args: argparse.Namespace) -> Assumptions:
    """The card, the margin, the bandwidths and the host's RAM the plan assumes, with their sources."""
    backend, backend_source = _backend(args)
    vram, vram_source, card = _vram(args, backend)
    if args.margin is not None:
        margin, margin_source = args.margin * 2**20, "--margin"
    else:
        margins = budget_mod.AUTO_MARGIN_MIB if args.vram == "auto" else budget_mod.DEFAULT_MARGIN_MIB
        margin = margins[backend] * 2**20
        margin_source = f"{backend}'s default: what real cards used beyond llama.cpp's buffers, docs/real-cards.md"
    tflops, (host, measured) = None, given_host(args)
    if getattr(args, "calibration", None):
        speed = f"fitted to your runs ({args.calibration})"
        bw = (None, None)
    elif args.bw_vram_gbps or host:
        bw = given_speeds(args)[:2]
        given = all((args.bw_vram_gbps, host))
        flag = "--bw-ddr-measured" if measured else "--bw-ddr"
        speed = f"--bw-vram/{flag} as given" + ("" if given else ", the other moeplace's default")
        speed += "" if args.card_tflops else "; TFLOPS moeplace's default, --card-tflops for yours"
    elif card:
        *bw, tflops, speed, measured = this_machine(card)
    else:
        bw = DEFAULT_BANDWIDTHS
        speed = "moeplace's defaults, the seed's workstation; --bw-vram/--bw-ddr/--card-tflops for yours"
    if not getattr(args, "calibration", None):
        if args.card_tflops:
            speed = f"{speed}; --card-tflops as given"
        tflops = args.card_tflops or tflops or DEFAULT_CARD_TFLOPS
        speed += "; efficiencies learned from published sweeps of real cards (docs/speed-prior.md)"
    ram, ram_source = host_ram(args.ram)
    return Assumptions(backend, backend_source, vram, vram_source, margin, margin_source, *bw, tflops, speed, ram,
                       ram_source, measured)  # fmt: skip


def speed_model(  # noqa: ANN201
    args: argparse.Namespace, meta: dict[str, Any], bw: tuple[float | None, float | None] | None = None,
    backend: str = "cuda", tflops: float | None = None, host_measured: bool | None = None,
):  # fmt: skip
    """--calibration's fitted model, else the prior learned from published sweeps (--prior's, else the shipped one)
    for these bandwidths (the host's measured or a datasheet's: `host_measured`, else as the flags say) and card
    compute (FP32 TFLOPS: `tflops`, else --card-tflops, else moeplace's default)."""
    from .learned_prior import Machine
    from .learned_prior import speed_model as learned
    from .prior_learn import load_prior
    from .speed import SpeedModel

    if getattr(args, "calibration", None):
        try:
            data = json.loads(Path(args.calibration).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise MoeplaceError(f"--calibration {args.calibration}: cannot read it ({e}).") from None
        return SpeedModel.from_json(data, f"--calibration {args.calibration}")
    *given_bw, given_tflops = given_speeds(args)
    vram, ddr = bw or given_bw
    measured = given_host(args)[1] if host_measured is None else host_measured
    machine = Machine(backend, vram, ddr, args.bw_link_gbps or DEFAULT_LINK_GBPS, tflops or given_tflops, measured)
    return learned(meta, machine, load_prior(getattr(args, "prior", None)))


def expected(meta: dict[str, Any], model: Any, host: frozenset[str], depth: int, args: argparse.Namespace,
             device_hops: int = 0) -> dict:  # fmt: skip
    """Decode at an empty context and at `depth`, prefill of a prompt's last batch up to `depth`, with these expert
    tensors in host RAM (and over several cards, `device_hops` card boundaries): tok/s with ~95% intervals (None:
    unknown)."""
    from .speed import Run, prefill_up_to

    kv = (args.cache_type_k, args.cache_type_v)
    ubatch = getattr(args, "ubatch", 512)
    return {
        "tg_empty": model.predict(meta, Run(0, 0, "tg", 128, ubatch, *kv, host, device_hops=device_hops)),
        "tg_at_depth": model.predict(meta, Run(0, depth, "tg", 128, ubatch, *kv, host, device_hops=device_hops)),
        "pp_at_depth": model.predict(meta, prefill_up_to(0, depth, ubatch, *kv, host)),
    }


def speed_text(p: dict[str, float] | None) -> str:
    return "unknown" if p is None else f"{p['tok_s']:.1f} tok/s ({p['low']:.1f}-{p['high']:.1f})"


def describe_speed(speed: dict[str, Any], depth: int) -> str:
    prefill = speed_text(speed["pp_at_depth"]) if speed["pp_at_depth"] else "unknown without --calibration"
    return (
        f"decode {speed_text(speed['tg_empty'])} at an empty context, {speed_text(speed['tg_at_depth'])} "
        f"at {depth} tokens; prefill {prefill} (~95% intervals)"
    )


def ram_note(needed: int, a: Assumptions) -> str | None:
    """A warning where the host's RAM cannot hold what the plan leaves there (seed 004's third tier)."""
    if a.ram_bytes is None or needed <= 0.9 * a.ram_bytes:
        return None
    return (
        f"warning: {needed / GB:.1f} GB stay in host RAM, near or beyond its {a.ram_bytes / GB:.1f} GB "
        f"({a.ram_source}): llama.cpp maps the rest from disk and reads those experts at disk speed every token "
        "(decode falls to the disk's bandwidth: seed 004's third tier)."
    )


def model_path(meta: dict[str, Any], given: str) -> str:
    """The path llama.cpp loads: a split model's first shard, whichever shard was given."""
    files = meta.get("files") or []
    return files[0]["path"] if files and not given.startswith(("http://", "https://")) else given


def cmd_recommend(args: argparse.Namespace) -> int:
    check_inputs(args)
    contexts = parse_contexts(args.ctx)
    if args.placement == "optimal" and not args.model:
        raise MoeplaceError("--placement optimal needs a MODEL.gguf: it places individual expert tensors.")
    emit = "json" if args.json else args.emit
    if emit not in ("server", "json") and not args.model:
        raise MoeplaceError(f"--emit {emit} needs a MODEL.gguf (or ollama:/lmstudio:/hf: reference).")
    if args.model:
        meta = inspect_model(args.model)
        if args.vram is None:
            raise MoeplaceError("--vram is required: the card's memory (e.g. --vram 16GB), or auto for this GPU's.")
        check_context(meta, contexts)
        sizes, where = _several_cards(args)
        if len(sizes) > 1:
            margins = budget_mod.AUTO_MARGIN_MIB if args.vram == "auto" else budget_mod.DEFAULT_MARGIN_MIB
            return several_devices(args, meta, contexts, emit, sizes, where, _backend(args)[0], margins,
                                   model_path(meta, args.model), cards_speed(args, meta, emit))  # fmt: skip
        a = assumptions(args)
        device = Device(a.vram_bytes, a.margin_bytes)
        pins = read_pins(meta, args.override_tensor)
    else:
        meta, device, a, pins = _constants(args)
    extra = Path(args.mmproj).stat().st_size if args.mmproj else 0
    # A server reserves logits for one token per slot; llama-bench (what --emit bench prints) for a whole batch.
    outputs = "batch" if args.emit == "bench" else SERVER  # --json prints the plan for the --emit tool
    offload = a is not None and a.backend in budget_mod.OP_OFFLOAD
    workloads = [Workload(c, args.ubatch, args.flash_attn, args.cache_type_k, args.cache_type_v, args.parallel, outputs,
                          offload) for c in contexts]  # fmt: skip
    with llamacpp_compute(args, pins) as compute:
        plans = [budget_mod.plan(meta, device, w, compute, extra, pins) for w in workloads]
    model = (
        speed_model(args, meta, (a.bw_vram_gbps, a.bw_ddr_gbps), a.backend, a.card_tflops, a.ddr_measured)
        if a
        else None
    )
    for p in plans:
        _complete(p, meta, model, pins, a, args)
    return _output(emit, meta, plans, workloads, device, model, pins, a, args)


def cards_speed(args: argparse.Namespace, meta: dict[str, Any], emit: str) -> Speed:
    """The speeds of a plan over several cards, from --bw-vram/--bw-ddr or the defaults (said once)."""
    *bw, tflops = given_speeds(args)
    model = speed_model(args, meta, tuple(bw), _backend(args)[0], tflops)
    if emit == "server" and not getattr(args, "calibration", None):
        given = "--bw-vram/--bw-ddr" if args.bw_vram_gbps or args.bw_ddr_gbps else "moeplace's defaults"
        print(f"speeds: {bw[0]:g} GB/s and {tflops:g} TFLOPS on every card, {bw[1]:g} GB/s host RAM ({given}); "
              "efficiencies learned from published sweeps of real cards (docs/speed-prior.md)")  # fmt: skip

    def speed(host: frozenset[str], ctx: int, device_hops: int) -> tuple[dict[str, Any], str]:
        expected_ = expected(meta, model, host, ctx, args, device_hops)
        return expected_, describe_speed(expected_, ctx)

    return speed


def _several_cards(args: argparse.Namespace) -> tuple[list[int], str]:
    """--vram A,B,... as given, or with auto every card of this machine's free memory, in llama.cpp's order, and
    where the sizes came from. One size: a plan for one device."""
    if args.vram == "auto":
        from ..runtime.backend import gpu_free_memory

        cards, tool = gpu_free_memory(_backend(args)[0])
        return [free for free, _ in cards], "free now on " + ", ".join(name for _, name in cards) + f" ({tool})"
    return [parse_size(v.strip(), "--vram") for v in args.vram.split(",")], "--vram, as given"


@contextmanager
def llamacpp_compute(args: argparse.Namespace, pins: Pins) -> Iterator[budget_mod.Compute]:
    """With --reserve, llama.cpp's own compute buffer for each workload and placement (the pinned build, or
    --bin-dir's, reserving without allocating on this machine's GPU or the emulated device); else None: the
    estimate (memory.estimate_compute)."""
    if not getattr(args, "reserve", False):
        yield None
        return
    from ..core.config import DeviceTarget
    from ..runtime.cpus import split_cpus
    from ..runtime.device import attached, device_setup
    from ..runtime.llamacpp import PINNED, provision

    log_path = Path(tempfile.gettempdir()) / "moeplace-recommend.log"
    manifest = provision({"bin_dir": args.bin_dir} if args.bin_dir else PINNED, log_path)
    setup = device_setup(DeviceTarget("auto", "", 2**50), manifest)  # a reserve allocates nothing: no cap needed
    with attached(setup, manifest, split_cpus(setup.kind == "emulated"), log_path) as rpc:
        yield budget_mod.reserved_compute(manifest, args.model, rpc, log_path, ",".join(pins.rules) or None)


def _constants(args: argparse.Namespace) -> tuple[dict[str, Any], Device, None, Pins]:
    """The seed's script: the model as totals, the overhead its own constant."""
    missing = [f for f in ("vram_gb", "non_expert_gb", "expert_gb", "layers", "kv_bytes_per_token")
               if getattr(args, f) is None]  # fmt: skip
    if missing:
        raise MoeplaceError(
            "give a MODEL.gguf, or all of "
            + ", ".join("--" + m.replace("_", "-") for m in missing)
            + " for the constants mode."
        )
    sizes = {"expert": f"{args.expert_gb}GB", "non_expert": f"{args.non_expert_gb}GB"}
    meta = from_constants("constants", {"layers": args.layers, **sizes, "kv_bytes_per_token": args.kv_bytes_per_token})
    return meta, Device(round(args.vram_gb * GB), round(args.overhead_gb * GB)), None, NO_PINS


def _complete(p: dict[str, Any], meta: dict[str, Any], model: Any, pins: Pins, a: Assumptions | None,
              args: argparse.Namespace) -> None:  # fmt: skip
    """A plan's speeds, host RAM and assumptions, where it fits and a model file is at hand."""
    if a is None:
        return
    p["assumptions"] = asdict(a)
    p["pins"] = list(pins.rules)
    if p["n_cpu_moe"] is None:
        return
    host = pins.host_set(meta, p["n_cpu_moe"])
    p["speed"] = expected(meta, model, host, p["ctx"], args)
    p["host_bytes"] = host_bytes(meta, host)
    p["ram_note"] = ram_note(p["host_bytes"], a)


def _output(emit: str, meta: dict[str, Any], plans: list[dict[str, Any]], workloads: list[Workload],
            device: Device, model: Any, pins: Pins, a: Assumptions | None,
            args: argparse.Namespace) -> int:  # fmt: skip
    if emit == "json":
        json.dump(plans, sys.stdout, indent=1)
        print()
    failed = [p for p in plans if p["status"] != budget_mod.FITS]
    for p in failed:
        print(f"moeplace: {budget_mod.does_not_fit_message(p, device.vram_bytes)}", file=sys.stderr)
        if args.explain and args.model:
            w = next(w for w in workloads if w.ctx == p["ctx"])
            extra = Path(args.mmproj).stat().st_size if args.mmproj else 0
            for fix in budget_mod.fixes(meta, device, w, None, extra, pins) or ["none found: a larger card"]:
                print(f"  fix: {fix}", file=sys.stderr)
    fitting = [p for p in plans if p["status"] == budget_mod.FITS]
    if emit == "server":
        if a:
            print(f"{meta['name']}: {structure(meta)}")
            print(describe_assumptions(a))
        for p in fitting:
            _print_plan(meta, model, device, p, pins, args)
    elif emit == "llama-swap" and fitting:
        print(commands.llama_swap({f"{meta['name']}-{_label(p['ctx'])}": _server_line(meta, p, pins, args)
                                   for p in fitting}), end="")  # fmt: skip
    elif emit == "bench":
        for p in fitting:
            print(_bench_line(meta, p, pins, args))
    elif emit == "ollama" and fitting:
        print(_ollama(meta, fitting[0], pins, args), end="")
    return 1 if failed else 0


def describe_assumptions(a: Assumptions) -> str:
    ram = f"{a.ram_bytes / GB:.1f} GB ({a.ram_source})" if a.ram_bytes else a.ram_source
    bandwidths = ""
    if a.bw_vram_gbps:
        bandwidths = f"{a.bw_vram_gbps:g} GB/s and {a.card_tflops:g} TFLOPS card, {a.bw_ddr_gbps:g} GB/s host, "
    return "\n".join([
        "assumed:",
        f"  card: {a.backend} ({a.backend_source}), {a.vram_bytes / GB:.2f} GB ({a.vram_source})",
        f"  margin: {a.margin_bytes / 2**20:.0f} MiB kept free ({a.margin_source})",
        f"  speeds: {bandwidths}{a.speed_source}",
        f"  host RAM: {ram}",
    ])  # fmt: skip


def _label(ctx: int) -> str:
    from ..core.units import Context

    return Context(ctx).label


def _server_line(meta: dict[str, Any], p: dict[str, Any], pins: Pins, args: argparse.Namespace,
                 overrides: str | None = None) -> str:  # fmt: skip
    kv = (args.cache_type_k, args.cache_type_v)
    return commands.llama_server(model_path(meta, args.model), p["ctx"], p["n_cpu_moe"], *kv, overrides,
                                 args.flash_attn, args.ubatch, args.parallel, list(pins.rules))  # fmt: skip


def _bench_line(meta: dict[str, Any], p: dict[str, Any], pins: Pins, args: argparse.Namespace) -> str:
    kv = (args.cache_type_k, args.cache_type_v)
    return commands.llama_bench(model_path(meta, args.model), p["ctx"], p["n_cpu_moe"], *kv, args.flash_attn,
                                args.ubatch, list(pins.rules))  # fmt: skip


def _ollama(meta: dict[str, Any], p: dict[str, Any], pins: Pins, args: argparse.Namespace) -> str:
    from ..runtime.model_ref import ollama_version

    source = args.model_ref.removeprefix("ollama:") if args.model_ref.startswith("ollama:") else args.model
    kv = (args.cache_type_k, args.cache_type_v)
    return commands.ollama_modelfile(source, p["ctx"], p["n_cpu_moe"], *kv, list(pins.rules), ollama_version(),
                                     _server_line(meta, p, pins, args))  # fmt: skip


def _print_plan(meta: dict[str, Any], model: Any, device: Any, p: dict[str, Any], pins: Pins,
                args: argparse.Namespace) -> None:  # fmt: skip
    """One context's plan as text: the buffers, the n, the server line and the expected speeds."""
    print(
        f"ctx={p['ctx']:>6}  KV={p['kv_bytes'] / GB:5.2f} GB  "
        + (
            f"compute={p['compute_bytes'] / GB:5.2f} GB ({p['compute_source']})  "
            if p["compute_bytes"] is not None
            else ""
        )
        + f"budget={p['budget_bytes'] / GB:5.2f} GB  "
        f"resident_layers={p['resident_layers']:>2}  --n-cpu-moe {p['n_cpu_moe']}"
    )
    if args.model:
        print("  " + _server_line(meta, p, pins, args))
        print("  expected: " + describe_speed(p["speed"], p["ctx"]))
        print(f"  host RAM: {p['host_bytes'] / GB:.2f} GB of weights stay there")
        if p["ram_note"]:
            print("  " + p["ram_note"])
    if args.placement == "optimal":
        _print_optimal(meta, model, device, p["ctx"], pins, args)


def _print_optimal(meta: dict[str, Any], model: Any, device: Any, ctx: int, pins: Pins,
                   args: argparse.Namespace) -> None:  # fmt: skip
    """The feasible placements and KV cache types at this context, best first by --objective."""
    from .offload import host_layers, ot_value, rank_placements

    kv_types = list(dict.fromkeys([(args.cache_type_k, args.cache_type_v), ("q8_0", "q8_0")]))
    ubatches = list(dict.fromkeys([args.ubatch, 512, 2048]))  # yours first: it wins ties
    ranked = rank_placements(meta, device, ctx, model, args.objective, kv_types, ubatches, pins)
    if not ranked or ranked[0]["score"] is None:
        why = "the speed model gives no prefill" if args.objective != "decode" else "nothing fits"
        print(f"  placements by {args.objective}: cannot rank ({why}).")
        return
    print(f"  placements by {args.objective} at {ctx} tokens, best first; '~' marks those the speed model cannot "
          "tell from the best (its uncertainty on a ratio), of which yours as given leads:")  # fmt: skip
    for r in ranked:
        tensors, layers = len(r["host_tensors"]), len(host_layers(r["host_tensors"]))
        what = (f"--n-cpu-moe {r['n_cpu_moe']}" if r["placement"] == "ncmoe"
                else f"-ot ({tensors} expert tensors on the host, in {layers} layers)")  # fmt: skip
        print(f"  {'~' if r['equivalent'] else ' '} {what}, KV {r['type_k']}/{r['type_v']}, -ub {r['ubatch']}: "
              f"decode {speed_text(r['tg'])}, prefill {speed_text(r['pp'])}")  # fmt: skip
    best = ranked[0]
    # The user's pins stay as written (they match first); the plan's own patterns name the rest of its host set.
    rest = set(best["host_tensors"]) - pins.host
    overrides = (ot_value(rest, separator=",") or None) if best["placement"] != "ncmoe" else None
    kv = (best["type_k"], best["type_v"])
    line = commands.llama_server(model_path(meta, args.model), ctx, best["n_cpu_moe"], *kv, overrides,
                                 args.flash_attn, best["ubatch"], args.parallel, list(pins.rules))  # fmt: skip
    print("  " + line)
