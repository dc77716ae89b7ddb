"""Writing results safely: every output appears whole (temp name + rename) or not at all."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

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
    except OSError as e:
        if e.filename is None:  # a write to an open file (a full disk) names no path: name the one it was for
            e.filename = str(path)
        raise
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


def free_space(path: str | Path) -> str:
    """How much room the filesystem holding `path` (or its nearest existing folder) has left, in words."""
    for folder in (Path(path), *Path(path).parents):
        try:
            return f"{shutil.disk_usage(folder).free / 2**20:,.1f} MiB free there"
        except OSError:
            continue
    return "its free space unknown"


def disk_problem(e: OSError, path: str | Path | None = None) -> str:
    """One line for a failed read or write: what failed, on which path (`path` where the error names none), and
    the room left there."""
    where = e.filename or path or "an unnamed file"
    return f"{(e.strerror or str(e)).lower()}: {where} ({free_space(where)})"


@contextmanager
def stage(log_path: str | Path) -> Iterator[logging.Logger]:
    """Run a pipeline stage: log to its log file, warnings to stderr too; a MoeplaceError, an OSError (a full
    disk, a folder it may not write) or Ctrl-C ends it with one line, not a traceback."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=str(log_path), level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("moeplace")
    said = logging.StreamHandler()  # on stderr: what the user should know without opening the log
    said.setLevel(logging.WARNING)
    said.setFormatter(logging.Formatter("moeplace: warning: %(message)s"))
    logging.getLogger().addHandler(said)
    going = logging.StreamHandler()  # on stderr too: how far a long stage is (a sweep's passes, a build's steps)
    going.addFilter(logging.Filter("moeplace.progress"))
    going.setFormatter(logging.Formatter("moeplace: %(message)s"))
    logging.getLogger().addHandler(going)
    try:
        yield log
    except MoeplaceError as e:
        _end(log, said, str(e))
    except OSError as e:
        _end(log, said, f"{disk_problem(e)}; make room or fix the path and run again")
    except KeyboardInterrupt:
        _end(log, said, "interrupted (Ctrl-C); this stage wrote no output, a rerun runs it again")
    finally:
        logging.getLogger().removeHandler(said)
        logging.getLogger().removeHandler(going)


def _end(log: logging.Logger, said: logging.Handler, message: str) -> NoReturn:
    logging.getLogger().removeHandler(said)  # the line below goes to stderr once, not twice
    log.error("%s", message)
    sys.exit(f"moeplace: {message}")  # the job's one line on stderr, exit status 1


def write_jsonl(path: str | Path, records: Sequence[Mapping[str, object]]) -> None:
    write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def read_jsonl(path: str | Path) -> list[JsonObject]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def append_jsonl(path: str | Path, records: Sequence[Mapping[str, object]]) -> None:
    """Add records to a JSON-lines file and wait until they are on disk (fsync): kept whatever happens next."""
    with Path(path).open("a") as f:
        f.write("".join(json.dumps(r, default=str) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def read_whole_jsonl(path: str | Path) -> list[JsonObject]:
    """The whole records of a file `append_jsonl` wrote (none where it does not exist); a last line cut short by
    a full disk or a kill is left out."""
    if not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def append_csv_row(path: str | Path, row: Row) -> None:
    """Add one row to a CSV (written whole again, atomically), creating it with a header if needed."""
    import pandas as pd  # here, not at the top: every command imports this module, few write a table

    path = Path(path)
    table = pd.read_csv(path) if path.exists() else pd.DataFrame()
    write_csv(path, pd.concat([table, pd.DataFrame([row])], ignore_index=True))
