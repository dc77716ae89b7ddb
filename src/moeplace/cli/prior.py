"""moeplace prior learn DIR... -o prior.json: a speed prior learned from published sweeps (plan/prior_learn.py)."""

from __future__ import annotations

import argparse
from typing import Any, cast

from ..core.backends import PRIOR_NAMES
from ..core.errors import MoeplaceError
from ..plan.prior_learn import MachineFacts, learn_from_directories


def add_parser(sub: Any) -> None:
    pr = sub.add_parser("prior", help="learn the speed prior from published sweeps (moeplace publish/ directories)")
    what = pr.add_subparsers(dest="prior_command", required=True)
    le = what.add_parser("learn", help="pool published directories with the shipped sweeps and learn a prior")
    le.add_argument("folders", nargs="*", help="publish/<name>/ directories (llama-bench.sqlite, MANIFEST.json)")
    le.add_argument("-o", "--output", required=True, help="the prior to write (JSON), for --prior")
    le.add_argument(
        "--model",
        action="append",
        default=[],
        dest="models",
        metavar="NAME=PATH",
        help="a published model's file (.gguf, header only read) or twin spec (.yaml)",
    )
    le.add_argument("--no-shipped", action="store_true", help="learn from the directories alone")
    host = le.add_mutually_exclusive_group()
    host.add_argument("--bw-ddr", type=float, dest="host_gbps", help="the hosts' RAM bandwidth, datasheet GB/s")
    host.add_argument(
        "--bw-ddr-measured",
        type=float,
        dest="host_measured_gbps",
        help="the hosts' RAM bandwidth as measured (STREAM, membw), GB/s",
    )
    le.add_argument("--bw-vram", type=float, dest="card_gbps", help="the card's memory bandwidth, GB/s")
    le.add_argument("--card-tflops", type=float, dest="card_tflops", help="the card's FP32 TFLOPS")
    le.add_argument("--bw-link", type=float, dest="link_gbps", help="the card's PCIe link, GB/s")
    le.add_argument("--backend", choices=sorted(set(PRIOR_NAMES.values())), help="the runs' llama.cpp backend")
    le.set_defaults(func=cmd_prior_learn)


def cmd_prior_learn(args: argparse.Namespace) -> None:
    models = {}
    for given in args.models:
        name, sep, path = given.partition("=")
        if not sep or not name or not path:
            raise MoeplaceError(f"--model {given!r}: give NAME=PATH, e.g. qwen3-30b-a3b=/models/q.gguf.")
        models[name] = path
    flags = {k: getattr(args, k) for k in ("card_gbps", "card_tflops", "link_gbps", "backend", "host_gbps")}
    for flag, value in flags.items():
        if isinstance(value, float) and not value > 0:
            raise MoeplaceError(f"--{flag}: {value:g} must be a positive number.")
    if args.host_measured_gbps:
        flags |= {"host_gbps": args.host_measured_gbps, "host_measured": True}
    elif args.host_gbps:
        flags["host_measured"] = False
    given = cast(MachineFacts, {k: v for k, v in flags.items() if v is not None})  # the machine flags given
    for line in learn_from_directories(args.folders, models, given, not args.no_shipped, args.output):
        print(line)
    print(f"prior: {args.output}; use it with moeplace recommend/predict --prior {args.output}")
