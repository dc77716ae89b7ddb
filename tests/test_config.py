"""Config validation: defaults filled, and one clear line naming the bad field."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import ROOT

from moeplace.core.config import parse_settings, validate_config
from moeplace.core.errors import MoeplaceError

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
BASE = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())


def test_several_devices_are_a_list_of_sizes_in_llamacpps_order():
    cfg = validate_config(yaml.safe_load((ROOT / "config/examples/two-devices.yaml").read_text()), SCHEMA)
    settings = parse_settings(cfg)
    assert settings.device.vram_bytes == 40 * 10**6 and settings.device.other_vram_bytes == (30 * 10**6,)
    assert settings.memory.other_vram_bytes == (30 * 10**6,)
    one = parse_settings(validate_config(copy.deepcopy(BASE), SCHEMA))
    assert one.device.other_vram_bytes == () == one.memory.other_vram_bytes


def test_defaults_are_filled():
    cfg = validate_config(copy.deepcopy(BASE), SCHEMA)
    assert cfg["cache_type_k"] == "f16" and cfg["host"]["bw_ddr_gbps"] == 57.6
    assert cfg["models"]["qwen3-coder-30b-a3b-twin"]["quant"] == "Q4_K_M"
    assert cfg["llamacpp"]["version"] == "11434.0.0"


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda c: c["device"].update(vram="-16GB"), "device.vram"),
        (lambda c: c["device"].update(vram=16), "device.vram"),
        (lambda c: c["device"].update(vram=["24GB"]), "device.vram"),
        (lambda c: c["device"].update(vram=["24GB", "12 parsecs"]), "device.vram"),
        (lambda c: c.update(contexts=[8192, 0]), "contexts.1"),
        (lambda c: c.update(contexts=["32k"]), "contexts.0"),
        (lambda c: c.update(cache_type_k="q3_k"), "cache_type_k"),
        (lambda c: c.update(colour="blue"), "(top level)"),
        (lambda c: c["models"].update({"../escape": {"gguf": "x.gguf"}}), "models"),
        (lambda c: c["models"]["qwen3-coder-30b-a3b-twin"].update(gguf="x.gguf"), "models.qwen3-coder-30b-a3b-twin"),
        (lambda c: c["device"].update(bw_vram_gbps=0), "device.bw_vram_gbps"),
        (lambda c: c["host"].update(ram="8GB"), "host.ram needs host.bw_disk_gbps"),
        (lambda c: c.update(ram_tier={"caps_pct": [0]}), "ram_tier.caps_pct.0"),
        (lambda c: c.update(ram_tier={"lock_modes": ["all"]}), "ram_tier.lock_modes.0"),
        (lambda c: c.update(quants={"types": ["Q4_K_M"]}), "quants.types"),
    ],
)
def test_bad_values_name_the_field(change, field):
    cfg = copy.deepcopy(BASE)
    change(cfg)
    with pytest.raises(MoeplaceError) as err:
        validate_config(cfg, SCHEMA)
    message = str(err.value)
    assert message.startswith(f"config: {field}")
    assert "\n" not in message


def test_pinned_build_matches_the_schema_defaults():
    from moeplace.core.config import LlamacppSettings

    cfg = validate_config(copy.deepcopy(BASE), SCHEMA)
    assert LlamacppSettings(**cfg["llamacpp"]) == LlamacppSettings()
