"""The workflow and the code pass their linters and formatters."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import ROOT
from workflow_helpers import SNAKEMAKE

BIN = Path(SNAKEMAKE).parent


def run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def test_snakemake_lint_and_snakefmt():
    lint = run(SNAKEMAKE, "--lint")
    assert lint.returncode == 0 and "Congratulations" in lint.stdout + lint.stderr, lint.stdout[-2000:]
    fmt = run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/rules")
    assert fmt.returncode == 0, fmt.stderr[-2000:]


def test_mypy_types():
    """src/moeplace type-checks at the strictness pyproject.toml's [tool.mypy] states (cached in .mypy_cache)."""
    check = run(str(BIN / "mypy"))
    assert check.returncode == 0, check.stdout[-4000:]


def test_ruff_check_and_format():
    check = run(str(BIN / "ruff"), "check", "src", "tests", "tools", "docs", "workflow/scripts", "scripts/gpu-check")
    assert check.returncode == 0, check.stdout[-2000:]
    fmt = run(
        str(BIN / "ruff"), "format", "--check", "src", "tests", "tools", "docs", "workflow/scripts", "scripts/gpu-check"
    )
    assert fmt.returncode == 0, fmt.stdout[-2000:]
