"""`moeplace inspect MODEL` (bytes by role and KV shape, header only) and `moeplace twin SPEC OUT` (a GGUF
with a real architecture's tensor names, shapes and types).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.config import default
from ..core.units import parse_size
from ..model.describe import describe
from ..model.meta import to_json
from ..model.metadata import inspect_model
from ..runtime import remote
from .options import MODEL_HELP


def add_parser(sub: Any) -> None:
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


def cmd_inspect(args: argparse.Namespace) -> None:
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


def cmd_twin(args: argparse.Namespace) -> None:
    from ..model.twin import load_spec, write_twin  # slow (pandas): imported by the one command that needs it

    shard = parse_size(args.shard_size, "--shard-size") if args.shard_size else 0
    print(
        f"wrote {write_twin(load_spec(args.spec), args.out, weights=args.weights, seed=args.seed, shard_bytes=shard)}"
    )
