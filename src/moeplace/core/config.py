"""The pipeline's config parsed once into typed settings: every section of it, validated against the schema
(config_schema.py: the one definition of each setting's default and description, which the dataclasses here
take their defaults from)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

from .backends import margin_bytes
from .config_schema import SCHEMA_PATH, default, validate_config
from .errors import MoeplaceError
from .records import JsonObject
from .units import Context, parse_size

__all__ = ["SCHEMA_PATH", "default", "validate_config"]


# ---------------------------------------------------------------------------------------------
# Typed settings: the validated config parsed once (sizes to bytes, sections to what each job needs).
# Rules pass these as plain dicts (`params(...)`): Snakemake compares params by value to decide reruns,
# so a job reruns when, and only when, a value it depends on changes.


@dataclass(frozen=True)
class DeviceTarget:
    """What a measuring job runs on: the device kind, its label and its memory (the emulated device's cap)."""

    kind: str  # auto, gpu or emulated
    name: str
    vram_bytes: int | None  # None: auto, the free memory the GPU reports when a job starts
    host_slowdown: float = 1.0  # emulated device: how much slower its host side computes (1: not slowed)
    other_vram_bytes: tuple[int, ...] = ()  # several devices: the ones after the first, in llama.cpp's order


@dataclass(frozen=True)
class BenchSettings:
    """One benchmark configuration's llama-bench settings. `repetitions` is exact unless `max_repetitions`
    is larger: then it is the least any test gets, and more are run (bench.run_sweep: passes over a sweep's
    values in one process, each of the fewest a median's interval needs, or batches for a paired comparison)
    until the 95% interval of the median (of a paired difference: of the mean) is within `precision` of it, or
    `max_repetitions` is reached, or the next pass or batch would run past `time_budget_s` (passes get at least
    as long as the depth fill took)."""

    prompt: int
    gen: int
    repetitions: int
    threads: int
    timeout_s: float
    type_k: str = default("cache_type_k")
    type_v: str = default("cache_type_v")
    noisy_cv: float = default("bench.noisy_cv")
    max_repetitions: int = 0  # 0: exactly `repetitions` (the config's bench.max_repetitions applies to "auto")
    precision: float = default("bench.precision")
    time_budget_s: float = default("bench.time_budget_s")
    quiet_wait_s: float = 0  # a probe run outside the pipeline starts at once (the pipeline's: bench.quiet_wait_s)
    ubatch: int = default("ubatch")
    flash_attn: str = default("flash_attn")

    @property
    def adaptive(self) -> bool:
        return self.max_repetitions > self.repetitions

    def depth(self, ctx: int) -> int:
        """The KV depth a benchmark of context `ctx` fills first: its largest test then holds exactly `ctx`
        cells, the cells the budget plans (llama-bench allocates depth + prompt, or depth + generated, cells)."""
        return max(ctx - max(self.prompt, self.gen), 0)


@dataclass(frozen=True)
class TuneSettings:
    safety_layers: int  # whole layers added to the lowest n that ran (not bytes: that is Device.margin_bytes)
    timeout_s: float
    threads: int


@dataclass(frozen=True)
class CeilingsSettings:
    ram_probe_bytes: int
    seconds: float
    gen: int
    repetitions: int
    threads: int
    random_block_bytes: int  # random disk reads of the size a page fault reads under the RAM tier's readahead
    attention_depths: tuple[int, ...] = ()  # where each model's attention is timed: the benchmarks' depths


@dataclass(frozen=True)
class RamTierSettings:
    """One RAM-tier sweep (the quant comparison runs the same sweep at its own caps)."""

    caps_pct: tuple[int, ...]
    lock_modes: tuple[str, ...]
    readahead_kb: int | None
    gen: tuple[int, int]
    timeout_s: float
    slack_bytes: int
    threads: int


@dataclass(frozen=True)
class Device:
    """The card a budget plans for: its bytes, and the margin: what is kept free beyond llama.cpp's buffers (the
    seed's constants mode: its fixed overhead, in place of the compute buffers). One name and one unit (bytes)
    everywhere: recommend's --margin (MiB), the config's device.margin, the budget tables' margin_bytes."""

    vram_bytes: int
    margin_bytes: int | None  # None: the config's `auto`, the device's backend's default (core/backends.py)
    other_vram_bytes: tuple[int, ...] = ()  # several devices: the ones after the first (each keeps the margin)

    def for_backend(self, backend: str, against_free: bool = False) -> Device:
        """This device with its margin as given, or where it is auto the backend's default (against the card's
        size, or against the free memory read just before a job)."""
        if self.margin_bytes is not None:
            return self
        return replace(self, margin_bytes=margin_bytes(backend, against_free))

    @property
    def kept_free(self) -> int:
        """The margin in bytes, once known (for_backend)."""
        if self.margin_bytes is None:
            raise MoeplaceError("device.margin is auto: plan on a device of a known backend (Device.for_backend).")
        return self.margin_bytes


@dataclass(frozen=True)
class Bandwidths:
    """Theoretical bandwidths in GB/s, and measured ones (the ceilings stage's, or the config's measured:
    section) that the speed model's uncalibrated decode column uses where known."""

    vram_gbps: float
    ddr_gbps: float
    measured_vram_gbps: float | None = None
    measured_ddr_gbps: float | None = None
    disk_gbps: float | None = None
    ram_bytes: int | None = None  # host RAM for the CPU-side experts; None: they always fit
    measured_disk_gbps: float | None = None
    measured_hop_s: float | None = None  # one host<->device transfer of a token's activations (ceilings)


class SeedConstants(TypedDict, total=False):
    """The seed's figures for a model without a file (models.<name>.constants; model/metadata.from_constants)."""

    layers: int
    expert: str | int  # a size: 12GB, or bytes
    non_expert: str | int
    kv_bytes_per_token: int
    n_expert: int
    n_expert_used: int


@dataclass(frozen=True)
class ModelEntry:
    """One model of the config: exactly one of a GGUF file (`gguf`, resolved to a path on disk at start-up), a
    twin spec (`twin`, made with `weights`, `quant`, `seed`) or the seed's `constants`."""

    name: str
    gguf: str | None = None
    twin: str | None = None
    constants: SeedConstants | None = None
    weights: str = default("models.*.weights")
    quant: str = default("models.*.quant")
    seed: int = default("models.*.seed")
    bench: bool = default("models.*.bench")

    @property
    def has_file(self) -> bool:
        return self.constants is None

    @property
    def runs(self) -> bool:
        """llama.cpp can run its weights: a real file or a weighted twin (not a header-only one)."""
        return self.gguf is not None or (self.twin is not None and self.weights != "none")


@dataclass(frozen=True)
class Sweep:
    """The n values a benchmark sweeps: `values` given, or None (auto: around the budget's minimum, `step`)."""

    values: tuple[int, ...] | None
    step: int


@dataclass(frozen=True)
class BudgetCheckGrid:
    """The budget_check target's grid (lists, as the config gives them: the rule's params)."""

    models: list[str]
    contexts: list[int]
    ubatch: list[int]
    cache_types: list[str]
    flash_attn: list[str]
    depth_checks: int


@dataclass(frozen=True)
class LlamacppSettings:
    """Which llama.cpp runs the benchmarks (the rule's params: a new value makes a new manifest): the user's build
    (bin_dir), else the pinned one, built with `backend` and extra CMake options. The defaults are the pinned build."""

    bin_dir: str | None = default("llamacpp.bin_dir")
    version: str = default("llamacpp.version")
    sha256: str = default("llamacpp.sha256")
    cmake_options: list[str] = field(default_factory=lambda: list(default("llamacpp.cmake_options")))
    backend: str = default("llamacpp.backend")


@dataclass(frozen=True)
class RoutingSettings:
    prompt: str
    gen: int
    timeout_s: float


@dataclass(frozen=True)
class QuantsSettings:
    model: str | None  # None: the first random-weight twin
    types: list[str]
    cap_pct: int


@dataclass(frozen=True)
class Stages:
    """Which optional stages the config asks for (each section's `enabled`), and their own model choices."""

    ceilings: bool
    dense_twin: str
    routing: bool
    ram_tier: bool
    ram_tier_models: tuple[str, ...] | None  # None: every model with weights
    quants: bool


@dataclass(frozen=True)
class Settings:
    contexts: tuple[Context, ...]
    device: DeviceTarget
    memory: Device
    bandwidths: Bandwidths
    bench: BenchSettings
    tune: TuneSettings
    ceilings: CeilingsSettings
    ram_tier: RamTierSettings
    models: dict[str, ModelEntry]
    sweep: Sweep
    tune_cache_types: tuple[str, ...]
    budget_check: BudgetCheckGrid
    llamacpp: LlamacppSettings
    routing: RoutingSettings
    quants: QuantsSettings
    stages: Stages
    publish_name: str


MIN_AUTO_REPETITIONS = 3  # a mean, a spread and one degree of freedom beyond


def params(value: Any) -> JsonObject:
    """A settings value as a rule's params (plain values: Snakemake cannot compare dataclasses)."""
    return asdict(value)


def _bench(config: JsonObject) -> BenchSettings:
    bench = config["bench"]
    auto = bench["repetitions"] == "auto"
    return BenchSettings(
        prompt=bench["prompt"],
        gen=bench["gen"],
        repetitions=MIN_AUTO_REPETITIONS if auto else bench["repetitions"],
        threads=bench["threads"],
        timeout_s=bench["timeout_s"],
        type_k=config["cache_type_k"],
        type_v=config["cache_type_v"],
        noisy_cv=bench["noisy_cv"],
        max_repetitions=bench["max_repetitions"] if auto else 0,
        precision=bench["precision"],
        time_budget_s=bench["time_budget_s"],
        quiet_wait_s=bench["quiet_wait_s"],
        ubatch=config["ubatch"],
        flash_attn=config["flash_attn"],
    )


def _bandwidths(config: JsonObject) -> Bandwidths:
    dev, host, measured = config["device"], config["host"], config["measured"]
    return Bandwidths(
        vram_gbps=dev["bw_vram_gbps"],
        ddr_gbps=host["bw_ddr_gbps"],
        measured_vram_gbps=measured.get("bw_vram_gbps"),
        measured_ddr_gbps=measured.get("bw_ddr_gbps"),
        disk_gbps=host.get("bw_disk_gbps"),
        measured_disk_gbps=measured.get("bw_disk_gbps"),
        ram_bytes=parse_size(host["ram"], "config host.ram") if "ram" in host else None,
    )


def _ceilings(config: JsonObject, bench: BenchSettings, contexts: tuple[Context, ...]) -> CeilingsSettings:
    ceilings = config["ceilings"]
    return CeilingsSettings(
        ram_probe_bytes=parse_size(ceilings["ram_probe"], "config ceilings.ram_probe"),
        seconds=ceilings["seconds"],
        gen=ceilings["gen"],
        repetitions=ceilings["repetitions"],
        threads=bench.threads,
        random_block_bytes=(config["ram_tier"]["readahead_kb"] or 4) * 1024,
        attention_depths=tuple(sorted({bench.depth(c.tokens) for c in contexts})),
    )


def _ram_tier(config: JsonObject, threads: int) -> RamTierSettings:
    ram_tier = config["ram_tier"]
    return RamTierSettings(
        caps_pct=tuple(ram_tier["caps_pct"]),
        lock_modes=tuple(ram_tier["lock_modes"]),
        readahead_kb=ram_tier["readahead_kb"],
        gen=(ram_tier["gen"][0], ram_tier["gen"][1]),
        timeout_s=ram_tier["timeout_s"],
        slack_bytes=parse_size(ram_tier["slack"], "config ram_tier.slack"),
        threads=threads,
    )


def _stages(config: JsonObject) -> Stages:
    ceilings, ram_tier = config["ceilings"], config["ram_tier"]
    models = ram_tier["models"]
    return Stages(
        ceilings=ceilings["enabled"],
        dense_twin=ceilings["dense_twin"],
        routing=config["routing"]["enabled"],
        ram_tier=ram_tier["enabled"],
        ram_tier_models=None if models is None else tuple(models),
        quants=config["quants"]["enabled"],
    )


def parse_settings(config: JsonObject) -> Settings:
    """The validated config (defaults filled) as typed values; MoeplaceError names a bad field."""
    dev = config["device"]
    vram: int | None
    if isinstance(dev["vram"], list):  # several devices: sizes only (the schema's)
        vram, *others = [parse_size(v, "config device.vram") for v in dev["vram"]]
    else:
        vram, others = None if dev["vram"] == "auto" else parse_size(dev["vram"], "config device.vram"), []
    contexts = tuple(Context(c) for c in config["contexts"])
    bench = _bench(config)
    routing, quants, n_cpu_moe = config["routing"], config["quants"], config["bench"]["n_cpu_moe"]
    return Settings(
        contexts=contexts,
        device=DeviceTarget(dev["kind"], dev["name"], vram, dev["host_slowdown"], tuple(others)),
        # device.vram auto stays None here until a job asks the GPU (budget.compute_from_llamacpp, device.margin_on
        # read it so): the one Device whose size is not yet known, which the planners never see.
        memory=Device(
            vram,  # type: ignore[arg-type]
            None if dev["margin"] == "auto" else parse_size(dev["margin"], "config device.margin"),
            tuple(others),
        ),
        bandwidths=_bandwidths(config),
        bench=bench,
        tune=TuneSettings(config["tune"]["safety_layers"], config["tune"]["timeout_s"], bench.threads),
        ceilings=_ceilings(config, bench, contexts),
        ram_tier=_ram_tier(config, bench.threads),
        models={name: ModelEntry(name, **entry) for name, entry in config["models"].items()},
        sweep=Sweep(None if n_cpu_moe == "auto" else tuple(sorted(set(n_cpu_moe))), config["bench"]["sweep_step"]),
        tune_cache_types=tuple(config["tune"]["cache_types"]),
        budget_check=BudgetCheckGrid(**config["budget_check"]),
        llamacpp=LlamacppSettings(**config["llamacpp"]),
        routing=RoutingSettings(routing["prompt"], routing["gen"], routing["timeout_s"]),
        quants=QuantsSettings(quants["model"], quants["types"], quants["cap_pct"]),
        stages=_stages(config),
        publish_name=config["publish"]["name"],
    )
