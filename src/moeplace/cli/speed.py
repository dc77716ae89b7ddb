"""`moeplace predict MODEL` (decode and prefill speed per --n-cpu-moe and depth) and `moeplace calibrate MODEL
RUNS...` (the speed model fitted to llama-bench runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.backends import PRIOR_NAMES
from ..core.config import Bandwidths
from ..core.errors import MoeplaceError
from ..model.kvcache import CACHE_TYPES
from ..model.metadata import inspect_model
from ..plan.assumed import card_speed_model
from ..plan.calibrate import calibrate, read_runs
from ..plan.machine import DEFAULT_BANDWIDTHS
from ..plan.predict import predicted_speeds
from ..plan.request import check_ubatch, parse_contexts
from ..plan.speed import UNITS, prior, zero_fit_notes
from ..runtime.llamacpp_args import DEFAULT_CACHE_TYPE, DEFAULT_UBATCH
from .options import MODEL_HELP, speed_options
from .options import speeds as speeds_of


def add_parser(sub: Any) -> None:
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
        choices=sorted(set(PRIOR_NAMES.values())),
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
    check_ubatch(args.ubatch)
    speeds = speeds_of(args)
    meta = inspect_model(args.model)
    model = card_speed_model(speeds, meta, args.card, args.backend)
    depths = parse_contexts(args.depth, "--depth", allow_zero=True)
    n_values = _n_values(args.n_cpu_moe or f"0-{meta.n_layer}", meta.n_layer)
    rows = predicted_speeds(meta, model, n_values, depths, args.ubatch, (args.cache_type_k, args.cache_type_v))
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return
    print(f"{'n_cpu_moe':>9} {'depth':>7}  {'decode tok/s (95%)':>26}  {'prefill tok/s (95%)':>26}")
    for r in rows:
        cells = [
            "-" if tok_s is None else f"{tok_s:.1f} ({low:.1f}-{high:.1f})"
            for tok_s, low, high in (
                (r["tg_tok_s"], r["tg_low"], r["tg_high"]),
                (r["pp_tok_s"], r["pp_low"], r["pp_high"]),
            )
        ]
        print(f"{r['n_cpu_moe']:>9} {r['depth']:>7}  {cells[0]:>26}  {cells[1]:>26}")


def cmd_calibrate(args: argparse.Namespace) -> None:
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
        from ..runtime.outputs import write_json  # slow (pandas): imported by the one command that needs it

        write_json(args.output, model.to_json())
        print(f"wrote {args.output}")
