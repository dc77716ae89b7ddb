"""The `moeplace` command: inspect a GGUF, recommend --n-cpu-moe, write shape twins."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

from ..core.errors import MoeplaceError
from ..runtime.model_ref import resolve
from . import model_files, speed, tools, tune
from .prior import add_parser as prior_parser
from .recommend import add_parser as recommend_parser


def _version() -> str:
    try:
        return version("moeplace")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line naming the flag (no usage block before it), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="moeplace", description=__doc__)
    p.add_argument("--version", action="version", version=f"moeplace {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    for add in (
        model_files.add_parser,
        recommend_parser,
        tune.add_parser,
        speed.add_parser,
        tools.add_parser,
        prior_parser,
    ):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "model", None):  # a path, URL, ollama:, lmstudio: or hf: reference
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
