"""moeplace as a library: the README's example runs and gives what the command line prints; the layers under the
command line print nothing; the library, `recommend --json` and the pipeline's budget stage answer one question
the same way over generated requests."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT

import moeplace
from moeplace.core.errors import MoeplaceError

PACKAGE = ROOT / "src" / "moeplace"


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```python\n(import moeplace.*?)```", text, re.DOTALL)
    return block


def _cli_json(cwd, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "recommend", *args, "--json"], cwd=cwd,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_the_readmes_example_prints_what_recommend_prints(qwen3_twin, tmp_path):
    (tmp_path / "qwen3.gguf").symlink_to(qwen3_twin)
    done = subprocess.run([sys.executable, "-c", _readme_example()], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    card = ("--card", "RTX 4070 Ti SUPER", "-ctk", "q8_0", "-ctv", "q8_0")
    plans = _cli_json(tmp_path, "qwen3.gguf", "--ctx", "8192,32768", *card)
    for i, p in enumerate(plans):  # the library's n, KV bytes and line are the command's, context by context
        ctx, n, kv, _ = lines[2 * i].split()
        assert (int(ctx), int(n), int(kv)) == (p["ctx"], p["n_cpu_moe"], p["kv_bytes"])
        assert lines[2 * i + 1] == p["command"] == p["commands"]["server"]
        assert f"--n-cpu-moe {n} " in p["command"] and "--cache-type-k q8_0" in p["command"]
    assert lines[4] == "768 MiB kept free; every context fits: True"  # CUDA's default margin (core/backends.py)


def test_a_bad_option_is_one_line_not_a_traceback(qwen3_twin):
    with pytest.raises(MoeplaceError, match="no option 'ctx_size'"):
        moeplace.recommend(str(qwen3_twin), ctx=8192, card="RTX 3060 12GB", ctx_size=4)
    with pytest.raises(MoeplaceError, match="--cache-type-k q9"):
        moeplace.recommend(str(qwen3_twin), ctx=8192, card="RTX 3060 12GB", type_k="q9")


# Where output to a person belongs: the command line and the report. The pipeline's scripts print through
# runtime/outputs.stage, which ends a stage with its one line (sys.exit with the message, not a print).
PRINTING = ("cli", "report")


def _prints(path) -> list[int]:
    """Lines of a module that print or write to stdout/stderr."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr"):
            if isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(node.lineno)
    return found


def test_only_the_command_line_and_the_report_print():
    offenders = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in PRINTING and (lines := _prints(path))
    }
    assert offenders == {}
    assert _prints(PACKAGE / "cli" / "recommend.py")  # the check can see a print where there is one
