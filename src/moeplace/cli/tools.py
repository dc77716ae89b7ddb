"""`moeplace doctor` (which backend this machine builds and uses), `explain LOG` (what a llama.cpp log put where,
and why it ran out of memory), `verify DIR` and `merge DIR... -o OUT` (published directories), `retry` (a sweep's
failed values, measured again at the next run).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.backends import BUILDS
from ..core.config import default
from ..core.errors import MoeplaceError
from ..report.explain import explain
from ..report.explain_text import render
from ..report.paste import read_text
from ..runtime.backend import build_tools, detect


def add_parser(sub: Any) -> None:
    """doctor, explain, verify, merge and retry."""
    do = sub.add_parser("doctor", help="which llama.cpp backend this machine will build and use, and why")
    do.add_argument("--backend", choices=BUILDS, default=default("llamacpp.backend"))
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
    rt = sub.add_parser("retry", help="measure only the failed values (crash, timeout, error) of sweeps again")
    rt.add_argument("records", nargs="*", help="results/bench/MODEL/CTX.jsonl files (default: every one)")
    rt.set_defaults(func=cmd_retry)


def cmd_doctor(args: argparse.Namespace) -> int:
    backend = detect(args.backend)
    tools = build_tools()
    if args.json:
        print(json.dumps({**asdict(backend), "build_tools": tools}, indent=1))
        return 0
    print(f"backend: {backend.name} ({backend.reason})")
    for d in backend.devices:
        total, free = d["total_bytes"], d["free_bytes"]
        memory = f": {free / 2**30:.1f} of {total / 2**30:.1f} GiB free" if total and free is not None else ""
        print(f"  device {d['name']}{memory}")
    if backend.install:
        print(f"to use it, install {backend.install}")
    for tool, found in tools.items():
        print(f"  {tool}: {found or 'missing'}")
    if missing := [tool for tool, found in tools.items() if not found]:
        print(
            f"building llama.cpp needs {', '.join(missing)}: apt-get install cmake g++ (Debian), or set "
            "llamacpp.bin_dir to a llama.cpp you built"
        )
        return 1
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    found = explain(read_text(args.log), "stdin" if args.log == "-" else args.log)
    print(json.dumps(found, indent=1) if args.json else render(found))
    return 1 if found.get("status") in ("oom", "error") else 0


def cmd_verify(args: argparse.Namespace) -> None:
    from ..report.publish import verify  # slow (pandas): imported by the one command that needs it

    print(f"{args.folder}: {verify(Path(args.folder))} files match MANIFEST.json")


def cmd_merge(args: argparse.Namespace) -> None:
    # slow (pandas): imported by the one command that needs it
    from ..report.publish import DICTIONARY, load_dictionary, merge

    out = merge([Path(f) for f in args.folders], Path(args.output), load_dictionary(DICTIONARY))
    print(f"merged {len(args.folders)} directories into {out}")


def cmd_retry(args: argparse.Namespace) -> int:
    from ..measure.sweep_records import retry_failed

    paths = [Path(p) for p in args.records] or sorted(Path("results/bench").glob("*/*.jsonl"))
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise MoeplaceError(f"no sweep records at {', '.join(missing)}; give results/bench/MODEL/CTX.jsonl files")
    retried = 0
    for path in paths:
        if failed := retry_failed(path):
            values = ", ".join(f"n={n} {status}" for n, status in failed.items())
            print(f"{path}: {values} measured again at the next run; its other values are kept")
            retried += 1
    if not retried:
        print(f"nothing to retry: no failed value in {len(paths)} sweep(s)")
        return 0
    print("run the pipeline again (snakemake --cores 1 ...) to measure them")
    return 0
