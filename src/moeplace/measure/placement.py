"""Stage 'placement': expert placements beyond --n-cpu-moe (plan/offload.py) run as llama-bench -ot variants,
each interleaved with -ncmoe at the same host bytes, and checked against where llama.cpp's load log put every
tensor; llama-fit-params' own placement as one more variant."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..core.errors import MoeplaceError
from ..plan.offload import expert_tensors, matching_tensors, optimal_placement, ot_value, tensor_bytes, variants
from .bench import BenchJob, Rig, run_bench


def check_placement(intended: set[str], buffers: dict[str, str]) -> dict[str, Any]:
    """Compare the intended host set with where llama.cpp's 'buffer type overridden' lines put each tensor:
    every intended tensor must go to a host buffer, and no other tensor may."""
    from ..runtime.llama_log import is_host

    observed = {name for name, buffer in buffers.items() if is_host(buffer)}
    return {
        "intended": len(intended),
        "observed": len(observed),
        "missing": sorted(intended - observed),
        "unexpected": sorted(observed - intended),
        "match": intended == observed,
    }


def variants_table(records: list[dict[str, Any]]) -> Any:
    """Per model, context and test: each variant's tok/s and its difference from --n-cpu-moe at the same bytes,
    against the -ncmoe runs interleaved with it (paired) where it has them, else the first_n variant's own
    runs; with the difference's 95% Welch interval and the smallest difference the runs could have detected."""
    import math

    import pandas as pd

    from ..core.stats import delta_interval, min_detectable_effect

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


def variant_n(meta: dict[str, Any], budget_n: int | None) -> int:
    """The n the variants are compared at: the budget's minimum, or half the layers when everything fits."""
    return budget_n if budget_n else meta["n_layer"] // 2


def run_variant(variant: str, meta: dict[str, Any], n: int, budget_bytes: float, job: BenchJob, rig: Rig) -> list[dict]:
    """One variant's llama-bench run of `job`'s model and context, with its placement checked against llama.cpp's
    load log."""
    from ..model.gguf_file import read_header
    from ..runtime.cpus import split_cpus
    from ..runtime.device import attached

    sizes = {t.name: t.n_bytes for t in read_header(job.model_path).tensors}
    if variant == "fit_params":
        with attached(rig.device, rig.manifest, split_cpus(rig.device.kind == "emulated"), rig.log_path) as rpc:
            overrides = fit_params_overrides(rig.manifest, job.model_path, job.ctx, rpc, rig.log_path)
        intended = matching_tensors(overrides, list(sizes))
    else:
        if variant == "optimal":
            intended = optimal_placement(meta, budget_bytes)
        else:
            intended = {"first_n": expert_tensors(meta, list(range(n))), **variants(meta, n)}[variant]
        overrides = None if variant == "first_n" else ot_value(intended) or None
    paired = None if variant == "first_n" else n  # -ncmoe n interleaved with it
    first_n = n if variant == "first_n" else 0
    records = run_bench(
        replace(job, n_cpu_moe=first_n, variant=variant, overrides=overrides, paired_n_cpu_moe=paired), rig
    )
    for r in records:
        check = check_placement(intended, r["tensor_buffers"])
        r.update(
            host_expert_bytes=sum(sizes[t] for t in intended),
            placement_match=check["match"],
            placement_missing=check["missing"],
            placement_unexpected=check["unexpected"],
        )
    return records


def placement_check_table(records: list[dict[str, Any]]) -> Any:
    """One row per variant run that left a load log (its tests share one), whatever its status: where
    llama.cpp put the tensors against where the placement asked for them."""
    import pandas as pd

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


def fit_params_overrides(manifest: dict[str, Any], model: str, ctx: int, rpc: str | None, log_path: Any) -> str | None:
    """llama.cpp's own placement for this device (llama-fit-params, no margin), as a llama-bench -ot value."""
    from ..runtime.allocation import fitted_placement_args
    from ..runtime.llamacpp import require_binary
    from ..runtime.process import run_checked

    cmd = [str(require_binary(manifest, "llama-fit-params")), "-m", model, "-c", str(ctx), "-fitt", "0"]
    if rpc:
        cmd += ["--rpc", rpc]
    out = run_checked(cmd, f"llama-fit-params placing {model} at {ctx} tokens", log_path, timeout_s=600)
    return fitted_placement_args(out.stdout)[1]


def compare_devices(*, model_path: str, meta: dict[str, Any], workload: Any, caps: list[int],
                    manifest: dict[str, Any], log_path: Any, slowdown: float = 8.0, rounds: int = 3,
                    repetitions: int = 3, gen: int = 32) -> list[dict[str, Any]]:  # fmt: skip
    """Decode at `workload`'s full context over emulated devices capped to `caps` (one RPC server each, on the
    device's CPU; the host side slowed `slowdown` times while timed, as in the bench stage) under three placements:
    moeplace's per-device plan (-ts layer counts, one -ot rule for the host's experts), the lowest --n-cpu-moe that
    loads with llama.cpp's own split, and llama-fit-params' placement (its -ngl, -ts and -ot). The placements take
    turns, one llama-bench process each per round, so a slow spell of the host falls on all alike. One row per
    placement: its arguments, the expert bytes it keeps on the host, its decode samples and median with a 95%
    interval, and its ratio to the plan's median."""
    import statistics
    from contextlib import ExitStack

    from ..core.stats import median_interval
    from ..runtime.allocation import fitted_placement, load_probe
    from ..runtime.cpus import split_cpus
    from ..runtime.device import DeviceSetup, host_side, rpc_device
    from ..runtime.llamacpp import require_binary
    from ..runtime.llamacpp_args import cache_args
    from ..runtime.process import run
    from ..runtime.tool_output import bench_records
    from .budget_check import fitted_host_experts, reserved_plan
    from .tune import search

    w, cpus = workload, split_cpus(True)
    with ExitStack() as stack:
        endpoints = [stack.enter_context(rpc_device(manifest, cap, cpus.device or cpus.bench,
                                                    log_path.with_suffix(f".rpc{i}.log")))
                     for i, cap in enumerate(caps)]  # fmt: skip
        rpc = ",".join(endpoints)
        plan = reserved_plan(meta, w, caps, endpoints, manifest, model_path, log_path)
        if not plan.fits:
            raise MoeplaceError(f"{model_path} does not fit on devices of {caps} bytes at {w.ctx} tokens.")

        def loads(n: int) -> tuple[str, None]:
            return load_probe(manifest, model_path, w.llama_args(), n, rpc, log_path)[0], None

        n_cpu_moe = search(len(plan.host_expert_layers), meta["n_layer"], loads, spill_ratio=0.0).lowest_n
        fit_ngl, fit_ot, fit_ts = fitted_placement(manifest, model_path, w.llama_args(), rpc, log_path)
        if n_cpu_moe is None or fit_ngl is None:
            raise MoeplaceError(f"no --n-cpu-moe loads, or llama-fit-params found no placement, where the plan fits "
                                f"({w.ctx} tokens on devices of {caps} bytes); see {log_path}.")  # fmt: skip
        placements = {  # name: (llama-bench's arguments, the expert tensors it keeps on the host)
            "per-device plan": (["-ngl", "99", "-ts", "/".join(map(str, plan.tensor_split))]
                                + (["-ot", plan.host_rule(meta, ";")] if plan.host_expert_layers else []),
                                plan.host_tensors(meta)),
            f"-ncmoe {n_cpu_moe}, llama.cpp's split": (["-ngl", "99", "-ncmoe", str(n_cpu_moe)],
                                                       expert_tensors(meta, list(range(n_cpu_moe)))),
            "llama-fit-params": (["-ngl", str(fit_ngl)] + (["-ts", fit_ts] if fit_ts else [])
                                 + (["-ot", fit_ot] if fit_ot else []),
                                 fitted_host_experts(meta, fit_ngl, fit_ot)),
        }  # fmt: skip
        bench = [str(require_binary(manifest, "llama-bench")), "--rpc", rpc, "-m", model_path, "-p", "0",
                 "-n", str(gen), "-d", str(w.ctx - gen), "-r", str(repetitions), "-t", "1", "-o", "jsonl",
                 "--progress", *cache_args(w.type_k, w.type_v, w.flash_attn, w.ubatch)]  # fmt: skip
        samples: dict[str, list[float]] = {name: [] for name in placements}
        device = DeviceSetup("emulated", "emulated devices", sum(caps), host_slowdown=slowdown)
        host = stack.enter_context(host_side(device, cpus.bench))
        for _ in range(rounds):
            for name, (args, _) in placements.items():
                done = run([*bench, *args], timeout_s=1800, log_path=log_path, before_exec=host.enter,
                           on_stderr_line=host.on_line)  # fmt: skip
                for record in bench_records(done.stdout):
                    samples[name] += record.get("samples_ts") or []
    plan_median = statistics.median(samples["per-device plan"]) if samples["per-device plan"] else math.nan
    rows = []
    for name, (args, on_host) in placements.items():
        median, low, high = median_interval(samples[name])
        rows.append({"placement": name, "host_expert_mib": tensor_bytes(meta, on_host) / 2**20, "args": " ".join(args),
                     "samples": len(samples[name]), "tg_median": median, "ci95_low": low, "ci95_high": high,
                     "vs_plan": median / plan_median})  # fmt: skip
    return rows
