"""The `moeplace` command: inspect a GGUF, recommend --n-cpu-moe, write shape twins."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from ..core.config import Device, default
from ..core.errors import MoeplaceError
from ..core.units import parse_size
from ..model.describe import describe
from ..model.kvcache import CACHE_TYPES
from ..model.memory import FLASH_ATTN, NO_PINS
from ..model.meta import ModelMeta, to_json
from ..model.metadata import inspect_model
from ..plan import commands
from ..plan.assumed import speed_model
from ..plan.machine import DEFAULT_BANDWIDTHS
from ..plan.request import Request, check_ubatch, parse_contexts
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_FLASH_ATTN, DEFAULT_UBATCH
from .options import MODEL_HELP, speed_options
from .options import speeds as speeds_of
from .prior import add_parser as prior_parser
from .recommend import add_parser as recommend_parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("moeplace")
    except PackageNotFoundError:
        return "unknown (not installed)"


def cmd_inspect(args: argparse.Namespace) -> None:
    from ..runtime import remote

    meta = inspect_model(args.model)
    if args.json:
        json.dump(to_json(meta), sys.stdout, indent=1)
        print()
        return
    if args.model != args.model_ref:
        print(f"{args.model_ref}: {args.model}")
    print(describe(meta))
    if remote.bytes_read:
        size = sum(f.size for f in meta.files)
        print(f"read {remote.bytes_read / 2**20:.2f} MiB of {size / 2**30:.2f} GiB over HTTP (the header only)")


def _n_values(text: str, n_layer: int) -> list[int]:
    """'12', '0,8,16' or '0-48' -> n values within 0..n_layer."""
    try:
        values: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            values += list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise MoeplaceError(f"--n-cpu-moe: {text!r} is not like 12, 0,8,16 or 0-48.") from None
    if not values or min(values) < 0 or max(values) > n_layer:
        raise MoeplaceError(f"--n-cpu-moe: {text!r} must lie within 0-{n_layer} (this model's layers).")
    return sorted(set(values))


def cmd_predict(args: argparse.Namespace) -> None:
    from ..plan.speed import Run, prefill_run

    check_ubatch(args.ubatch)
    speeds = speeds_of(args)
    meta = inspect_model(args.model)
    bw, backend, tflops = (None, args.backend, None)
    if args.card:
        from ..plan.cards import card_named

        card = card_named(args.card)
        bw, tflops = (card.gbps, None), card.tflops
        backend = args.backend or card.backend
    model = speed_model(speeds, meta, bw, backend or "cuda", tflops)
    kv = (args.cache_type_k, args.cache_type_v)
    rows = []
    for depth in parse_contexts(args.depth, "--depth", allow_zero=True):
        for n in _n_values(args.n_cpu_moe or f"0-{meta.n_layer}", meta.n_layer):
            tg = model.predict(meta, Run(n, depth, "tg", 128, args.ubatch, *kv))
            pp = model.predict(meta, prefill_run(n, depth, args.ubatch, *kv))
            row = {"n_cpu_moe": n, "depth": depth, "ubatch": args.ubatch}
            for test, pred in (("tg", tg), ("pp", pp)):
                row |= {f"{test}_tok_s": pred and pred["tok_s"], f"{test}_low": pred and pred["low"],
                        f"{test}_high": pred and pred["high"]}  # fmt: skip
            rows.append(row)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print(f"{'n_cpu_moe':>9} {'depth':>7}  {'decode tok/s (95%)':>26}  {'prefill tok/s (95%)':>26}")
    for r in rows:
        cells = [
            "-" if r[f"{t}_tok_s"] is None else f"{r[f'{t}_tok_s']:.1f} ({r[f'{t}_low']:.1f}-{r[f'{t}_high']:.1f})"
            for t in ("tg", "pp")
        ]
        print(f"{r['n_cpu_moe']:>9} {r['depth']:>7}  {cells[0]:>26}  {cells[1]:>26}")


def cmd_calibrate(args: argparse.Namespace) -> None:
    from ..core.config import Bandwidths
    from ..plan.calibrate import calibrate, read_runs
    from ..plan.speed import UNITS, prior, zero_fit_notes
    from ..runtime.outputs import write_json

    speeds = speeds_of(args)
    meta = inspect_model(args.model)
    bandwidths = Bandwidths(speeds.bw_vram_gbps or DEFAULT_BANDWIDTHS[0], speeds.bw_ddr_gbps or DEFAULT_BANDWIDTHS[1])
    model = calibrate(meta, read_runs(args.runs), prior(bandwidths))
    for test, m in model.tests.items():
        print(f"{test} ({m.runs} runs, relative spread {100 * m.spread:.1f}%):")
        for k, v in m.coef.items():
            se = f" ± {m.se[k]:.3g}" if k in m.se else ""
            print(f"  {k:>10} = {v:.4g}{se} {UNITS[k]}  ({m.source[k]})")
    for note in zero_fit_notes(model):
        print(f"note: {note}")
    if args.output:
        write_json(args.output, model.to_json())
        print(f"wrote {args.output}")


def cmd_twin(args: argparse.Namespace) -> None:
    from ..model.twin import load_spec, write_twin

    shard = parse_size(args.shard_size, "--shard-size") if args.shard_size else 0
    print(
        f"wrote {write_twin(load_spec(args.spec), args.out, weights=args.weights, seed=args.seed, shard_bytes=shard)}"
    )


def cmd_tune(args: argparse.Namespace) -> int:
    from ..core.config import DeviceTarget, TuneSettings
    from ..measure.tune import calibrate_runs, tune_model
    from ..plan.assumed import describe_speed, expected
    from ..runtime.llamacpp import PINNED, provision
    from ..runtime.model_ref import is_remote
    from ..runtime.outputs import append_csv_row

    # every value checked before llama.cpp is built; the probes are llama-bench runs
    request = Request((args.ctx,), args.model, args.model_ref, vram=(args.vram,), type_k=args.cache_type_k,
                      type_v=args.cache_type_v, flash_attn=args.flash_attn, ubatch=args.ubatch, emit="bench",
                      speeds=speeds_of(args))  # fmt: skip
    if args.margin < 0:
        raise MoeplaceError(f"--margin {args.margin}: whole layers added to the lowest n that runs, 0 or more.")
    if args.threads < 1:
        raise MoeplaceError(f"--threads {args.threads}: give at least 1.")
    if is_remote(args.model):
        raise MoeplaceError(f"{args.model_ref}: tune runs the model, so it needs the file on disk; download it first.")
    meta = inspect_model(args.model)
    speeds = speed_model(request.speeds, meta)  # before the probes: a bad --calibration fails at once
    log_path = Path(args.log)
    manifest = provision({"bin_dir": args.bin_dir} if args.bin_dir else PINNED, log_path)
    print(f"probing {meta.name} at {args.ctx} tokens with real loads (llama.cpp's output: {log_path})")
    workload = request.workload(args.ctx, "rpc")  # the probe's own: llama-bench's logits, no op offload asked
    target = DeviceTarget(args.device, "", parse_size(args.vram, "--vram"))
    settings = TuneSettings(args.margin, 3600, args.threads)
    result, record = tune_model(
        model_name=meta.name,
        model_path=args.model,
        meta=meta,
        workload=workload,
        target=target,
        memory=Device(target.vram_bytes, 0),
        settings=settings,
        manifest=manifest,
        log_path=log_path,
        workdir=Path.cwd(),
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
        f"(margin {args.margin}): {result.chosen_tok_s:.2f} tok/s decode at {args.ctx} tokens"
    )
    if not (args.calibration or args.no_calibrate):
        records = calibrate_runs(args.model, meta, workload, target, manifest, result.chosen_n, settings, log_path,
                                 Path.cwd())  # fmt: skip
        speeds = _calibrated_by_tune(meta, records, speeds, args)
    host = NO_PINS.host_set(meta, result.chosen_n)
    print("  expected: " + describe_speed(expected(meta, speeds, host, workload), args.ctx))
    note = "  # add --rpc HOST:PORT for the emulated device" if record["device_kind"] == "emulated" else ""
    r, n = request, result.chosen_n
    print("  " + commands.llama_server(args.model, args.ctx, n, r.cache()) + note)
    print("  " + commands.llama_bench(args.model, args.ctx, n, r.cache()) + note)
    return 0


def _calibrated_by_tune(meta: ModelMeta, records: list[dict[str, Any]], prior: Any, args: argparse.Namespace) -> Any:
    """The speed model fitted to tune's calibrating runs, written to --calibration-out; the prior where they cannot
    calibrate."""
    from ..plan.calibrate import calibration_file
    from ..plan.speed import SpeedModel
    from ..runtime.outputs import write_json

    for r in records:
        what = f"{r['median_ts']:.2f} tok/s" if r.get("status") == "ok" else r.get("status")
        print(f"  calibrating: --n-cpu-moe {r['n_cpu_moe']}, {r['test']}: {what}")
    calibration = calibration_file(meta, records, prior)
    if calibration["status"] != "calibrated":
        print(f"  not calibrated ({calibration['not_calibrated']}): speeds from the prior")
        return prior
    out = args.calibration_out
    write_json(out, calibration)
    print(f"  calibration: {out}; plan with it: moeplace recommend {args.model} --vram {args.vram} --ctx {args.ctx} "
          f"--calibration {out}")  # fmt: skip
    return SpeedModel.from_json(calibration, out)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line naming the flag (no usage block before it), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _tune_parser(sub: Any) -> None:
    """tune: real loads for the lowest n that runs."""
    tu = sub.add_parser("tune", help="find the lowest --n-cpu-moe that really runs, with real llama.cpp loads")
    tu.add_argument("model", help="a .gguf file, ollama:NAME, lmstudio:PUBLISHER/REPO or a cached hf:ORG/REPO")
    tu.add_argument("--ctx", type=int, required=True, help="target context length in tokens")
    tu.add_argument("--vram", required=True, help="device memory, e.g. 16GB (the emulated device's cap)")
    tu.add_argument("--device", choices=("auto", "gpu", "emulated"), default=default("device.kind"))
    tu.add_argument(
        "--margin", type=int, default=default("tune.margin"), help="whole layers added to the lowest feasible n"
    )
    tu.add_argument("--bin-dir", help="your llama.cpp build's bin/ (default: the pinned build, built once)")
    tu.add_argument("--threads", type=int, default=default("bench.threads"))
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
    speed_options(tu)
    tu.set_defaults(func=cmd_tune)


def _predict_and_calibrate_parsers(sub: Any) -> None:
    """predict and calibrate: the speed model's CLI."""
    pr = sub.add_parser("predict", help="decode and prefill speed per --n-cpu-moe and context depth")
    pr.add_argument("model", help=MODEL_HELP + " (header only is read)")
    pr.add_argument("--depth", default="0", help="tokens already in the KV cache (llama-bench -d), e.g. 0,32768")
    pr.add_argument("--n-cpu-moe", help="n values: 12, 0,8,16 or 0-48 (default: every n)")
    pr.add_argument("--ubatch", type=int, default=DEFAULT_UBATCH, help="llama.cpp's ubatch (-ub) for prefill")
    pr.add_argument("--cache-type-k", default=DEFAULT_CACHE_TYPE, choices=CACHE_TYPES)
    pr.add_argument("--cache-type-v", default=DEFAULT_CACHE_TYPE, choices=CACHE_TYPES)
    pr.add_argument("--json", action="store_true", help="print a JSON list of objects")
    pr.add_argument(
        "--backend",
        choices=("cuda", "rocm", "vulkan", "sycl", "metal"),
        help="the card's llama.cpp backend: the prior learned from published sweeps differs by backend (default: "
        "--card's, else cuda)",
    )
    pr.add_argument("--card", help="a card by name, e.g. '4070 Ti Super': its datasheet bandwidth and TFLOPS")
    speed_options(pr)
    pr.set_defaults(func=cmd_predict)

    ca = sub.add_parser("calibrate", help="fit the speed model to llama-bench -o jsonl runs of this model")
    ca.add_argument("model", help="the .gguf file the runs measured")
    ca.add_argument("runs", nargs="+", help="llama-bench -o jsonl output files (yours, or results/bench/...)")
    ca.add_argument("-o", "--output", help="write the calibration here (JSON), for --calibration")
    speed_options(ca, calibration=False)
    ca.set_defaults(func=cmd_calibrate)


def _twin_and_inspect_parsers(sub: Any) -> None:
    """twin and inspect: model files."""
    ins = sub.add_parser("inspect", help="bytes by role and KV shape of a GGUF model (header only)")
    ins.add_argument("model", help=MODEL_HELP)
    ins.add_argument("--json", action="store_true", help="print the full metadata as JSON")
    ins.set_defaults(func=cmd_inspect)

    tw = sub.add_parser("twin", help="write a GGUF with a real architecture's tensor names, shapes and types")
    tw.add_argument("spec", help="architecture spec YAML (see config/models/)")
    tw.add_argument("out", help="output .gguf path")
    tw.add_argument(
        "--weights",
        choices=("none", "random", "blocks"),
        default="none",
        help="none: sparse file, header-faithful; random: F16 random weights llama.cpp can run; blocks: random "
        "quantized blocks in the spec's types (a full-size model llama.cpp can run, no F16 copy)",
    )
    tw.add_argument(
        "--seed", type=int, default=default("models.*.seed"), help="random seed for --weights random or blocks"
    )
    tw.add_argument(
        "--shard-size", help="split a header-only twin into shards of at most this size (e.g. 50GB), as gguf-split does"
    )
    tw.set_defaults(func=cmd_twin)


def _tool_parsers(sub: Any) -> None:
    """doctor, explain, verify and merge."""
    do = sub.add_parser("doctor", help="which llama.cpp backend this machine will build and use, and why")
    do.add_argument(
        "--backend", choices=("auto", "cpu", "cuda", "hip", "vulkan", "lavapipe"), default=default("llamacpp.backend")
    )
    do.add_argument("--json", action="store_true")
    do.set_defaults(func=cmd_doctor)
    ex = sub.add_parser("explain", help="what a llama.cpp log put on each device, and why it ran out of memory")
    ex.add_argument("log", help="a llama-server / llama-cli / llama-bench log file, or - for stdin")
    ex.add_argument("--json", action="store_true", help="print the account as JSON (MiB)")
    ex.set_defaults(func=cmd_explain)
    ve = sub.add_parser("verify", help="re-check a published directory against its MANIFEST.json")
    ve.add_argument("folder", help="publish/<name>/")
    ve.set_defaults(func=cmd_verify)
    me = sub.add_parser("merge", help="merge published directories from several hosts, devices or builds")
    me.add_argument("folders", nargs="+", help="publish/<name>/ directories")
    me.add_argument("-o", "--output", required=True, help="the merged directory to write")
    me.set_defaults(func=cmd_merge)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="moeplace", description=__doc__)
    p.add_argument("--version", action="version", version=f"moeplace {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    for add in (
        _twin_and_inspect_parsers,
        recommend_parser,
        _tune_parser,
        _predict_and_calibrate_parsers,
        _tool_parsers,
        prior_parser,
    ):
        add(sub)
    return p


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..runtime.backend import build_tools, detect

    backend = detect(args.backend)
    tools = build_tools()
    if args.json:
        print(json.dumps({**backend.as_dict(), "build_tools": tools}, indent=1))
        return 0
    print(f"backend: {backend.name} ({backend.reason})")
    for d in backend.devices:
        memory = (
            f": {d['free_bytes'] / 2**30:.1f} of {d['total_bytes'] / 2**30:.1f} GiB free" if d["total_bytes"] else ""
        )
        print(f"  device {d['name']}{memory}")
    if backend.install:
        print(f"to use it, install {backend.install}")
    for tool, found in tools.items():
        print(f"  {tool}: {found or 'missing'}")
    if missing := [tool for tool, found in tools.items() if not found]:
        print(f"building llama.cpp needs {', '.join(missing)}: apt-get install cmake g++ (Debian), or set "
              "llamacpp.bin_dir to a llama.cpp you built")  # fmt: skip
        return 1
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from ..report.explain import explain, read_text, render

    found = explain(read_text(args.log), "stdin" if args.log == "-" else args.log)
    print(json.dumps(found, indent=1) if args.json else render(found))
    return 1 if found.get("status") in ("oom", "error") else 0


def cmd_verify(args: argparse.Namespace) -> None:
    from ..report.publish import verify

    print(f"{args.folder}: {verify(Path(args.folder))} files match MANIFEST.json")


def cmd_merge(args: argparse.Namespace) -> None:
    from ..report.publish import DICTIONARY, load_dictionary, merge

    out = merge([Path(f) for f in args.folders], Path(args.output), load_dictionary(DICTIONARY))
    print(f"merged {len(args.folders)} directories into {out}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "model", None):  # a path, URL, ollama:, lmstudio: or hf: reference
            from ..runtime.model_ref import resolve

            args.model_ref, args.model = args.model, resolve(args.model)
        return int(args.func(args) or 0)
    except MoeplaceError as e:
        print(f"moeplace: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `moeplace inspect M | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
