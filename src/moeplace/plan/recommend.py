"""`moeplace recommend`: the smallest --n-cpu-moe for each context, every device buffer counted, with the
expected speeds and ready-to-paste command lines (the allocator without the pipeline). It takes one Request
(request.py); every figure it assumes (the card's memory, the margin kept free, the bandwidths, the host's RAM) is
said with its source."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..core.backends import device_name
from ..core.config import Device, DeviceTarget, LlamacppSettings, SeedConstants
from ..core.errors import MoeplaceError
from ..core.records import JsonObject
from ..core.units import GB, Context, parse_size
from ..model.describe import structure
from ..model.memory import NO_PINS, Pins, Workload, host_bytes
from ..model.meta import Model, ModelMeta, is_seed
from ..model.metadata import from_constants, inspect_model
from ..runtime.backend import FreeMemory, gpu_free_memory
from ..runtime.cpus import split_cpus
from ..runtime.device import attached, device_setup
from ..runtime.llamacpp import provision
from ..runtime.model_ref import is_remote, ollama_version
from . import budget as budget_mod
from . import commands
from .assumed import (
    Assumptions,
    Expected,
    assumed_speed_model,
    assumptions,
    box_note,
    describe_speed,
    expected,
    margin_bytes,
    model_path,
    ram_note,
    resolve_backend,
    speed_model,
)
from .cards import card_named
from .fixes import fixes, larger_machine, longest_context
from .machine import DEFAULT_BANDWIDTHS, DEFAULT_CARD_TFLOPS
from .offload import ot_value, read_pins
from .optimal import AdviceJson, OnDevice, RankedPlacement, advise, rank_placements
from .request import Cache, Request, check_trained_context
from .several_devices import DevicesPlanJson, Speed, SplitContext, several_devices
from .speed import SpeedModel
from .unified import Pool

MAX_LONGEST = 1 << 20  # --ctx max on a model that states no trained context: the longest it looks for


def check_pins(pins: Pins, backend: str) -> None:
    """A pin to a device this plan does not have (one card: device 0 of its backend) is refused: the plan could
    not count where its tensors go."""
    device = device_name(backend, 0)
    for rule in pins.rules:
        buffer = rule.rpartition("=")[2]
        if buffer != "CPU" and buffer != device and not (backend == "rpc" and buffer.startswith("RPC")):
            raise MoeplaceError(
                f"-ot {rule!r}: this plan has one device, {device} ({backend}); pin to CPU or "
                f"{device}, or plan several cards with --vram A,B."
            )


class Plan(budget_mod.BudgetRow, total=False):
    """One context's plan (--json prints it as is): the budget, then where a model is at hand its assumptions,
    speeds, host RAM, command lines and, with --placement optimal, the ranked placements."""

    assumptions: JsonObject  # assumed.Assumptions' fields
    pins: list[str]  # the user's -ot rules
    fixes: list[str]  # where nothing fits: requests that would
    speed: Expected
    host_bytes: int
    ram_note: str | None
    command: str  # the line for the request's tool: llama-bench's with --emit bench, else llama-server's
    n_cpu_moe_by_tool: dict[str, int | None]  # server and bench: llama-bench reserves logits for a whole batch
    commands: dict[str, str]  # the line for each tool: server, bench, llama-swap, ollama (a Modelfile)
    notes: list[str]  # what a line's reader should know: why the bench line keeps another n
    placements: list[RankedPlacement]
    advice: AdviceJson  # with --placement optimal, where the plain plan's placement is ranked


@dataclass(frozen=True)
class Recommendation:
    """recommend's answer as a value: one plan per context on one device (`plans`) or over several (`split`),
    what it assumed, and the notes said before them. The CLI prints it; a Python caller reads it."""

    request: Request
    plans: tuple[Plan, ...] = ()
    split: tuple[SplitContext, ...] = ()
    name: str = ""  # the model's ("" for the seed's constants)
    structure: str | None = None  # the model's layers and experts in one line
    assumptions: Assumptions | None = None
    notes: tuple[str, ...] = ()  # said before the plans: the box's GB and, over several cards, their speeds
    rope_note: str | None = None  # past the trained context: the RoPE flags the lines carry
    vram_bytes: int = 0  # one device's size (the does-not-fit message names it)
    sizes_source: str = ""  # over several devices: where their sizes came from

    @property
    def fits(self) -> bool:
        """Every context fits."""
        return all(p["status"] == budget_mod.FITS for p in self.plans) and all(s.error is None for s in self.split)

    @property
    def fitting(self) -> list[Plan]:
        return [p for p in self.plans if p["status"] == budget_mod.FITS]

    def errors(self) -> list[str]:
        """One line per context that does not fit, each followed by its fixes ("  fix: ...")."""
        lines = [s.error for s in self.split if s.error]
        for p in self.plans:
            if p["status"] == budget_mod.FITS:
                continue
            lines.append(budget_mod.does_not_fit_message(p, self.vram_bytes))
            fixes_ = p.get("fixes", []) or (["none found: a larger card"] if self.assumptions else [])
            lines += [f"  fix: {fix}" for fix in fixes_]
        return lines

    def as_json(self) -> list[Plan] | list[DevicesPlanJson]:
        return [s.plan for s in self.split] if self.split else list(self.plans)

    def llama_swap(self) -> str | None:
        """One llama-swap config with an entry per fitting context (None: none fits)."""
        servers = {f"{self.name}-{Context(p['ctx']).label}": p["commands"]["llama-swap"] for p in self.fitting}
        return commands.llama_swap(servers) if servers else None


@dataclass(frozen=True)
class Setup:
    """A request made concrete for one model on one device: what every context's plan shares."""

    request: Request
    meta: Model
    device: Device
    a: Assumptions | None  # None: the seed's constants
    pins: Pins
    extra_bytes: int  # a vision projector's file on the device
    beside: budget_mod.Beside = budget_mod.NOTHING_BESIDE  # a draft, a unified-memory pool (`device`: its cap)

    @property
    def backend(self) -> str:
        return self.a.backend if self.a else ""

    @property
    def header(self) -> ModelMeta:
        """The model file's header: speeds, lines and placements are a model file's (the seed's constants have none)."""
        assert not is_seed(self.meta)
        return self.meta

    @property
    def model(self) -> str:
        """The model as the request names it: a path, a URL or ollama:NAME (the seed's constants name none)."""
        assert self.request.model is not None
        return self.request.model

    def fitted(self, r: Request, ctx: int, pool: Pool | None = None) -> int | None:
        """The budget's minimum --n-cpu-moe for request `r` at `ctx` (None: nothing fits), by the estimate, its draft
        as `r` has it (a fix may drop it or change its KV types); `pool`: on another unified-memory machine."""
        beside = self.beside.asked(r.draft, pool)
        device = Device(pool.cap_bytes, self.device.kept_free) if pool else self.device
        w = r.workload(ctx, self.backend)
        return budget_mod.plan(self.meta, device, w, None, self.extra_bytes, self.pins, beside)["n_cpu_moe"]


def recommend(request: Request) -> Recommendation:
    """Plan the request: every context's plan with its buffers, speeds and command lines."""
    if request.constants is not None:
        return _plan_contexts(_constants(request), list(request.contexts), ())
    assert request.model is not None  # a model file, where not the constants
    meta = inspect_model(request.model)
    rope = check_trained_context(meta, request.contexts)
    sizes, where, free = _several_cards(request)
    if len(sizes) > 1:
        backend = resolve_backend(request)[0]
        margin = margin_bytes(request, backend)[0]
        speed, said = cards_speed(request, meta, backend)
        split = several_devices(request, meta, sizes, backend, margin, model_path(meta, request.model), speed)
        notes = (said,) if said else ()
        return Recommendation(request, split=tuple(split), name=meta.name, notes=notes, sizes_source=where)
    a = assumptions(request, free)  # --vram auto's memory read once: the plan and its note agree
    pins = read_pins(meta, list(request.overrides))
    check_pins(pins, a.backend)
    extra = Path(request.mmproj).stat().st_size if request.mmproj else 0
    beside = budget_mod.Beside(request.draft.read(request.model), a.pool)
    setup = Setup(request, meta, Device(a.vram_bytes, a.margin_bytes), a, pins, extra, beside)
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
    return replace(_plan_contexts(setup, contexts, tuple(filter(None, [box_note(request)]))), rope_note=rope)


def cards_speed(request: Request, meta: ModelMeta, backend: str) -> tuple[Speed, str | None]:
    """The speeds of a plan over several cards, from --bw-vram/--bw-ddr or the defaults, and the line that says
    which (None with a calibration)."""
    s = request.speeds
    bw = (s.bw_vram_gbps or DEFAULT_BANDWIDTHS[0], s.host[0] or DEFAULT_BANDWIDTHS[1])
    tflops = s.card_tflops or DEFAULT_CARD_TFLOPS
    model = speed_model(s, meta, bw, backend, tflops)
    said = None
    if not s.calibration:
        given = "--bw-vram/--bw-ddr" if s.bw_vram_gbps or s.host[0] else "moeplace's defaults"
        said = (
            f"speeds: {bw[0]:g} GB/s and {tflops:g} TFLOPS on every card, {bw[1]:g} GB/s host RAM ({given}); "
            "efficiencies learned from published sweeps of real cards (docs/speed-prior.md)"
        )

    def speed(host: frozenset[str], w: Workload, device_hops: int) -> tuple[Expected, str]:
        expected_ = expected(meta, model, host, w, device_hops)
        return expected_, describe_speed(expected_, w.ctx)

    return speed, said


def _several_cards(request: Request) -> tuple[list[int], str, FreeMemory | None]:
    """--vram A,B,... as given, or with auto every card of this machine's free memory, in llama.cpp's order, where
    the sizes came from, and --vram auto's read. One size: a plan for one device."""
    if request.auto and not request.is_unified:  # unified: the pool is read once, by assumptions
        free = gpu_free_memory(resolve_backend(request)[0])
        cards, tool = free
        return [b for b, _ in cards], "free now on " + ", ".join(name for _, name in cards) + f" ({tool})", free
    if request.card:
        return [card_named(request.card).memory_bytes], f"--card {request.card}", None
    return [parse_size(v.strip(), "--vram") for v in request.vram or ()], "--vram, as given", None


@contextmanager
def llamacpp_compute(request: Request, pins: Pins) -> Iterator[tuple[budget_mod.Compute, budget_mod.DraftCompute]]:
    """With --reserve, llama.cpp's own compute buffer for each workload and placement (the pinned build, or
    --bin-dir's, reserving without allocating on this machine's GPU or the emulated device), and a draft model's
    for its workload; else None: the estimate (memory.estimate_compute)."""
    if not request.reserve:
        yield None, None
        return

    log_path = Path(tempfile.gettempdir()) / "moeplace-recommend.log"
    manifest = provision(LlamacppSettings(bin_dir=request.bin_dir), log_path)
    setup = device_setup(DeviceTarget("auto", "", 2**50), manifest)  # a reserve allocates nothing: no cap needed
    assert request.model is not None  # --reserve: a model file's
    with attached(setup, manifest, split_cpus(setup.kind == "emulated"), log_path) as rpc:
        main = budget_mod.reserved_compute(manifest, request.model, rpc, log_path, ",".join(pins.rules) or None)
        draft = request.draft.model and budget_mod.reserved_compute(manifest, request.draft.model, rpc, log_path)
        yield main, (lambda w: draft(w, 0)) if draft else None


def _constants(request: Request) -> Setup:
    """The seed's script: the model as totals, the overhead its own constant."""
    c = request.constants
    assert c is not None  # the constants mode's request
    sizes: SeedConstants = {"expert": f"{c.expert_gb}GB", "non_expert": f"{c.non_expert_gb}GB"}
    meta = from_constants("constants", {"layers": c.layers, **sizes, "kv_bytes_per_token": c.kv_bytes_per_token})
    return Setup(request, meta, Device(round(c.vram_gb * GB), round(c.overhead_gb * GB)), None, NO_PINS, 0)


def _plan_contexts(setup: Setup, contexts: list[int], notes: tuple[str, ...]) -> Recommendation:
    """Plan every context: its budget, then where a model is at hand its speeds, lines and placements."""
    r, meta, a = setup.request, setup.meta, setup.a
    with llamacpp_compute(r, setup.pins) as (compute, draft_compute):
        beside, device = replace(setup.beside, draft_compute=draft_compute), setup.device
        ws = [r.workload(c, setup.backend) for c in contexts]
        plans = [budget_mod.plan(meta, device, w, compute, setup.extra_bytes, setup.pins, beside) for w in ws]
    model = assumed_speed_model(r.speeds, setup.header, a) if a else None
    complete: list[Plan] = []
    for p in plans:
        complete.append(_complete(setup, Plan(**p), model))
    return Recommendation(
        r,
        tuple(complete),
        name=meta.name if a else "",
        structure=structure(setup.header) if a else None,
        assumptions=a,
        notes=notes,
        vram_bytes=setup.device.vram_bytes,
    )


def _complete(setup: Setup, p: Plan, model: SpeedModel | None) -> Plan:
    """A plan's speeds, host RAM, command lines, placements and assumptions, where it fits and a model is at hand."""
    r, a = setup.request, setup.a
    if a is None or model is None:
        return p
    meta = setup.header
    p["assumptions"] = asdict(a)
    p["pins"] = list(setup.pins.rules)
    n = p["n_cpu_moe"]
    if n is None:
        p["fixes"] = [str(fix) for fix in fixes(r, p["ctx"], setup.fitted)]
        if setup.beside.pool:
            p["fixes"] += larger_machine(lambda pool: setup.fitted(r, p["ctx"], pool) is not None, setup.backend)
        return p
    host = setup.pins.host_set(meta, n)
    p["speed"] = expected(meta, model, host, r.workload(p["ctx"], setup.backend))
    p["host_bytes"] = host_bytes(meta, host)
    p["ram_note"] = ram_note(p["host_bytes"], a)
    p["n_cpu_moe_by_tool"], p["commands"], p["notes"] = _commands(setup, p["ctx"], n)
    p["command"] = p["commands"][r.tool]
    if r.placement == "optimal":
        p["placements"] = _placements(setup, p["ctx"], model)
        if advice := advise(p["placements"], r, model):
            p["advice"] = advice.as_json(p["placements"])
    return p


def _commands(setup: Setup, ctx: int, n: int) -> tuple[dict[str, int | None], dict[str, str], list[str]]:
    """Each tool's n and line at `ctx` (the plan is for the request's tool: --emit bench plans for llama-bench),
    and why a tool's line keeps another n. llama-bench reserves logits for a whole batch where a
    server reserves them for one token per slot, so its compute buffer is larger and it may need one more layer's
    experts on the host."""
    r = setup.request
    planned = r.tool
    other = "server" if planned == "bench" else "bench"
    n_of = {planned: n, other: setup.fitted(r.with_(emit=other, json=False), ctx)}
    notes = []
    if n_of[other] != n:
        kept = "does not fit" if n_of[other] is None else f"keeps --n-cpu-moe {n_of[other]}"
        notes.append(
            f"the llama-{other} line {kept} where the llama-{planned} line keeps {n}: llama-bench reserves "
            "logits for a whole batch, llama-server for one token per slot."
        )
    lines = {}
    if n_of["server"] is not None:
        lines["server"] = _server_line(setup, ctx, n_of["server"])
        lines["llama-swap"] = _server_line(setup, ctx, n_of["server"], absolute=True)
        lines["ollama"] = _ollama(setup, ctx, n_of["server"], lines["server"])
    if n_of["bench"] is not None:
        lines["bench"] = _bench_line(setup, ctx, n_of["bench"])
    return n_of, lines, notes


def _server_line(
    setup: Setup,
    ctx: int,
    n_cpu_moe: int | None,
    overrides: str | None = None,
    cache: Cache | None = None,
    n_gpu_layers: int = 99,
    absolute: bool = False,
) -> str:
    """The llama-server line of this placement: --n-cpu-moe n, an -ot placement's own patterns after the pins, or
    a whole-layer split's -ngl (n None); `cache`: a ranked placement's own KV type and ubatch (else the request's).
    `absolute`: the files by absolute path, for a tool that starts the server from its own folder (llama-swap)."""
    r = setup.request
    mmproj = str(Path(r.mmproj).resolve()) if r.mmproj and absolute else r.mmproj
    draft = str(Path(r.draft.model).resolve()) if r.draft.model and absolute else r.draft.model
    flags = commands.request_flags(setup.header, ctx, mmproj, r.no_kv_offload, spec=setup.beside.spec_args(draft))
    rules = (*setup.pins.rules, *([overrides] if overrides else []))
    path, n = model_path(setup.header, setup.model), None if overrides else n_cpu_moe
    if absolute and not is_remote(path):
        path = str(Path(path).resolve())
    return commands.llama_server(path, ctx, n, cache or r.cache(), rules, flags, n_gpu_layers)


def _bench_line(setup: Setup, ctx: int, n_cpu_moe: int) -> str:
    r = setup.request
    flags = commands.request_flags(setup.header, ctx, r.mmproj, r.no_kv_offload, "bench")
    path, pins = model_path(setup.header, setup.model), list(setup.pins.rules)
    return commands.llama_bench(path, ctx, n_cpu_moe, r.cache(), pins, extra=flags)


def _ollama(setup: Setup, ctx: int, n_cpu_moe: int, server_line: str) -> str:
    """The Ollama Modelfile for one context (Ollama's own name for a model it pulled, else the file)."""
    r = setup.request
    ref = r.model_ref or setup.model
    source = ref.removeprefix("ollama:") if ref.startswith("ollama:") else setup.model
    flags = commands.request_flags(
        setup.header, ctx, r.mmproj, r.no_kv_offload, spec=setup.beside.spec_args(r.draft.model)
    )
    pins = list(setup.pins.rules)
    return commands.ollama_modelfile(source, ctx, n_cpu_moe, r.cache(), pins, ollama_version(), server_line, flags)


def _placements(setup: Setup, ctx: int, model: SpeedModel) -> list[RankedPlacement]:
    """--placement optimal's ranked placements at `ctx`, each with its -ot value (the plan's own patterns; the
    user's pins stay as written, before them) and its llama-server line."""

    on = OnDevice(setup.header, setup.device, setup.backend, setup.extra_bytes, setup.pins, setup.beside)
    ranked = rank_placements(on, setup.request, ctx, model)
    for row in ranked:
        rest = set(row["host_tensors"]) - setup.pins.host
        row["override_tensor"] = (ot_value(rest, separator=",") or None) if row["placement"] == "optimal" else None
        cache = setup.request.cache((row["type_k"], row["type_v"]), row["ubatch"])
        ngl = row.get("n_gpu_layers", 99)
        row["command"] = _server_line(setup, ctx, row["n_cpu_moe"], row["override_tensor"], cache, ngl)
    return ranked
