"""Stage 'placement': expert placements beyond --n-cpu-moe (plan/offload.py) run as llama-bench -ot variants,
each interleaved with -ncmoe at the same host bytes, and checked against where llama.cpp's load log put every
tensor; llama-fit-params' own placement as one more variant."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, TypedDict

import pandas as pd

from ..core.errors import MoeplaceError
from ..core.records import BenchRecord, Row
from ..core.stats import delta_interval, min_detectable_effect
from ..model.gguf_file import read_header
from ..model.meta import ModelMeta
from ..plan.offload import expert_tensors, matching_tensors, optimal_placement, ot_value, variants
from ..runtime.allocation import fitted_placement
from ..runtime.cpus import split_cpus
from ..runtime.device import attached, portable_rules
from ..runtime.llama_names import is_host
from ..runtime.llamacpp_args import cache_args, refusal
from .bench import BenchJob, Rig, run_bench


class PlacementCheck(TypedDict):
    """Whether llama.cpp put the tensors where a variant meant them (counts, and the names that differ)."""

    intended: int
    observed: int
    missing: list[str]
    unexpected: list[str]
    match: bool


def check_placement(intended: set[str], buffers: dict[str, str]) -> PlacementCheck:
    """Compare the intended host set with where llama.cpp's 'buffer type overridden' lines put each tensor:
    every intended tensor must go to a host buffer, and no other tensor may."""

    observed = {name for name, buffer in buffers.items() if is_host(buffer)}
    return {
        "intended": len(intended),
        "observed": len(observed),
        "missing": sorted(intended - observed),
        "unexpected": sorted(observed - intended),
        "match": intended == observed,
    }


def variants_table(records: list[BenchRecord]) -> Any:
    """Per model, context and test: each variant's tok/s and its difference from --n-cpu-moe at the same bytes,
    against the -ncmoe runs interleaved with it (paired) where it has them, else the first_n variant's own
    runs; with the difference's 95% Welch interval and the smallest difference the runs could have detected."""

    rows = []
    by_key = {(r["model"], r["ctx"], r["variant"], r["test"]): r for r in records}
    for (model, ctx, variant, test), r in sorted(by_key.items()):
        first_n = by_key.get((model, ctx, "first_n", test))
        baseline = r.get("baseline_samples_ts") or (first_n or {}).get("samples_ts") or []
        row = {
            "model": model,
            "ctx": ctx,
            "variant": variant,
            "test": test,
            "status": r["status"],
            "host_expert_bytes": r.get("host_expert_bytes"),
            "avg_ts": r["avg_ts"],
            "stddev_ts": r["stddev_ts"],
            "repetitions": r.get("repetitions"),
            "paired": bool(r.get("baseline_samples_ts")),
            "overrides": r["overrides"],
            "tensor_split": r.get("tensor_split", ""),
            "n_gpu_layers": r.get("n_gpu_layers", 99),
            "placement_match": r.get("placement_match"),
            "device": r.get("device"),
        }
        if variant != "first_n" and r["status"] == "ok" and baseline:
            delta, low, high = delta_interval(r["samples_ts"], baseline)
            mean = sum(baseline) / len(baseline)
            row.update(
                baseline_ts=mean,
                delta_vs_ncmoe=delta,
                delta_pct=100 * delta / mean,
                delta_ci95_low=low,
                delta_ci95_high=high,
                mde_pct=100 * min_detectable_effect(r["samples_ts"], baseline),
                distinguishable=None if math.isnan(low) else not (low <= 0 <= high),
            )
        rows.append(row)
    return pd.DataFrame(rows)


VARIANTS = ("first_n", "first_n_ot", "last_n", "up_down", "interleaved", "optimal", "fit_params")
# Over several devices: --n-cpu-moe n with llama.cpp's own split, moeplace's per-device plan, llama-fit-params'.
DEVICE_VARIANTS = ("first_n", "device_plan", "fit_params")


def variant_n(meta: ModelMeta, budget_n: int | None, several: bool = False) -> int:
    """The n the variants are compared at: the budget's minimum, or half the layers when everything fits (over
    several devices the minimum whatever it is: first_n is --n-cpu-moe as a user would run it there)."""
    if several and budget_n is not None:
        return budget_n
    return budget_n if budget_n else meta.n_layer // 2


def run_variant(variant: str, meta: ModelMeta, n: int, budget: Row, job: BenchJob, rig: Rig) -> list[BenchRecord]:
    """One variant's llama-bench run of `job`'s model and context, with its placement checked against llama.cpp's
    load log. `budget` is the context's row of the budget table (the room for experts; over several devices the
    per-device plan). On one device each variant is paired with --n-cpu-moe n; over several that one runs out of
    memory at the plan's host bytes, so the variants are compared with the first_n variant's own runs."""

    sizes = {t.name: t.n_bytes for t in read_header(job.model_path).tensors}
    split, ngl = None, 99
    if variant == "fit_params" and refusal(rig.settings.flash_attn, rig.settings.type_v):
        overrides, intended = None, set()  # llama-fit-params would abort: run_bench records it unsupported
    elif variant == "fit_params":
        s = rig.settings
        args = ["-c", str(job.ctx), *cache_args(s.type_k, s.type_v, s.flash_attn, s.ubatch)]
        with attached(rig.device, rig.manifest, split_cpus(rig.device.kind == "emulated"), rig.log_path) as rpc:
            fit_ngl, overrides, split = fitted_placement(rig.manifest, job.model_path, args, rpc, rig.log_path)
            overrides = portable_rules(overrides, rpc)
        if fit_ngl is None:
            raise MoeplaceError(
                f"llama-fit-params found no placement for {job.model_path} at {job.ctx} tokens on "
                f"{rig.device.label}; see {rig.log_path}."
            )
        ngl, intended = fit_ngl, matching_tensors(overrides, list(sizes))
    elif variant == "device_plan":  # from the budget table, where an empty cell reads as NaN
        overrides, split = _text(budget["device_plan_override"]) or None, _text(budget["tensor_split"])
        intended = expert_tensors(meta, [int(il) for il in _text(budget["device_plan_host_layers"]).split()])
    else:
        if variant == "optimal":
            room = budget["budget_bytes"]
            assert room is not None  # the budget table's room for experts
            intended = optimal_placement(meta, float(room))
        else:
            intended = {"first_n": expert_tensors(meta, list(range(n))), **variants(meta, n)}[variant]
        overrides = None if variant == "first_n" else ot_value(intended) or None
    paired = None if variant == "first_n" or rig.device.other_caps else n  # -ncmoe n interleaved with it
    first_n = n if variant == "first_n" else 0
    records = run_bench(
        replace(
            job,
            n_cpu_moe=first_n,
            variant=variant,
            overrides=overrides,
            paired_n_cpu_moe=paired,
            tensor_split=split,
            n_gpu_layers=ngl,
        ),
        rig,
    )
    for r in records:
        check = check_placement(intended, r["tensor_buffers"])
        r.update(
            {
                "host_expert_bytes": sum(sizes[t] for t in intended),
                "placement_match": check["match"],
                "placement_missing": check["missing"],
                "placement_unexpected": check["unexpected"],
            }
        )
    return records


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def placement_check_table(records: list[BenchRecord]) -> Any:
    """One row per variant run that left a load log (its tests share one), whatever its status: where
    llama.cpp put the tensors against where the placement asked for them."""

    runs = {(r["model"], r["ctx"], r["variant"]): r for r in records if r["status"] == "ok" or r.get("tensor_buffers")}
    rows = [
        {
            "model": r["model"],
            "ctx": r["ctx"],
            "variant": r["variant"],
            "status": r["status"],
            "overrides": r["overrides"],
            "host_expert_bytes": r["host_expert_bytes"],
            "observed_on_host": len(r["cpu_tensors"]),
            "match": r["placement_match"],
            "missing": " ".join(r["placement_missing"]),
            "unexpected": " ".join(r["placement_unexpected"]),
        }
        for r in runs.values()
    ]
    return pd.DataFrame(rows)


def require_placed_as_asked(check: Any, log_path: str) -> None:
    """A MoeplaceError (one line) when the placement check table shows any variant placed otherwise."""

    bad = check[~check.match.astype(bool)] if len(check) else check
    if len(bad):
        runs = ", ".join(bad.model + "/" + bad.variant + " at " + bad.ctx.astype(str) + " tokens")
        raise MoeplaceError(
            f"llama.cpp placed {len(bad)} variant(s) otherwise than asked ({runs}); their tensors are in {log_path}."
        )
