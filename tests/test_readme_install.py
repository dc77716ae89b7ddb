"""The README's install is enough: a venv made by `pip install -e .` alone (no test extra) runs the
default pipeline and the README's report command. The test extra pulls in packages of its own (pytest
brings pygments, which `snakemake --report` needs), so the project's own venv cannot see such holes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import workflow_copy

README = (ROOT / "README.md").read_text()
FIGURE = "results/figures/ncmoe_1k.png"


def _name(requirement: str) -> str:
    return re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _readme_report_command() -> list[str]:
    """The report command exactly as the README shows it (the backquoted `snakemake --report ...`)."""
    assert "snakemake --report results/report.html" in README
    return shlex.split(re.search(r"`(snakemake --report [^`]+)`", README)[1])


def _fresh_env(venv: Path) -> dict[str, str]:
    """The fresh venv first on PATH, the project's own venv (with the test extra) nowhere on it."""
    ours = str(Path(sys.prefix) / "bin")
    path = [str(venv / "bin"), *(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != ours)]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return {**env, "PATH": os.pathsep.join(path), "VIRTUAL_ENV": str(venv)}


def test_environment_yml_pins_what_pyproject_pins():
    """environment.yml carries every runtime dependency at pyproject's exact version (conda `=` or pip `==`)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {_name(d): d.split("==")[1] for d in deps}
    assert all("==" in d for d in deps), deps
    entries = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    flat = [e for e in entries if isinstance(e, str)] + [p for e in entries if isinstance(e, dict) for p in e["pip"]]
    env = {_name(e): re.split(r"==?", e, maxsplit=1)[1] for e in flat if "=" in e and not e.startswith("python=")}
    assert {name: env.get(name) for name in pinned} == pinned
    assert "pygments" in pinned  # `snakemake --report` (README) fails without it


@pytest.mark.llamacpp
@pytest.mark.long
def test_readme_install_alone_runs_the_pipeline_and_the_report(tmp_path):
    venv = tmp_path / "venv"
    # The README's first line: python3 -m venv .venv && .venv/bin/pip install -e .
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=300)
    env = _fresh_env(venv)
    pip = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "-e", str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert pip.returncode == 0, pip.stderr[-4000:]
    assert not (venv / "bin/pytest").exists()  # the test extra really is absent
    snakemake = str(venv / "bin/snakemake")

    default = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg = {
        **default,
        "contexts": [1024],
        "bench": {**default["bench"], "prompt": 32, "gen": 8, "repetitions": 1, "n_cpu_moe": [0, 8]},
        "ceilings": {"enabled": False},
    }
    wd = workflow_copy(tmp_path / "wd", cfg)

    def run(*args: str, timeout: int) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=wd, env=env, capture_output=True, text=True, timeout=timeout)

    # A finished tiny run, made by the fresh venv's own snakemake: the runtime dependencies run the pipeline.
    done = run(snakemake, "--cores", "1", FIGURE, timeout=3000)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (wd / FIGURE).stat().st_size > 0

    # The README's report command, word for word, but for this run's context (1k, not 32k).
    command = _readme_report_command()
    assert command[0] == "snakemake" and command[-1] == "results/figures/ncmoe_32k.png"
    report = run(snakemake, *command[1:-1], FIGURE, timeout=900)
    assert report.returncode == 0, report.stderr[-4000:]
    html = wd / "results/report.html"
    assert html.exists()
    assert "ncmoe_1k.png" in html.read_text(errors="replace")
