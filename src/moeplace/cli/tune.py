"""`moeplace tune MODEL --ctx N --vram SIZE`: the lowest --n-cpu-moe that really runs, found with real llama.cpp
loads, then a calibration of the speed model at the chosen n.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..core.config import Device, DeviceTarget, LlamacppSettings, TuneSettings, default
from ..core.errors import MoeplaceError
from ..core.records import BenchRecord, Row
from ..core.units import parse_size
from ..model.kvcache import CACHE_TYPES
from ..model.memory import FLASH_ATTN, NO_PINS
from ..model.meta import ModelMeta
from ..model.metadata import inspect_model
from ..plan import commands
from ..plan.assumed import describe_speed, expected, speed_model
from ..plan.calibrate import calibration_file
from ..plan.request import Request
from ..plan.speed import SpeedModel
from ..runtime.llamacpp import provision
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_FLASH_ATTN, DEFAULT_UBATCH
from ..runtime.model_ref import is_remote
from .options import speed_options
from .options import speeds as speeds_of


def add_parser(sub: Any) -> None:
    """tune: real loads for the lowest n that runs."""
    tu = sub.add_parser("tune", help="find the lowest --n-cpu-moe that really runs, with real llama.cpp loads")
    tu.add_argument("model", help="a .gguf file, ollama:NAME, lmstudio:PUBLISHER/REPO or a cached hf:ORG/REPO")
    tu.add_argument("--ctx", type=int, required=True, help="target context length in tokens")
    tu.add_argument("--vram", required=True, help="device memory, e.g. 16GB (the emulated device's cap)")
    tu.add_argument("--device", choices=("auto", "gpu", "emulated"), default=default("device.kind"))
    tu.add_argument(
        "--safety-layers",
        type=int,
        default=default("tune.safety_layers"),
        help="whole layers added to the lowest --n-cpu-moe that ran (bytes kept free are recommend's --margin)",
    )
    tu.add_argument("--bin-dir", help="your llama.cpp build's bin/ (default: the pinned build, built once)")
    tu.add_argument("--threads", type=int, default=default("bench.threads"))
    tu.add_argument(
        "--timeout",
        type=float,
        default=default("tune.timeout_s"),
        help="seconds after which a probe counts as a timeout",
    )
    tu.add_argument("--cache-type-k", default=DEFAULT_CACHE_TYPE, choices=CACHE_TYPES)
    tu.add_argument("--cache-type-v", default=DEFAULT_CACHE_TYPE, choices=CACHE_TYPES)
    tu.add_argument("--ubatch", type=int, default=DEFAULT_UBATCH, help="llama.cpp's ubatch (-ub) the probes run with")
    tu.add_argument(
        "--flash-attn", choices=FLASH_ATTN, default=DEFAULT_FLASH_ATTN, help="llama.cpp's -fa the probes run with"
    )
    tu.add_argument("--record", help="append the result to this CSV, e.g. results/tables/tune.csv")
    tu.add_argument("--log", default="moeplace-tune.log", help="llama.cpp's output goes here")
    tu.add_argument(
        "--calibration-out",
        default="moeplace-calibration.json",
        help="where the speed calibration measured after the search goes (without --calibration): decode and a "
        "prefill at the chosen n and with the experts on the host, a minute or two on a GPU",
    )
    tu.add_argument("--no-calibrate", action="store_true", help="skip those calibrating runs")
    tu.add_argument(
        "--placement",
        choices=("ncmoe", "optimal"),
        default="ncmoe",
        help="optimal: after the search, race the placements the speed model cannot tell apart (KV cache types, "
        "ubatches, -ot, -ngl; yours among them) in interleaved rounds until one is clearly ahead",
    )
    tu.add_argument(
        "--objective",
        help="what --placement optimal races by: decode (default), prefill or mix:W (W the share of decode tokens)",
    )
    speed_options(tu)
    tu.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    # slow (pandas, and the measuring machinery): imported by the one command that needs them
    from ..measure.tune import Probing, calibrate_runs, tune_model
    from ..runtime.outputs import append_csv_row

    request = _checked_request(args)
    meta = inspect_model(args.model)
    speeds = speed_model(request.speeds, meta)  # before the probes: a bad --calibration fails at once
    log_path = Path(args.log)
    manifest = provision(LlamacppSettings(bin_dir=args.bin_dir), log_path)
    print(f"probing {meta.name} at {args.ctx} tokens with real loads (llama.cpp's output: {log_path})")
    workload = request.workload(args.ctx, "rpc")  # the probe's own: llama-bench's logits, no op offload asked
    vram = parse_size(args.vram, "--vram")
    target = DeviceTarget(args.device, "", vram)
    settings = TuneSettings(args.safety_layers, args.timeout, args.threads)
    result, record = tune_model(
        model_name=meta.name,
        model_path=args.model,
        meta=meta,
        workload=workload,
        target=target,
        memory=Device(vram, None),  # the margin: the device's backend's default
        probing=Probing(settings, manifest, log_path, Path.cwd()),
    )
    print(f"predicted minimum --n-cpu-moe: {result.predicted_n}; probed on {record['device']}")
    for p in result.probes:
        print(f"  load {p.n_cpu_moe:>3}: {p.status}" + (f", {p.tg_tok_s:.2f} tok/s" if p.tg_tok_s else ""))
    if args.record:
        append_csv_row(args.record, record)
    if result.chosen_n is None:
        print(
            f"moeplace: context {args.ctx} does not run even with every expert in host RAM; "
            "reduce the context or quantize the KV cache.",
            file=sys.stderr,
        )
        return 1
    print(
        f"{result.loads} loads; lowest feasible n = {result.lowest_n}, chosen n = {result.chosen_n} "
        f"(safety layers {args.safety_layers}): {result.chosen_tok_s:.2f} tok/s decode at {args.ctx} tokens"
    )
    if request.placement == "optimal":
        probing = Probing(settings, manifest, log_path, Path.cwd())
        return _race(args, request, meta, target, probing, speeds)
    if not (args.calibration or args.no_calibrate):
        probing = Probing(settings, manifest, log_path, Path.cwd())
        records = calibrate_runs(args.model, meta, workload, target, result.chosen_n, probing)
        speeds = _calibrated_by_tune(meta, records, speeds, args)
    _print_expected(args, request, meta, speeds, workload, result.chosen_n, record)
    return 0


def _checked_request(args: argparse.Namespace) -> Request:
    """Every value checked before llama.cpp is built (the probes are llama-bench runs)."""
    request = Request(
        (args.ctx,),
        args.model,
        args.model_ref,
        vram=(args.vram,),
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        flash_attn=args.flash_attn,
        ubatch=args.ubatch,
        emit="bench",
        speeds=speeds_of(args),
        placement=args.placement,
        objective=args.objective,
    )
    if args.safety_layers < 0:
        raise MoeplaceError(
            f"--safety-layers {args.safety_layers}: whole layers added to the lowest n that runs, 0 or more."
        )
    if args.threads < 1:
        raise MoeplaceError(f"--threads {args.threads}: give at least 1.")
    if is_remote(args.model):
        raise MoeplaceError(f"{args.model_ref}: tune runs the model, so it needs the file on disk; download it first.")
    return request


def _print_expected(
    args: argparse.Namespace,
    request: Request,
    meta: ModelMeta,
    speeds: Any,
    workload: Any,
    n: int,
    record: Row,
) -> None:
    """The chosen n's expected speed and the llama-server and llama-bench lines that run it."""
    host = NO_PINS.host_set(meta, n)
    print("  expected: " + describe_speed(expected(meta, speeds, host, workload), args.ctx))
    note = "  # add --rpc HOST:PORT for the emulated device" if record["device_kind"] == "emulated" else ""
    r = request
    print("  " + commands.llama_server(args.model, args.ctx, n, r.cache()) + note)
    print("  " + commands.llama_bench(args.model, args.ctx, n, r.cache()) + note)


def _calibrated_by_tune(meta: ModelMeta, records: list[BenchRecord], prior: Any, args: argparse.Namespace) -> Any:
    """The speed model fitted to tune's calibrating runs, written to --calibration-out; the prior where they cannot
    calibrate."""
    for r in records:
        what = f"{r['median_ts']:.2f} tok/s" if r.get("status") == "ok" else r.get("status")
        print(f"  calibrating: --n-cpu-moe {r['n_cpu_moe']}, {r['test']}: {what}")
    calibration = calibration_file(meta, records, prior)
    if calibration["status"] != "calibrated":
        print(f"  not calibrated ({calibration['not_calibrated']}): speeds from the prior")
        return prior
    out = args.calibration_out
    from ..runtime.outputs import write_json  # slow (pandas): imported by the one command that needs it

    write_json(out, calibration)
    print(
        f"  calibration: {out}; plan with it: moeplace recommend {args.model} --vram {args.vram} --ctx {args.ctx} "
        f"--calibration {out}"
    )
    return SpeedModel.from_json(calibration, out)


def _race(
    args: argparse.Namespace, request: Request, meta: ModelMeta, target: DeviceTarget, probing: Any, speeds: Any
) -> int:
    """tune --placement optimal: the contenders raced, the measured winner with its interval and line, and the list
    ranked again with the calibration the race's runs gave."""
    from ..measure.contenders import server_line, tune_placements

    found = tune_placements(meta, args.model, request, args.ctx, target, probing, speeds)
    what = request.ranked_by
    raced = found.race
    if raced.winner is None:
        print(f"moeplace: no placement of the {len(raced.contenders)} raced ran; see {args.log}.", file=sys.stderr)
        return 1
    raced_n = len(raced.contenders)
    print(f"raced {raced_n} placements the speed model cannot tell apart by {what} ({raced.rounds} rounds):")
    for i, c in enumerate(raced.contenders):
        predicted = f"predicted {c.row['score']:.2f}" if c.row["score"] else "not predicted"
        if c.failure:
            status = f"did not run ({c.failure})"
        elif c is raced.winner:
            status = f"{c.speed:.2f} tok/s measured, {predicted}: the fastest"
        else:
            delta, low, high = raced.intervals[i]
            band = f"{_pct(delta)} ({_pct(low)}..{_pct(high)}, 95%)"
            status = f"{c.speed:.2f} tok/s measured, {predicted}; the fastest is {band} faster"
        print(f"  {_describe(c.row)}: {status}")
    ahead = "clearly ahead of every other (95% intervals above 0)" if raced.clear else "not clearly ahead of all"
    print(f"measured winner, {ahead}:")
    print("  " + server_line(args.model, args.ctx, raced.winner.row, request))
    if found.reranked:
        out = args.calibration_out
        from ..runtime.outputs import write_json  # slow (pandas): imported by the one command that needs it

        write_json(out, found.calibration)
        print(f"ranked again with the calibration these runs gave ({out}), best first:")
        for row in found.reranked[:MAX_SHOWN]:
            print(f"  {'~' if row['equivalent'] else ' '} {_describe(row)}: {what} {row['score'] or 0:.2f} predicted")
    return 0


MAX_SHOWN = 5  # rows of the list ranked again


def _pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def _describe(row: Any) -> str:
    """A ranked placement in a few words: its placement, KV cache type and ubatch."""
    where = {
        "ncmoe": f"--n-cpu-moe {row['n_cpu_moe']}",
        "optimal": f"-ot ({len(row['host_tensors'])} expert tensors on the host)",
        "ngl": f"-ngl {row.get('n_gpu_layers')}",
    }[row["placement"]]
    return f"{where}, KV {row['type_k']}/{row['type_v']}, -ub {row['ubatch']}"
