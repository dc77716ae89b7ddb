"""The `moeplace` command for tests: in this process, or as a new one where the process itself is the point.

`moeplace(...)` calls the command's own `main` with the same arguments, from the same folder, and gives back what
`python -m moeplace.cli` would: the exit code (argparse's exit 2 included), stdout and stderr. It saves the new
interpreter's ~1 s of imports per call, which was most of the README's test command's time. An exception that
escapes `main` is not caught: it fails the test, as a traceback in a new process's stderr would. The tests that are
about the process itself (start-up, imports, a real `python -m moeplace.cli` line) call `moeplace_process`.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

from conftest import ROOT

from moeplace.cli import main


def moeplace(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`moeplace ARGS` run in this process; `env`, where given, is the whole environment, as for a new process."""
    out, err = io.StringIO(), io.StringIO()
    environ = mock.patch.dict(os.environ, env, clear=True) if env is not None else contextlib.nullcontext()
    with environ, contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as done:  # argparse: --version, --help and its errors
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
            if isinstance(done.code, str):  # sys.exit("why"): Python prints it
                print(done.code, file=sys.stderr)
    return subprocess.CompletedProcess(["moeplace", *args], code, out.getvalue(), err.getvalue())


def moeplace_process(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m moeplace.cli ARGS` as a new process."""
    command = [sys.executable, "-m", "moeplace.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)
