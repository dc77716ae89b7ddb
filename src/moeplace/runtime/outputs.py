"""Writing results safely: every output appears whole (temp name + rename) or not at all."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import MoeplaceError
from ..core.records import JsonObject, Row

if TYPE_CHECKING:
    import pandas as pd


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if os.path.exists(tmp):
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; it replaces `path` (a whole folder) only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o755)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1, default=str) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def write_csv(path: str | Path, frame: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


@contextmanager
def stage(log_path: str | Path) -> Iterator[logging.Logger]:
    """Run a pipeline stage: log to its log file; a MoeplaceError ends it with one line, not a traceback."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=str(log_path), level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("moeplace")
    try:
        yield log
    except MoeplaceError as e:
        log.error("%s", e)
        sys.exit(f"moeplace: {e}")  # the job's one line on stderr, exit status 1


def write_jsonl(path: str | Path, records: list[JsonObject]) -> None:
    write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def read_jsonl(path: str | Path) -> list[JsonObject]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def append_csv_row(path: str | Path, row: Row) -> None:
    """Add one row to a CSV (written whole again, atomically), creating it with a header if needed."""
    import pandas as pd  # here, not at the top: every command imports this module, few write a table

    path = Path(path)
    table = pd.read_csv(path) if path.exists() else pd.DataFrame()
    write_csv(path, pd.concat([table, pd.DataFrame([row])], ignore_index=True))
