"""The pinned llama.cpp build for tests: provisioned once per machine (cached under ~/.cache/moeplace)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import yaml
from conftest import ROOT

from moeplace.core.config import LlamacppSettings, validate_config
from moeplace.runtime.build import Build
from moeplace.runtime.llamacpp import provision


@cache
def manifest() -> Build:
    cfg = validate_config(
        yaml.safe_load((ROOT / "config/config.yaml").read_text()), ROOT / "workflow/schemas/config.schema.yaml"
    )
    return provision(LlamacppSettings(**cfg["llamacpp"]), Path("/tmp/moeplace-test-llamacpp.log"))


def rpc_servers() -> int:
    """How many emulated-device servers are running (a job must never leave one behind)."""
    return len(subprocess.run(["pgrep", "-f", "ggml-rpc-server -H 127.0.0.1"], capture_output=True).stdout.split())


def tiny_twin(folder: Path, spec: Path = ROOT / "config/models/tiny-qwen3moe.yaml") -> Path:
    """A random-weight Q4_K_M twin made with the pinned llama-quantize."""
    from moeplace.model.twin import load_spec, make_twin

    return make_twin(
        load_spec(spec), folder / f"{spec.stem}.gguf", "random", "Q4_K_M", 0, manifest(), folder / "quantize.log"
    )
