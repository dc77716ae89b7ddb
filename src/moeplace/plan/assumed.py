"""What a plan assumes where the user does not say, each with its source: the card's backend and memory, the margin
kept free, the bandwidths and card compute behind the speeds, the host's RAM; and the speeds a placement is
expected to reach."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ..core import backends
from ..core.errors import MoeplaceError
from ..core.units import GB, parse_size
from ..model.memory import Workload
from ..model.meta import ModelMeta
from ..runtime.backend import FreeMemory, detected_gpu_backend
from .cards import card_named
from .learned_prior import Machine
from .learned_prior import speed_model as learned
from .machine import DEFAULT_BANDWIDTHS, DEFAULT_CARD_TFLOPS, DEFAULT_LINK_GBPS, host_ram, this_machine
from .prior_learn import load_prior
from .request import Request, Speeds
from .speed import Run, SpeedModel, prefill_up_to
from .unified import Pool, pool_for, read_mac


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
    pool: Pool | None = None  # unified memory: the RAM the GPU shares (vram_bytes is then its working-set cap)


def resolve_backend(request: Request) -> tuple[str, str]:
    """The card's backend: --backend, else --card's vendor, else the GPU this machine shows, else CUDA's."""
    if request.backend != "auto":
        if request.card and request.backend not in (card := card_named(request.card)).backends:
            runs = f"{', '.join(card.backends[:-1])} or {card.backends[-1]}"
            raise MoeplaceError(
                f"--backend {request.backend}: the {card.name} runs llama.cpp's {runs} backend, not {request.backend}."
            )
        return request.backend, "--backend"
    if request.card:
        return card_named(request.card).backend, f"--card {request.card}"

    if found := detected_gpu_backend():
        return found, "the GPU on this machine"
    return "cuda", "no GPU here to ask: CUDA assumed; --backend for another"


def box_note(request: Request) -> str | None:
    """A size typed as printed on the box ('16GB') is planned as powers of ten, as the seed counts; said first."""
    if not request.vram or len(request.vram) > 1 or not request.vram[0].strip().upper().endswith("GB"):
        return None
    given = request.vram[0].strip()
    number = given[:-2].strip()
    return (
        f"note: --vram {given} is planned as {parse_size(given, '--vram') / 2**30:.2f} GiB (GB are powers of "
        f"ten); a card sold as {given} holds {number} GiB: say --vram {number}GiB, or --card NAME."
    )


def _vram(request: Request, free: FreeMemory | None) -> tuple[int, str, str | None]:
    """The card's bytes, where they come from, and the card's name where it is known; with --vram auto the card's
    free memory as `free` read it."""
    if request.card:
        card = card_named(request.card)
        return card.memory_bytes, f"--card {request.card}: {card.name}, {card.memory_bytes >> 30} GiB", card.name
    if request.auto and free:
        cards, tool = free
        free_bytes, name = cards[0]
        return free_bytes, f"free on {name} ({tool}) now (--vram auto)", name
    assert request.vram is not None  # a request names a card, or its memory
    return parse_size(request.vram[0], "--vram"), f"--vram {request.vram[0]}, as given", None


def unified_pool(request: Request, backend: str) -> Pool:
    """A unified-memory device's pool: the machine's RAM as --vram or --card give it (--vram auto: this Mac's
    sysctl, or this APU machine's RAM), its GPU cap as --wired-limit sets it or the OS's default."""
    if request.auto:
        if backend == "metal":
            if (pool := read_mac(backend)) is None:
                raise MoeplaceError(
                    "--vram auto: cannot read this Mac's memory (sysctl hw.memsize); give it, e.g. --vram 36GiB."
                )
            limit = request.wired_limit_mib
            return pool if limit is None else pool_for(pool.ram_bytes, backend, limit)
        ram, _ = host_ram(None)
        if ram is None:
            raise MoeplaceError("--vram auto: cannot read this machine's RAM; give it, e.g. --vram 128GiB.")
    elif request.card:
        ram = card_named(request.card).memory_bytes
    else:
        assert request.vram is not None  # a request names a card, or its memory
        ram = parse_size(request.vram[0], "--vram")
    if request.ram is not None and parse_size(request.ram, "--ram") != ram:
        raise MoeplaceError(
            f"--ram {request.ram}: on unified memory the GPU's memory is the RAM, given once as --vram (the "
            "machine's memory, e.g. --vram 36GiB); drop --ram."
        )
    return pool_for(ram, backend, request.wired_limit_mib)


def margin_bytes(request: Request, backend: str) -> tuple[int, str]:
    """The bytes kept free on each card beyond llama.cpp's buffers, and where the figure comes from: --margin, else
    the backend's default (against its free memory with --vram auto)."""
    if request.margin_mib is not None:
        return request.margin_mib * 2**20, "--margin"
    source = f"{backend}'s default: what real cards used beyond llama.cpp's buffers, docs/real-cards.md"
    return backends.margin_bytes(backend, against_free=request.auto), source


def _speeds(request: Request, card: str | None, unified: bool) -> tuple[float, float, float, str, bool]:
    """The bandwidths and card compute the prior is given: the user's flags, else the named card's datasheet (and
    for --vram auto this host's RAM, measured), else moeplace's defaults; and where each came from. On unified
    memory the host side reads the same RAM as the GPU, so its figure is the GPU's (as the prior learned the
    published Strix Halo and DGX Spark sweeps)."""
    s = request.speeds
    measured, host_said = False, ""
    if request.auto and card:
        vram, ddr, tflops, source, measured = this_machine(card)
    elif request.card:
        sheet = card_named(request.card)
        vram, ddr, tflops = sheet.gbps, DEFAULT_BANDWIDTHS[1], sheet.tflops
        source, host_said = f"the card: {sheet.source}", "; the host: moeplace's default, --bw-ddr for yours"
    else:
        (vram, ddr), tflops = DEFAULT_BANDWIDTHS, DEFAULT_CARD_TFLOPS
        source = "moeplace's defaults, the seed's workstation; --card, or --bw-vram/--bw-ddr/--card-tflops for yours"
    if unified and not measured:
        vram = ddr = s.bw_vram_gbps or vram
        host_said = f"; the host side: the same unified memory, {vram:g} GB/s"
    source += host_said
    host, host_measured = s.host
    given = [
        flag
        for flag, value in (
            ("--bw-vram", s.bw_vram_gbps),
            ("--bw-ddr", s.bw_ddr_gbps),
            ("--bw-ddr-measured", s.bw_ddr_measured_gbps),
            ("--card-tflops", s.card_tflops),
        )
        if value
    ]
    if given:
        source = f"{'/'.join(given)} as given; otherwise {source}"
    measured = host_measured if host else measured
    return s.bw_vram_gbps or vram, host or ddr, s.card_tflops or tflops, source, measured


def assumptions(request: Request, free: FreeMemory | None) -> Assumptions:
    """The card, the margin, the bandwidths and the host's RAM the plan assumes, with their sources (`free`: the
    cards' free memory, as --vram auto read it; None without it)."""
    backend, backend_source = resolve_backend(request)
    pool = unified_pool(request, backend) if request.is_unified or backends.backend(backend).unified else None
    if pool:
        vram, vram_source, card = pool.cap_bytes, f"the GPU's working-set cap: {pool.cap_source}", request.card
    else:
        vram, vram_source, card = _vram(request, free)
    margin, margin_source = margin_bytes(request, backend)
    if margin >= vram:
        raise MoeplaceError(
            f"--margin {margin >> 20} MiB: as much as the card's {vram >> 20} MiB ({vram_source}); "
            "give the MiB to keep free beyond llama.cpp's buffers, e.g. --margin 768."
        )
    measured = False
    bw: tuple[float | None, float | None, float | None] = (None, None, None)
    if request.speeds.calibration:
        speed = f"fitted to your runs ({request.speeds.calibration})"
    else:
        card_gbps, ddr_gbps, tflops, speed, measured = _speeds(request, card, pool is not None)
        bw = (card_gbps, ddr_gbps, tflops)
        prior = f"--prior {request.speeds.prior}" if request.speeds.prior else "docs/speed-prior.md"
        speed += f"; the host figure {'measured' if measured else 'a datasheet figure'}; efficiencies learned from "
        speed += f"published sweeps of real cards ({prior})"
    ram, ram_source = (pool.ram_bytes, "the unified memory, --vram") if pool else host_ram(request.ram)
    return Assumptions(
        backend, backend_source, vram, vram_source, margin, margin_source, *bw, speed, ram, ram_source, measured, pool
    )


def speed_model(
    speeds: Speeds,
    meta: ModelMeta,
    bw: tuple[float | None, float | None] | None = None,
    backend: str = "cuda",
    tflops: float | None = None,
    host_measured: bool | None = None,
    unified: bool = False,
) -> SpeedModel:
    """--calibration's fitted model, else the prior (--prior's, or the one learned from the shipped sweeps) for these
    bandwidths and card compute (each, where not given, the flag's or moeplace's default); the host figure measured
    or a datasheet's as `host_measured` says (None: as the flags say); on `unified` memory the link is the RAM."""

    if speeds.calibration:
        try:
            data = json.loads(Path(speeds.calibration).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MoeplaceError(f"--calibration {speeds.calibration}: cannot read it as JSON ({e}).") from None
        return SpeedModel.from_json(data, f"--calibration {speeds.calibration}")
    vram, ddr = bw or (None, None)
    host, measured = speeds.host
    card_gbps = vram or speeds.bw_vram_gbps or DEFAULT_BANDWIDTHS[0]
    machine = Machine(
        backend,
        card_gbps,
        ddr or host or DEFAULT_BANDWIDTHS[1],
        # unified memory copies nothing over a link: the "host" experts are in the GPU's own RAM
        speeds.bw_link_gbps or (card_gbps if unified else DEFAULT_LINK_GBPS),
        tflops or speeds.card_tflops or DEFAULT_CARD_TFLOPS,
        measured if host_measured is None else host_measured,
    )
    return learned(meta, machine, load_prior(speeds.prior))


def assumed_speed_model(speeds: Speeds, meta: ModelMeta, a: Assumptions) -> SpeedModel:
    """A plan's speed model, for the machine its assumptions name."""
    bw = (a.bw_vram_gbps, a.bw_ddr_gbps)
    return speed_model(speeds, meta, bw, a.backend, a.card_tflops, a.ddr_measured, unified=a.pool is not None)


def card_speed_model(speeds: Speeds, meta: ModelMeta, card: str | None, backend: str | None) -> SpeedModel:
    """`predict`'s speed model: --card's datasheet bandwidth and TFLOPS where a card is named, its backend unless
    --backend says another (else CUDA's)."""
    if not card:
        return speed_model(speeds, meta, None, backend or "cuda")
    found = card_named(card)
    return speed_model(speeds, meta, (found.gbps, None), backend or found.backend, found.tflops)


class Expected(TypedDict):
    """A plan's speeds: each tok/s with its ~95% interval (tok_s, low, high), None where the model cannot say."""

    tg_empty: dict[str, float] | None  # decode at an empty context
    tg_at_depth: dict[str, float] | None  # decode at the plan's context
    pp_at_depth: dict[str, float] | None  # prefill of a prompt's last batch up to it


def expected(meta: ModelMeta, model: SpeedModel, host: frozenset[str], w: Workload, device_hops: int = 0) -> Expected:
    """Decode at an empty context and at w.ctx, prefill of a prompt's last batch up to w.ctx, with these expert
    tensors in host RAM (and over several cards, `device_hops` card boundaries): tok/s with ~95% intervals (None:
    unknown)."""

    kv = (w.type_k, w.type_v)
    return {
        "tg_empty": model.predict(meta, Run(0, 0, "tg", 128, w.ubatch, *kv, host, device_hops=device_hops)),
        "tg_at_depth": model.predict(meta, Run(0, w.ctx, "tg", 128, w.ubatch, *kv, host, device_hops=device_hops)),
        "pp_at_depth": model.predict(meta, prefill_up_to(0, w.ctx, w.ubatch, *kv, host)),
    }


def speed_text(p: dict[str, float] | None) -> str:
    return "unknown" if p is None else f"{p['tok_s']:.1f} tok/s ({p['low']:.1f}-{p['high']:.1f})"


def describe_speed(speed: Expected, depth: int) -> str:
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


def model_path(meta: ModelMeta, given: str) -> str:
    """The path llama.cpp loads: a split model's first shard, whichever shard was given."""
    files = meta.files
    return files[0].path if files and not given.startswith(("http://", "https://")) else given
