"""`moeplace recommend`: the smallest --n-cpu-moe for each context, every device buffer counted, with the
expected speeds and ready-to-paste command lines (the allocator without the pipeline). It takes one Request
(request.py); every figure it assumes (the card's memory, the margin kept free, the bandwidths, the host's RAM) is
said with its source."""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.config import Device, DeviceTarget, LlamacppSettings
from ..core.errors import MoeplaceError
from ..core.records import JsonObject
from ..core.units import GB, Context, parse_size
from ..model.describe import structure
from ..model.memory import NO_PINS, Pins, Workload, host_bytes
from ..model.meta import ModelMeta
from ..model.metadata import from_constants, inspect_model
from ..runtime.backend import FreeMemory, gpu_free_memory
from ..runtime.cpus import split_cpus
from ..runtime.device import attached, device_setup
from ..runtime.llamacpp import provision
from ..runtime.model_ref import ollama_version
from . import budget as budget_mod
from . import commands
from .assumed import (
    Assumptions,
    Expected,
    assumptions,
    box_note,
    describe_speed,
    expected,
    margin_bytes,
    model_path,
    ram_note,
    resolve_backend,
    speed_model,
    speed_text,
)
from .cards import card_named
from .fixes import fixes, longest_context
from .machine import DEFAULT_BANDWIDTHS, DEFAULT_CARD_TFLOPS
from .offload import host_layers, ot_value, read_pins
from .optimal import OnDevice, RankedPlacement, rank_placements
from .request import DEVICE_PREFIX, Cache, Request, check_trained_context
from .several_devices import Speed, several_devices

MAX_LONGEST = 1 << 20  # --ctx max on a model that states no trained context: the longest it looks for


def check_pins(pins: Pins, backend: str) -> None:
    """A pin to a device this plan does not have (one card: device 0 of its backend) is refused: the plan could
    not count where its tensors go."""
    device = f"{DEVICE_PREFIX[backend]}0"
    for rule in pins.rules:
        buffer = rule.rpartition("=")[2]
        if buffer != "CPU" and buffer != device and not (backend == "rpc" and buffer.startswith("RPC")):
            raise MoeplaceError(
                f"-ot {rule!r}: this plan has one device, {device} ({backend}); pin to CPU or "
                f"{device}, or plan several cards with --vram A,B."
            )


class Plan(budget_mod.BudgetRow, total=False):
    """One context's plan as recommend prints it (--json: as is): the budget, then where a model is at hand its
    assumptions, speeds, host RAM, command line and, with --placement optimal, the ranked placements."""

    assumptions: JsonObject  # assumed.Assumptions' fields
    pins: list[str]  # the user's -ot rules
    fixes: list[str]  # where nothing fits: requests that would
    speed: Expected
    host_bytes: int
    ram_note: str | None
    command: str
    placements: list[RankedPlacement]


@dataclass(frozen=True)
class Setup:
    """A request made concrete for one model on one device: what every context's plan shares."""

    request: Request
    meta: ModelMeta
    device: Device
    a: Assumptions | None  # None: the seed's constants
    pins: Pins
    extra_bytes: int  # a vision projector's file on the device

    @property
    def backend(self) -> str:
        return self.a.backend if self.a else ""

    def fitted(self, r: Request, ctx: int) -> int | None:
        """The budget's minimum --n-cpu-moe for request `r` at `ctx` (None: nothing fits), by the estimate."""
        return budget_mod.plan(
            self.meta, self.device, r.workload(ctx, self.backend), None, self.extra_bytes, self.pins
        )["n_cpu_moe"]


def recommend(request: Request) -> int:
    """Plan the request, print what --emit asks for; 1 where some context does not fit."""
    if request.constants is not None:
        return _output(_constants(request), list(request.contexts), None)
    meta = inspect_model(request.model)
    rope = check_trained_context(meta, request.contexts)
    sizes, where, free = _several_cards(request)
    if len(sizes) > 1:
        backend = resolve_backend(request)[0]
        margin = margin_bytes(request, backend)[0]
        return several_devices(
            request,
            meta,
            sizes,
            where,
            backend,
            margin,
            model_path(meta, request.model),
            cards_speed(request, meta, backend),
        )
    a = assumptions(request, free)  # --vram auto's memory read once: the plan and its note agree
    pins = read_pins(meta, list(request.overrides))
    check_pins(pins, a.backend)
    extra = Path(request.mmproj).stat().st_size if request.mmproj else 0
    setup = Setup(request, meta, Device(a.vram_bytes, a.margin_bytes), a, pins, extra)
    contexts = list(request.contexts)
    if request.longest:
        limit = meta.n_ctx_train or MAX_LONGEST
        found = longest_context(request, limit, setup.fitted)
        if found is None:
            raise MoeplaceError(
                f"--ctx max: no context fits {a.vram_bytes / GB:.2f} GB even with every expert on "
                "the host; see the fixes with a short --ctx, e.g. --ctx 4096."
            )
        contexts = [found]
    return _output(setup, contexts, rope)


def cards_speed(request: Request, meta: ModelMeta, backend: str) -> Speed:
    """The speeds of a plan over several cards, from --bw-vram/--bw-ddr or the defaults (said once)."""
    s = request.speeds
    bw = (s.bw_vram_gbps or DEFAULT_BANDWIDTHS[0], s.host[0] or DEFAULT_BANDWIDTHS[1])
    tflops = s.card_tflops or DEFAULT_CARD_TFLOPS
    model = speed_model(s, meta, bw, backend, tflops)
    if request.emit == "server" and not request.as_json and not s.calibration:
        given = "--bw-vram/--bw-ddr" if s.bw_vram_gbps or s.host[0] else "moeplace's defaults"
        print(
            f"speeds: {bw[0]:g} GB/s and {tflops:g} TFLOPS on every card, {bw[1]:g} GB/s host RAM ({given}); "
            "efficiencies learned from published sweeps of real cards (docs/speed-prior.md)"
        )

    def speed(host: frozenset[str], w: Workload, device_hops: int) -> tuple[Expected, str]:
        expected_ = expected(meta, model, host, w, device_hops)
        return expected_, describe_speed(expected_, w.ctx)

    return speed


def _several_cards(request: Request) -> tuple[list[int], str, FreeMemory | None]:
    """--vram A,B,... as given, or with auto every card of this machine's free memory, in llama.cpp's order, where
    the sizes came from, and --vram auto's read. One size: a plan for one device."""
    if request.auto:
        free = gpu_free_memory(resolve_backend(request)[0])
        cards, tool = free
        return [b for b, _ in cards], "free now on " + ", ".join(name for _, name in cards) + f" ({tool})", free
    if request.card:
        return [card_named(request.card).memory_bytes], f"--card {request.card}", None
    return [parse_size(v.strip(), "--vram") for v in request.vram or ()], "--vram, as given", None


@contextmanager
def llamacpp_compute(request: Request, pins: Pins) -> Iterator[budget_mod.Compute]:
    """With --reserve, llama.cpp's own compute buffer for each workload and placement (the pinned build, or
    --bin-dir's, reserving without allocating on this machine's GPU or the emulated device); else None: the
    estimate (memory.estimate_compute)."""
    if not request.reserve:
        yield None
        return

    log_path = Path(tempfile.gettempdir()) / "moeplace-recommend.log"
    manifest = provision(LlamacppSettings(bin_dir=request.bin_dir), log_path)
    setup = device_setup(DeviceTarget("auto", "", 2**50), manifest)  # a reserve allocates nothing: no cap needed
    with attached(setup, manifest, split_cpus(setup.kind == "emulated"), log_path) as rpc:
        yield budget_mod.reserved_compute(manifest, request.model, rpc, log_path, ",".join(pins.rules) or None)


def _constants(request: Request) -> Setup:
    """The seed's script: the model as totals, the overhead its own constant."""
    c = request.constants
    sizes = {"expert": f"{c.expert_gb}GB", "non_expert": f"{c.non_expert_gb}GB"}
    meta = from_constants("constants", {"layers": c.layers, **sizes, "kv_bytes_per_token": c.kv_bytes_per_token})
    return Setup(request, meta, Device(round(c.vram_gb * GB), round(c.overhead_gb * GB)), None, NO_PINS, 0)


def _output(setup: Setup, contexts: list[int], rope: str | None) -> int:
    """Plan every context, then print what --emit asks for: 1 where some context does not fit."""
    r, meta = setup.request, setup.meta
    with llamacpp_compute(r, setup.pins) as compute:
        plans = [
            budget_mod.plan(meta, setup.device, r.workload(c, setup.backend), compute, setup.extra_bytes, setup.pins)
            for c in contexts
        ]
    a = setup.a
    model = (
        speed_model(r.speeds, meta, (a.bw_vram_gbps, a.bw_ddr_gbps), a.backend, a.card_tflops, a.ddr_measured)
        if a
        else None
    )
    for p in plans:
        _complete(setup, p, model)
    failed = [p for p in plans if p["status"] != budget_mod.FITS]
    for p in failed:
        print(f"moeplace: {budget_mod.does_not_fit_message(p, setup.device.vram_bytes)}", file=sys.stderr)
        for fix in p.get("fixes", []) or (["none found: a larger card"] if a else []):
            print(f"  fix: {fix}", file=sys.stderr)
    fitting = [p for p in plans if p["status"] == budget_mod.FITS]
    if r.as_json:
        json.dump(plans, sys.stdout, indent=1)
        print()
    elif r.emit == "server":
        _print_server(setup, fitting, rope)
    elif r.emit == "llama-swap" and fitting:
        print(commands.llama_swap({f"{meta.name}-{_label(p['ctx'])}": p["command"] for p in fitting}), end="")
    elif r.emit == "bench":
        print("\n".join(p["command"] for p in fitting))
    elif r.emit == "ollama" and fitting:
        print(_ollama(setup, fitting[0]), end="")
    return 1 if failed else 0


def _complete(setup: Setup, p: Plan, model: Any) -> None:
    """A plan's speeds, host RAM, command line, placements and assumptions, where it fits and a model is at hand."""
    r, meta, a = setup.request, setup.meta, setup.a
    if a is None:
        return
    p["assumptions"] = asdict(a)
    p["pins"] = list(setup.pins.rules)
    if p["n_cpu_moe"] is None:
        p["fixes"] = [str(fix) for fix in fixes(r, p["ctx"], setup.fitted)]
        return
    host = setup.pins.host_set(meta, p["n_cpu_moe"])
    p["speed"] = expected(meta, model, host, r.workload(p["ctx"], setup.backend))
    p["host_bytes"] = host_bytes(meta, host)
    p["ram_note"] = ram_note(p["host_bytes"], a)
    p["command"] = _bench_line(setup, p) if r.emit == "bench" else _server_line(setup, p["ctx"], p["n_cpu_moe"])
    if r.placement == "optimal":
        p["placements"] = _placements(setup, p["ctx"], model)


def _server_line(
    setup: Setup,
    ctx: int,
    n_cpu_moe: int | None,
    overrides: str | None = None,
    cache: Cache | None = None,
    n_gpu_layers: int = 99,
) -> str:
    """The llama-server line of this placement: --n-cpu-moe n, an -ot placement's own patterns after the pins, or
    a whole-layer split's -ngl (n None); `cache`: a ranked placement's own KV type and ubatch (else the request's)."""
    r = setup.request
    flags = commands.request_flags(setup.meta, ctx, r.mmproj, r.no_kv_offload)
    rules = (*setup.pins.rules, *([overrides] if overrides else []))
    path, n = model_path(setup.meta, r.model), None if overrides else n_cpu_moe
    return commands.llama_server(path, ctx, n, cache or r.cache(), rules, flags, n_gpu_layers)


def _bench_line(setup: Setup, p: Plan) -> str:
    r = setup.request
    flags = commands.request_flags(setup.meta, p["ctx"], r.mmproj, r.no_kv_offload, "bench")
    path, pins = model_path(setup.meta, r.model), list(setup.pins.rules)
    return commands.llama_bench(path, p["ctx"], p["n_cpu_moe"], r.cache(), pins, extra=flags)


def _ollama(setup: Setup, p: Plan) -> str:

    r = setup.request
    ref = r.model_ref or r.model
    source = ref.removeprefix("ollama:") if ref.startswith("ollama:") else r.model
    flags = commands.request_flags(setup.meta, p["ctx"], r.mmproj, r.no_kv_offload)
    pins = list(setup.pins.rules)
    return commands.ollama_modelfile(
        source, p["ctx"], p["n_cpu_moe"], r.cache(), pins, ollama_version(), p["command"], flags
    )


def _placements(setup: Setup, ctx: int, model: Any) -> list[RankedPlacement]:
    """--placement optimal's ranked placements at `ctx`, each with its -ot value (the plan's own patterns; the
    user's pins stay as written, before them) and its llama-server line."""

    on = OnDevice(setup.meta, setup.device, setup.backend, setup.extra_bytes, setup.pins)
    ranked = rank_placements(on, setup.request, ctx, model)
    for row in ranked:
        rest = set(row["host_tensors"]) - setup.pins.host
        row["override_tensor"] = (ot_value(rest, separator=",") or None) if row["placement"] == "optimal" else None
        cache = setup.request.cache((row["type_k"], row["type_v"]), row["ubatch"])
        ngl = row.get("n_gpu_layers", 99)
        row["command"] = _server_line(setup, ctx, row["n_cpu_moe"], row["override_tensor"], cache, ngl)
    return ranked


def _print_server(setup: Setup, fitting: list[Plan], rope: str | None) -> None:
    r, meta, a = setup.request, setup.meta, setup.a
    if note := box_note(r):
        print(note)
    if a:
        print(f"{meta.name}: {structure(meta)}")
        print(describe_assumptions(a))
    if rope:
        print(rope)
    for p in fitting:
        _print_plan(setup, p)


def describe_assumptions(a: Assumptions) -> str:
    ram = f"{a.ram_bytes / GB:.1f} GB ({a.ram_source})" if a.ram_bytes else a.ram_source
    bandwidths = ""
    if a.bw_vram_gbps:
        bandwidths = f"{a.bw_vram_gbps:g} GB/s and {a.card_tflops:g} TFLOPS card, {a.bw_ddr_gbps:g} GB/s host, "
    return "\n".join(
        [
            "assumed:",
            f"  card: {a.backend} ({a.backend_source}), {a.vram_bytes / GB:.2f} GB ({a.vram_source})",
            f"  margin: {a.margin_bytes / 2**20:.0f} MiB kept free ({a.margin_source})",
            f"  speeds: {bandwidths}{a.speed_source}",
            f"  host RAM: {ram}",
        ]
    )


def _label(ctx: int) -> str:

    return Context(ctx).label


def _print_plan(setup: Setup, p: Plan) -> None:
    """One context's plan as text: the buffers, the n, the server line and the expected speeds."""
    compute = (
        f"compute={p['compute_bytes'] / GB:5.2f} GB ({p['compute_source']})  " if p["compute_bytes"] is not None else ""
    )
    print(
        f"ctx={p['ctx']:>6}  KV={p['kv_bytes'] / GB:5.2f} GB  {compute}budget={p['budget_bytes'] / GB:5.2f} GB  "
        f"resident_layers={p['resident_layers']:>2}  --n-cpu-moe {p['n_cpu_moe']}"
    )
    if setup.a is None:
        return
    print("  " + p["command"])
    print("  expected: " + describe_speed(p["speed"], p["ctx"]))
    print(f"  host RAM: {p['host_bytes'] / GB:.2f} GB of weights stay there")
    if p["ram_note"]:
        print("  " + p["ram_note"])
    if "placements" in p:
        _print_placements(setup.request, p["ctx"], p["placements"])


def _print_placements(r: Request, ctx: int, ranked: list[RankedPlacement]) -> None:
    """The feasible placements and KV cache types at this context, best first by --objective."""
    if not ranked or ranked[0]["score"] is None:
        why = "the speed model gives no prefill" if r.objective != "decode" else "nothing fits"
        print(f"  placements by {r.objective}: cannot rank ({why}).")
        return
    print(
        f"  placements by {r.objective} at {ctx} tokens, best first; '~' marks those the speed model cannot "
        "tell from the best (its uncertainty on a ratio), of which yours as given leads:"
    )
    for row in ranked:
        tensors, layers = len(row["host_tensors"]), len(host_layers(row["host_tensors"]))
        what = {
            "ncmoe": f"--n-cpu-moe {row['n_cpu_moe']}",
            "ngl": f"-ngl {row.get('n_gpu_layers')} (whole layers on the host: decode only)",
            "optimal": f"-ot {shlex.quote(row['override_tensor'] or '')} ({tensors} expert tensors on the host, in "
            f"{layers} layers)",
        }[row["placement"]]
        print(
            f"  {'~' if row['equivalent'] else ' '} {what}, KV {row['type_k']}/{row['type_v']}, -ub {row['ubatch']}: "
            f"decode {speed_text(row['tg'])}, prefill {speed_text(row['pp'])}"
        )
    print("  " + ranked[0]["command"])
