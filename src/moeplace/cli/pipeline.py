"""The Snakefile's side of the package: its config read once when the workflow starts (validated, typed, checked
against the files it names, a killed run's locks cleared), and what the DAG's input functions read (a sweep's n
values, a figure's caption), each file read once. A bad config raises MoeplaceError with one line naming the
field; the Snakefile prints it and stops before any job."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pandas as pd

from ..core.config import ModelEntry, Settings, parse_settings, validate_config
from ..core.errors import MoeplaceError
from ..core.records import JsonObject
from ..measure.bench import auto_sweep
from ..measure.placement import DEVICE_VARIANTS, VARIANTS
from ..model.metadata import inspect_model
from ..model.twin import load_spec
from ..runtime.llamacpp_args import refusal
from ..runtime.locks import clear_stale_locks
from ..runtime.model_ref import resolve_local


@dataclass(frozen=True)
class Pipeline:
    """The settings, and which models and stages the run holds (the DAG's lists, computed once)."""

    settings: Settings
    plain_config: JsonObject  # the resolved config as plain JSON values (the published manifest)
    file_models: list[str]  # with a GGUF or a twin
    bench_models: list[str]
    weight_models: list[str]  # llama.cpp can run them: real files and weighted twins
    budget_check_models: list[str]
    ram_tier_models: list[str]
    routing_models: list[str]
    quants_model: str | None
    ceilings: bool
    quants: bool
    variants: tuple[str, ...]  # over several devices: the variants that place across them


def start(config: JsonObject, workdir: Path, main_process: bool) -> Pipeline:
    """The workflow's config, read once; MoeplaceError (one line naming the field) where it cannot run. Only the
    main process clears a killed run's locks: a job's own parse (e.g. on a cluster node) never does."""
    config = validate_config(copy.deepcopy(config))
    settings = parse_settings(config)
    # Every stage runs the top-level KV cache and flash attention: if llama.cpp refuses them, nothing would load.
    # (The grids of budget_check and tune record a cell it refuses as "unsupported" instead.)
    if refused := refusal(settings.bench.flash_attn, settings.bench.type_v):
        raise MoeplaceError(
            f"config cache_type_v/flash_attn: {refused}; set flash_attn to on or auto, or cache_type_v to f16."
        )
    settings = replace(settings, models={name: _on_disk(m, workdir) for name, m in settings.models.items()})
    for name, m in settings.models.items():
        if m.gguf is not None:
            config["models"][name]["gguf"] = m.gguf
    _check_sweep(settings)
    clear_stale_locks(workdir, main_process)
    for folder in ("results", "logs", "resources"):
        if (workdir / folder).exists() and not os.access(workdir / folder, os.W_OK):
            raise MoeplaceError(
                f"{(workdir / folder).resolve()} is not writable; fix its permissions or run from another directory."
            )
    return _pipeline(settings, json.loads(json.dumps(config, default=str)))


def _on_disk(m: ModelEntry, workdir: Path) -> ModelEntry:
    """A model entry whose gguf (ollama:, lmstudio: and hf: references too) and twin spec are files."""
    if m.gguf is not None:  # references become the file they name
        try:
            m = replace(m, gguf=resolve_local(m.gguf))
        except MoeplaceError as e:
            raise MoeplaceError(f"config models.{m.name}.gguf: {e}") from None
    for key in ("gguf", "twin"):
        if (path := getattr(m, key)) is not None and not Path(path).exists():
            raise MoeplaceError(
                f"config models.{m.name}.{key}: {path} does not exist; fix the path (relative to {workdir})."
            )
    return m


def _check_sweep(settings: Settings) -> None:
    """The benchmarks' tests fit every context, and given n values fit every benchmarked model's layers."""
    bench, models = settings.bench, settings.models.values()
    if any(m.has_file for m in models):
        too_short = [c.tokens for c in settings.contexts if c.tokens <= bench.prompt + bench.gen]
        if too_short:
            raise MoeplaceError(
                f"config contexts: {too_short} leave no room for bench.prompt + bench.gen "
                f"({bench.prompt} + {bench.gen}); use longer contexts or shorter tests."
            )
    if settings.sweep.values is None:
        return
    for m in models:
        if m.has_file and m.bench:
            n_layer = layer_count(m)
            if outside := [n for n in settings.sweep.values if n > n_layer]:
                raise MoeplaceError(
                    f"config bench.n_cpu_moe: {outside} exceed {m.name}'s {n_layer} layers; use values 0..{n_layer}."
                )


def layer_count(m: ModelEntry) -> int:
    """Layers of a model before any job runs: from its twin spec or its GGUF header."""
    try:
        if m.twin is not None:
            return load_spec(m.twin).n_layer
        assert m.gguf is not None  # a model with a file: a twin spec or a GGUF
        return inspect_model(m.gguf).n_layer
    except MoeplaceError as e:
        raise MoeplaceError(f"config models.{m.name}: {e}") from None


def _pipeline(settings: Settings, plain: JsonObject) -> Pipeline:
    models, stages = settings.models, settings.stages
    file_models = [name for name, m in models.items() if m.has_file]
    bench_models = [name for name in file_models if models[name].bench]
    weight_models = [name for name in bench_models if models[name].runs]
    one_device = not settings.device.other_vram_bytes  # the ceilings, RAM-tier and quant stages measure one
    check = settings.budget_check.models or file_models
    _members("budget_check.models", check, file_models, "a model with a file (gguf or twin)")
    _members("ram_tier.models", stages.ram_tier_models or [], weight_models, "a model with weights")
    random_twins = [name for name in weight_models if models[name].twin and models[name].weights == "random"]
    quants_model = settings.quants.model or next(iter(random_twins), None)
    if settings.quants.model and quants_model not in random_twins:
        raise MoeplaceError(
            f"config quants.model: {quants_model} is not a random-weight twin in models; the quant comparison "
            f"quantizes a twin's F16 weights, so name one of: {', '.join(random_twins) or '(none configured)'}."
        )
    return Pipeline(
        settings=settings,
        plain_config=plain,
        file_models=file_models,
        bench_models=bench_models,
        weight_models=weight_models,
        budget_check_models=check,
        ram_tier_models=[m for m in weight_models if m in (stages.ram_tier_models or weight_models)]
        if stages.ram_tier and one_device
        else [],
        routing_models=weight_models if stages.routing else [],
        quants_model=quants_model,
        ceilings=bool(stages.ceilings and weight_models and one_device),
        quants=bool(stages.quants and quants_model and one_device),
        variants=VARIANTS if one_device else DEVICE_VARIANTS,
    )


def _members(setting: str, names: Sequence[str], allowed: list[str], what: str) -> None:
    for name in names:
        if name not in allowed:
            raise MoeplaceError(
                f"config {setting}: {name!r} is not {what} in models; use one of {', '.join(allowed) or '(none)'}."
            )


def sweep_values(budget_csv: str, metadata_json: str, ctx: int, step: int) -> list[int]:
    """An auto sweep's n values at one context: around the budget's minimum (an empty list where the table has
    no row for it: a dry run against a table from before the context was added)."""
    budget, n_layer = _budget_and_layers(budget_csv, metadata_json, _mtime(budget_csv), _mtime(metadata_json))
    rows = budget[budget.ctx == ctx]
    if rows.empty:
        return []
    row = rows.iloc[0]
    return auto_sweep(int(row.n_cpu_moe) if row.status == "ok" else None, n_layer, step=step)


def _mtime(path: str) -> int:
    return Path(path).stat().st_mtime_ns


@cache
def _budget_and_layers(budget_csv: str, metadata_json: str, *mtimes: int) -> tuple[pd.DataFrame, int]:
    """A model's budget table and layer count, read once per version of the files (`mtimes`)."""
    return pd.read_csv(budget_csv), json.loads(Path(metadata_json).read_text())["n_layer"]


def caption(rst: Path, wildcards: dict[str, str]) -> str:
    """A report() caption with a figure's wildcards filled in, as Snakemake's report renders it."""
    template = jinja2.Template(rst.read_text(), undefined=jinja2.ChainableUndefined)
    text: str = template.render(snakemake=SimpleNamespace(wildcards=SimpleNamespace(**wildcards)))
    return text.strip()
