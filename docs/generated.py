"""What the docs scripts share: write a generated file, or with --check say in one line that it is out of date."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, what: str, script: str) -> int:
    """Exit status: with --check, 1 when `path` does not hold `text` (named `what`, rewritten by docs/`script`)."""
    if "--check" in sys.argv:
        if not path.exists() or path.read_text() != text:
            print(f"{what} is out of date: run python docs/{script}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0
