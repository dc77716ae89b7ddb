"""Run the real Snakefile in a temporary copy of the workflow."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def workflow_copy(dest: Path, config: dict | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "config", "profiles", "environment.yml"):
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / item)
    if config is not None:
        (dest / "config/config.yaml").write_text(yaml.safe_dump(config))
    return dest


def snakemake(workdir: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SNAKEMAKE, "--cores", "1", *args], cwd=workdir, capture_output=True, text=True, timeout=timeout
    )
