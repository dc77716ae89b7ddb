"""The pipeline's config: validated against workflow/schemas/config.schema.yaml (defaults filled, one clear
line naming a bad field), then parsed once into typed settings."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft202012Validator, validators

from .errors import MoeplaceError
from .units import Context, parse_size


def _with_defaults(cls: type) -> type:
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):  # noqa: ANN001 - jsonschema's signature
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_Validator = _with_defaults(Draft202012Validator)


def _field(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def _message(error: jsonschema.ValidationError) -> str:
    where = _field(error)
    if error.validator == "oneOf" and isinstance(error.instance, dict):
        return f"{where}: give exactly one of gguf, twin or constants"
    if error.validator == "additionalProperties":
        return f"{where}: {error.message.replace('Additional properties are not allowed', 'unknown key(s)')}"
    if error.validator == "pattern":
        hint = error.schema.get("description", "")
        return f"{where}: {error.instance!r} is not valid" + (f"; expected {hint}" if hint else "")
    if error.validator == "dependentRequired":
        needed = next(
            k for k, v in error.validator_value.items() if k in error.instance and set(v) - set(error.instance)
        )
        missing = ", ".join(f"{where}.{m}" for m in error.validator_value[needed] if m not in error.instance)
        return f"{where}.{needed} needs {missing} as well"
    if error.validator == "propertyNames":
        return f"{where}: model name {error.instance!r} may use only letters, digits, '.', '_' and '-'"
    return f"{where}: {error.message}"


_NOT_READ = object()
_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", type(None): "null"}


def _read_string(text: str, types: str | list[str]) -> Any:
    """`text` read as YAML, as config.yaml would be, if that gives one of the JSON `types`; else _NOT_READ."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return _NOT_READ
    wanted = {types} if isinstance(types, str) else set(types)
    kind = _JSON_TYPE.get(type(value))
    return value if kind in wanted or (kind == "integer" and "number" in wanted) else _NOT_READ


def _string_type_errors(errors: Iterable[jsonschema.ValidationError]) -> Iterator[jsonschema.ValidationError]:
    """Every error, also those inside oneOf/anyOf branches, that is a string where another type is wanted."""
    for error in errors:
        if error.validator == "type" and isinstance(error.instance, str):
            yield error
        yield from _string_type_errors(error.context or ())


def _read_strings(config: dict[str, Any], validator: jsonschema.protocols.Validator) -> None:
    """Snakemake's --config gives what is inside a list or mapping as strings (contexts=[8192,32768] becomes
    ['8192', '32768']): where the schema wants a number, boolean or null, such a string is read as YAML.
    Each round turns strings into other values, so the rounds end."""
    while True:
        values: dict[tuple, Any] = {}
        for error in _string_type_errors(validator.iter_errors(config)):
            if (value := _read_string(error.instance, error.validator_value)) is not _NOT_READ:
                values.setdefault(tuple(error.absolute_path), value)
        if not values:
            return
        for (*parents, last), value in values.items():
            container: Any = config
            for key in parents:
                container = container[key]
            container[last] = value


def validate_config(config: dict[str, Any], schema_path: str | Path) -> dict[str, Any]:
    """Validate in place (filling defaults, reading numbers given as strings) and return the config;
    MoeplaceError names the first bad field."""
    validator = _Validator(yaml.safe_load(Path(schema_path).read_text()))
    _read_strings(config, validator)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise MoeplaceError(f"config: {_message(error)}.")
    return config


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
    host_slowdown: float = 1.0  # emulated device: how much slower its host side computes than the device
    other_vram_bytes: tuple[int, ...] = ()  # several devices: the ones after the first, in llama.cpp's order


@dataclass(frozen=True)
class BenchSettings:
    """One benchmark configuration's llama-bench settings. `repetitions` is exact unless `max_repetitions`
    is larger: then it is the repetitions of each pass, and more passes are run (bench.run_sweep: passes over a
    sweep's values in one process, or batches for a paired comparison) until the 95% interval of the median (of
    a paired difference: of the mean) is within `precision` of it, or `max_repetitions` is reached, or the next
    pass or batch would run past `time_budget_s` (passes get at least as long as the depth fill took)."""

    prompt: int
    gen: int
    repetitions: int
    threads: int
    timeout_s: float
    type_k: str = "f16"
    type_v: str = "f16"
    noisy_cv: float = 0.05
    max_repetitions: int = 0  # 0: exactly `repetitions`
    precision: float = 0.05
    time_budget_s: float = 150
    quiet_wait_s: float = 0
    ubatch: int = 512
    flash_attn: str = "auto"

    @property
    def adaptive(self) -> bool:
        return self.max_repetitions > self.repetitions

    def depth(self, ctx: int) -> int:
        """The KV depth a benchmark of context `ctx` fills first: its largest test then holds exactly `ctx`
        cells, the cells the budget plans (llama-bench allocates depth + prompt, or depth + generated, cells)."""
        return max(ctx - max(self.prompt, self.gen), 0)


@dataclass(frozen=True)
class TuneSettings:
    margin: int
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
    """The card a budget plans for: its bytes, and what is kept free beyond llama.cpp's buffers (the margin;
    the seed's constants mode: its fixed overhead)."""

    vram_bytes: int
    overhead_bytes: int
    other_vram_bytes: tuple[int, ...] = ()  # several devices: the ones after the first (each keeps the margin)


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


MIN_AUTO_REPETITIONS = 3  # a mean, a spread and one degree of freedom beyond


def params(value: Any) -> dict[str, Any]:
    """A settings value as a rule's params (plain values: Snakemake cannot compare dataclasses)."""
    return asdict(value)


def parse_settings(config: dict[str, Any]) -> Settings:
    """The validated config (defaults filled) as typed values; MoeplaceError names a bad field."""
    dev, host, measured, bench = config["device"], config["host"], config["measured"], config["bench"]
    threads = bench["threads"]
    auto = bench["repetitions"] == "auto"
    sizes = dev["vram"] if isinstance(dev["vram"], list) else [dev["vram"]]
    vram, *others = [None if v == "auto" else parse_size(v, "config device.vram") for v in sizes]
    ram_tier = config["ram_tier"]
    contexts = tuple(Context(c) for c in config["contexts"])
    bench_settings = BenchSettings(
        prompt=bench["prompt"],
        gen=bench["gen"],
        repetitions=MIN_AUTO_REPETITIONS if auto else bench["repetitions"],
        threads=threads,
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
    return Settings(
        contexts=contexts,
        device=DeviceTarget(dev["kind"], dev["name"], vram, dev["host_slowdown"], tuple(others)),
        memory=Device(vram, parse_size(dev["overhead"], "config device.overhead"), tuple(others)),
        bandwidths=Bandwidths(
            vram_gbps=dev["bw_vram_gbps"],
            ddr_gbps=host["bw_ddr_gbps"],
            measured_vram_gbps=measured.get("bw_vram_gbps"),
            measured_ddr_gbps=measured.get("bw_ddr_gbps"),
            disk_gbps=host.get("bw_disk_gbps"),
            measured_disk_gbps=measured.get("bw_disk_gbps"),
            ram_bytes=parse_size(host["ram"], "config host.ram") if "ram" in host else None,
        ),
        bench=bench_settings,
        tune=TuneSettings(config["tune"]["margin"], config["tune"]["timeout_s"], threads),
        ceilings=CeilingsSettings(
            ram_probe_bytes=parse_size(config["ceilings"]["ram_probe"], "config ceilings.ram_probe"),
            seconds=config["ceilings"]["seconds"],
            gen=config["ceilings"]["gen"],
            repetitions=config["ceilings"]["repetitions"],
            threads=threads,
            random_block_bytes=(ram_tier["readahead_kb"] or 4) * 1024,
            attention_depths=tuple(sorted({bench_settings.depth(c.tokens) for c in contexts})),
        ),
        ram_tier=RamTierSettings(
            caps_pct=tuple(ram_tier["caps_pct"]),
            lock_modes=tuple(ram_tier["lock_modes"]),
            readahead_kb=ram_tier["readahead_kb"],
            gen=(ram_tier["gen"][0], ram_tier["gen"][1]),
            timeout_s=ram_tier["timeout_s"],
            slack_bytes=parse_size(ram_tier["slack"], "config ram_tier.slack"),
            threads=threads,
        ),
    )
