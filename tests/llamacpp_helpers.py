"""The pinned llama.cpp build for tests: provisioned once per machine (cached under ~/.cache/moeplace)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from conftest import ROOT
from moeplace.config import validate_config
from moeplace.llamacpp import provision


@cache
def manifest() -> dict:
    cfg = validate_config(yaml.safe_load((ROOT / "config/config.yaml").read_text()),
                          ROOT / "workflow/schemas/config.schema.yaml")
    return provision(cfg["llamacpp"], Path("/tmp/moeplace-test-llamacpp.log"))
