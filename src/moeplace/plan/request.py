"""One request for a plan: every option a user gives `recommend` or `tune` (or the pipeline's budget), typed and
checked once, when it is made. The budget, the optimiser, several devices, every emitted line and the fixes for
what does not fit take this value and nothing else, so no path can read an option its own way or miss one.

A bad value is refused here with one line naming the flag and what to give, before any model is read, any
llama.cpp is built or anything is printed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..core.backends import NAMES as BACKENDS
from ..core.backends import backend as backend_record
from ..core.backends import op_offload
from ..core.errors import MoeplaceError
from ..core.units import parse_size
from ..model.draft import NO_DRAFT, DraftRequest
from ..model.gguf_file import read_header
from ..model.kvcache import CACHE_TYPES
from ..model.memory import FLASH_ATTN, SERVER, Workload
from ..model.meta import ModelMeta
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_FLASH_ATTN, DEFAULT_UBATCH, cache_args, refusal
from .emit_formats import NAMES as EMIT_NAMES
from .emit_formats import emit_format
from .offload import override_rules

MAX_CONTEXT = 10_000_000  # no GGUF model has a trained context this long: a typo, not a plan
MAX_UBATCH = 65_536  # llama.cpp's graph for a larger ubatch would not fit any card's compute buffer
MAX_PARALLEL = 256
PLACEMENTS = ("ncmoe", "optimal")
# Past the trained context llama.cpp stretches RoPE with YaRN; beyond this factor models degrade badly.
MAX_ROPE_SCALE = 8.0


@dataclass(frozen=True)
class Speeds:
    """What the speed model is told about the machine: a calibration file, or datasheet figures (None: the card's
    datasheet with --card or --vram auto, else moeplace's defaults)."""

    calibration: str | None = None
    bw_vram_gbps: float | None = None
    bw_ddr_gbps: float | None = None  # the host RAM's datasheet (theoretical) figure
    bw_link_gbps: float | None = None
    card_tflops: float | None = None
    bw_ddr_measured_gbps: float | None = None  # the host RAM's read as measured (STREAM, moeplace's membw)
    prior: str | None = None  # a prior from `moeplace prior learn` (None: the shipped one)

    def __post_init__(self) -> None:
        for flag, value, example in (
            ("--bw-vram", self.bw_vram_gbps, 448),
            ("--bw-ddr", self.bw_ddr_gbps, 57.6),
            ("--bw-link", self.bw_link_gbps, 31.5),
            ("--bw-ddr-measured", self.bw_ddr_measured_gbps, 40),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise MoeplaceError(f"{flag} {value:g}: a bandwidth is a positive number of GB/s, e.g. {example}.")
        if self.card_tflops is not None and not (math.isfinite(self.card_tflops) and self.card_tflops > 0):
            raise MoeplaceError(
                f"--card-tflops {self.card_tflops:g}: a card's FP32 throughput is a positive number, e.g. 48.7."
            )
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise MoeplaceError(f"--calibration {self.calibration}: no such file; give a `moeplace calibrate` JSON.")
        if self.prior is not None and not Path(self.prior).is_file():
            raise MoeplaceError(f"--prior {self.prior}: no such file; give a `moeplace prior learn` JSON.")
        if self.bw_ddr_gbps and self.bw_ddr_measured_gbps:
            raise MoeplaceError(
                "--bw-ddr and --bw-ddr-measured: give one, the host RAM's datasheet figure (--bw-ddr) "
                "or a measured one (--bw-ddr-measured)."
            )

    @property
    def host(self) -> tuple[float | None, bool]:
        """The host RAM bandwidth given (None: none), and whether it was measured: the prior takes a datasheet's
        figure at its learned share, a measured one as it is."""
        return (self.bw_ddr_measured_gbps, True) if self.bw_ddr_measured_gbps else (self.bw_ddr_gbps, False)


@dataclass(frozen=True)
class Constants:
    """The seed's script: the model as totals (GB), its overhead a constant in place of the compute buffers."""

    vram_gb: float
    non_expert_gb: float
    expert_gb: float
    layers: int
    kv_bytes_per_token: int
    overhead_gb: float = 1.0

    def __post_init__(self) -> None:
        for flag, value in (
            ("--vram-gb", self.vram_gb),
            ("--non-expert-gb", self.non_expert_gb),
            ("--expert-gb", self.expert_gb),
            ("--kv-bytes-per-token", self.kv_bytes_per_token),
        ):
            if not (math.isfinite(value) and value > 0):
                raise MoeplaceError(f"{flag} {value:g}: must be a positive number.")
        if self.layers < 1:
            raise MoeplaceError(f"--layers {self.layers}: a model has at least one layer.")
        if not (math.isfinite(self.overhead_gb) and self.overhead_gb >= 0):
            raise MoeplaceError(f"--overhead-gb {self.overhead_gb:g}: must be 0 or more.")


def parse_contexts(text: str, flag: str = "--ctx", allow_zero: bool = False) -> tuple[int, ...]:
    """'8192,32768' -> (8192, 32768), each checked."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
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


def check_ubatch(ubatch: int) -> None:
    if not 1 <= ubatch <= MAX_UBATCH:
        raise MoeplaceError(f"--ubatch {ubatch}: give a ubatch between 1 and {MAX_UBATCH}, e.g. 512 or 2048.")


def is_projector(path: str) -> bool:
    """A GGUF whose architecture is llama.cpp's multimodal projector ('clip'), as llama-server's --mmproj takes."""

    return read_header(path).metadata.get("general.architecture") == "clip"


@dataclass(frozen=True)
class Cache:
    """The KV cache types, flash attention, ubatch and server slots a command line runs with."""

    type_k: str = DEFAULT_CACHE_TYPE
    type_v: str = DEFAULT_CACHE_TYPE
    flash_attn: str = DEFAULT_FLASH_ATTN
    ubatch: int = DEFAULT_UBATCH
    parallel: int = 1

    def args(self) -> list[str]:
        """llama.cpp's flags for all but the slots (none for the defaults)."""
        return cache_args(self.type_k, self.type_v, self.flash_attn, self.ubatch)


@dataclass(frozen=True)
class Request:
    """What the user asks a plan for. `model` is the file (None: the seed's constants); `contexts` the -c values
    per slot (empty with `longest`: the longest context that fits); `vram` the device sizes as typed (one per
    device, None with `card` or `auto`)."""

    contexts: tuple[int, ...] = ()
    model: str | None = None
    model_ref: str | None = None
    longest: bool = False
    vram: tuple[str, ...] | None = None
    auto: bool = False  # --vram auto: this machine's cards, their free memory now
    card: str | None = None  # --card NAME: a card from plan/cards.py
    backend: str = "auto"
    margin_mib: int | None = None
    ram: str | None = None
    type_k: str = DEFAULT_CACHE_TYPE
    type_v: str = DEFAULT_CACHE_TYPE
    flash_attn: str = DEFAULT_FLASH_ATTN
    ubatch: int = DEFAULT_UBATCH
    parallel: int = 1
    mmproj: str | None = None
    overrides: tuple[str, ...] = ()
    no_kv_offload: bool = False
    emit: str = "server"  # the tool a line is for: llama-bench reserves logits for a whole batch, a server for one
    json: bool = False  # print the plan as JSON (for the --emit tool)
    placement: str = "ncmoe"
    objective: str | None = None  # what --placement optimal ranks by (None: not given, decode); without it, refused
    explain: bool = False
    reserve: bool = False
    bin_dir: str | None = None
    speeds: Speeds = field(default_factory=Speeds)
    constants: Constants | None = None
    draft: DraftRequest = NO_DRAFT  # speculative decoding: a draft model or the model's MTP head (model/draft.py)
    # unified memory (plan/unified.py): --vram is then the machine's RAM, shared by GPU, CPU and OS
    unified: bool = False  # an APU's memory (Metal's always is)
    wired_limit_mib: int | None = None  # the GPU's working-set cap as set (iogpu.wired_limit_mb), else the default

    def __post_init__(self) -> None:
        self._check_values()
        self._check_combinations()
        self._check_beside()

    def cache(self, kv: tuple[str, str] | None = None, ubatch: int | None = None) -> Cache:
        """The request's cache flags, with another KV type or ubatch where a plan chose one."""
        type_k, type_v = kv or (self.type_k, self.type_v)
        return Cache(type_k, type_v, self.flash_attn, ubatch or self.ubatch, self.parallel)

    def _check_values(self) -> None:
        if not self.contexts and not self.longest:
            raise MoeplaceError("--ctx: give the context length(s), e.g. --ctx 8192,32768, or --ctx max.")
        for ctx in self.contexts:
            if not 1 <= ctx <= MAX_CONTEXT:
                raise MoeplaceError(f"--ctx {ctx}: give a positive token count below {MAX_CONTEXT}, e.g. 32768.")
        for flag, value, allowed in (
            ("--cache-type-k", self.type_k, CACHE_TYPES),
            ("--cache-type-v", self.type_v, CACHE_TYPES),
            ("--flash-attn", self.flash_attn, FLASH_ATTN),
            ("--backend", self.backend, ("auto", *BACKENDS)),
            ("--emit", self.emit, EMIT_NAMES),
            ("--placement", self.placement, PLACEMENTS),
        ):
            if value not in allowed:
                raise MoeplaceError(f"{flag} {value}: choose one of {', '.join(allowed)}.")
        check_ubatch(self.ubatch)
        if not 1 <= self.parallel <= MAX_PARALLEL:
            raise MoeplaceError(f"--parallel {self.parallel}: give 1 to {MAX_PARALLEL} server slots.")
        if self.margin_mib is not None and self.margin_mib < 0:
            raise MoeplaceError(f"--margin {self.margin_mib}: MiB kept free, 0 or more.")
        if self.objective is not None:
            parse_objective(self.objective)
        for size in self.vram or ():
            if parse_size(size, "--vram") <= 0:
                raise MoeplaceError(f"--vram {size}: a card's memory is a positive size, e.g. 16GiB.")
        if self.ram is not None and parse_size(self.ram, "--ram") <= 0:
            raise MoeplaceError(f"--ram {self.ram}: the host's RAM is a positive size, e.g. 64GB.")
        override_rules(list(self.overrides))
        if self.wired_limit_mib is not None and self.wired_limit_mib <= 0:
            raise MoeplaceError(
                f"--wired-limit {self.wired_limit_mib}: the MiB iogpu.wired_limit_mb is set to, e.g. 28672."
            )
        if self.mmproj is not None:
            if not Path(self.mmproj).is_file():
                raise MoeplaceError(f"--mmproj {self.mmproj}: no such file; give the projector .gguf the server loads.")
            if not is_projector(self.mmproj):
                raise MoeplaceError(
                    f"--mmproj {self.mmproj}: not a multimodal projector (its general.architecture is "
                    "not clip); give the mmproj .gguf published beside the model."
                )

    def _check_beside(self) -> None:
        """A draft and unified memory: their flags together with the rest."""
        if self.draft.asked and (why := refusal(self.flash_attn, self.draft.type_v)):
            raise MoeplaceError(f"-ctvd {self.draft.type_v}: {why}; drop --flash-attn off.")
        if self.unified and self.backend != "auto" and backend_record(self.backend).software:
            raise MoeplaceError(
                f"--unified with --backend {self.backend}: an emulated device has no unified memory; --unified is "
                "for an APU (ROCm, Vulkan) or a unified-memory GPU such as DGX Spark's (CUDA)."
            )
        if self.wired_limit_mib is not None and not self.is_unified:
            raise MoeplaceError(
                "--wired-limit is a unified-memory GPU's cap: give it with --backend metal, or --unified for an APU."
            )
        if (self.draft.asked or self.is_unified) and (self.constants is not None or len(self.vram or ()) > 1):
            raise MoeplaceError(
                "a draft (-md, --spec-type) and unified memory are planned on one device of a MODEL.gguf: give one "
                "--vram and the model's file."
            )

    @property
    def ranked_by(self) -> str:
        """What --placement optimal ranks placements by: --objective, decode where not given."""
        return self.objective or "decode"

    def _check_combinations(self) -> None:
        if self.objective is not None and self.placement != "optimal":
            raise MoeplaceError(
                f"--objective {self.objective}: it says what --placement optimal ranks by, and the plain plan ranks "
                "nothing; add --placement optimal."
            )
        if self.constants is not None:
            if self.model or self.vram or self.auto or self.card:
                raise MoeplaceError(
                    "--vram-gb and the other constants describe a model without its file: give either "
                    "a MODEL.gguf with --vram/--card, or the constants alone."
                )
            if self.longest or self.placement != "ncmoe" or self.emit not in ("server", "json") or self.mmproj:
                # the seed's constants have no file to put in a line: the plan in words or JSON only
                raise MoeplaceError(
                    "the constants mode plans --n-cpu-moe only: --ctx max, --placement optimal, "
                    "--emit bench/llama-swap/ollama and --mmproj need a MODEL.gguf."
                )
        elif self.model is None:
            raise MoeplaceError(
                "give a MODEL.gguf (or ollama:/lmstudio:/hf: reference), or the seed's constants "
                "(--vram-gb, --non-expert-gb, --expert-gb, --layers, "
                "--kv-bytes-per-token)."
            )
        elif sum(bool(x) for x in (self.vram, self.auto, self.card)) != 1:
            raise MoeplaceError(
                "give the card once: --vram 16GiB (its memory), --vram auto (this machine's) or "
                "--card NAME (e.g. --card 'RTX 4070 Ti SUPER')."
            )
        if why := refusal(self.flash_attn, self.type_v):
            raise MoeplaceError(f"--cache-type-v {self.type_v}: {why}; drop --flash-attn off.")
        if self.json and self.emit not in ("server", "json"):
            raise MoeplaceError(
                f"--json and --emit {self.emit} ask for two outputs: --json prints the plan (with every tool's "
                "line in it); give one."
            )
        if emit_format(self.emit).one_context and (len(self.contexts) > 1 or self.longest):
            raise MoeplaceError(f"--emit {self.emit}: it holds one context; give one --ctx value for each.")
        if len(self.vram or ()) > 1 and (
            self.overrides
            or self.placement == "optimal"
            or self.mmproj
            or not emit_format(self.emit).several_devices
            or self.no_kv_offload
            or self.longest
        ):
            raise MoeplaceError(
                "--vram A,B plans a layer split over several devices; -ot pins, --placement optimal, "
                "--mmproj, -nkvo, --ctx max and --emit llama-swap/ollama take one device for now: "
                "give one --vram."
            )

    @property
    def tool(self) -> str:
        """The llama.cpp program the plan is for: llama-bench with --emit bench, else llama-server."""
        return emit_format(self.emit).tool

    @property
    def is_unified(self) -> bool:
        """The device is the machine's RAM: Metal, or --unified (an APU)."""
        return self.unified or (self.backend != "auto" and backend_record(self.backend).unified)

    @property
    def as_json(self) -> bool:
        return self.json or self.emit == "json"

    def with_(self, **changes: Any) -> Request:
        """This request with some options changed (checked again)."""
        return replace(self, **changes)

    def workload(self, ctx: int, backend: str, **changes: Any) -> Workload:
        """What the run asks of the device's memory at `ctx` tokens per slot, on `backend` (whose op offload copies
        host experts into the compute buffer): a server reserves logits for one token per slot, llama-bench (what
        --emit bench prints) for a whole batch."""
        w = Workload(
            ctx,
            self.ubatch,
            self.flash_attn,
            self.type_k,
            self.type_v,
            self.parallel,
            "batch" if self.tool == "bench" else SERVER,
            op_offload(backend),
            self.no_kv_offload,
        )
        return replace(w, **changes)


def rope_args(meta: ModelMeta, ctx: int) -> list[str]:
    """The flags llama.cpp needs to run `ctx` tokens per slot past the model's trained context: YaRN stretching the
    trained context by the factor that reaches `ctx` (Qwen's own model cards run Qwen3 so, with llama.cpp's
    --rope-scaling yarn --rope-scale F --yarn-orig-ctx N); none within it, or where the model says nothing."""
    trained = meta.n_ctx_train or 0
    if not trained or ctx <= trained:
        return []
    yarn = meta.rope_yarn  # a file with YaRN already: stretched further, from its own origin
    origin, factor = (yarn.original_ctx or trained, yarn.factor) if yarn else (trained, 1.0)
    scale = math.ceil(ctx / trained * factor * 100) / 100
    return ["--rope-scaling", "yarn", "--rope-scale", f"{scale:g}", "--yarn-orig-ctx", str(origin)]


def check_trained_context(meta: ModelMeta, contexts: tuple[int, ...]) -> str | None:
    """Past the trained context: a note of the RoPE flags the plan adds (None: within it); beyond what YaRN
    stretches well, a refusal naming the longest context it does."""
    trained = meta.n_ctx_train or 0
    if not trained or not contexts or max(contexts) <= trained:
        return None
    if max(contexts) > trained * MAX_ROPE_SCALE:
        raise MoeplaceError(
            f"--ctx {max(contexts)}: {max(contexts) / trained:.1f}x {meta.name}'s trained context of {trained} "
            f"tokens; YaRN stretches it {MAX_ROPE_SCALE:g}x at most ({int(trained * MAX_ROPE_SCALE)} tokens)."
        )
    return (
        f"note: past {meta.name}'s trained context of {trained} tokens llama.cpp stretches RoPE with YaRN; the "
        "lines below carry its flags (--rope-scaling yarn --rope-scale F --yarn-orig-ctx "
        f"{trained}); the model may answer worse that far out."
    )
