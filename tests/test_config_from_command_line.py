"""Config values as Snakemake's --config gives them: list items and numbers arrive as strings; those that are the
numbers the schema wants become them, and one that is not names its field in one line."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

from moeplace.core.config import validate_config
from moeplace.core.errors import MoeplaceError

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
SEED = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())


def test_numeric_strings_become_the_numbers_the_schema_wants():
    cfg = copy.deepcopy(SEED)
    cfg["contexts"] = [8192, "32768"]
    cfg["device"].update(bw_vram_gbps="640.5", name="16")
    cfg["bench"] = {"repetitions": "3", "n_cpu_moe": ["0", "8"]}
    cfg["ram_tier"] = {"caps_pct": ["50"], "enabled": "false", "readahead_kb": "null"}
    validate_config(cfg, SCHEMA)
    assert cfg["contexts"] == [8192, 32768] and all(type(c) is int for c in cfg["contexts"])
    assert cfg["device"]["bw_vram_gbps"] == 640.5 and cfg["device"]["name"] == "16"  # a string field stays one
    assert cfg["bench"]["repetitions"] == 3 and cfg["bench"]["n_cpu_moe"] == [0, 8]
    assert cfg["ram_tier"]["caps_pct"] == [50] and cfg["ram_tier"]["enabled"] is False
    assert cfg["ram_tier"]["readahead_kb"] is None


@pytest.mark.parametrize("value", ["abc", "8k", "1.5"])
def test_a_string_that_is_not_the_number_wanted_still_names_the_field(value):
    cfg = copy.deepcopy(SEED)
    cfg["contexts"] = [8192, value]
    with pytest.raises(MoeplaceError) as err:
        validate_config(cfg, SCHEMA)
    assert str(err.value) == f"config: contexts.1: {value!r} is not of type 'integer'."


TARGET = "results/tables/budget/qwen3-coder-30b-a3b.csv"


def test_a_list_of_numbers_given_with_snakemake_config_is_accepted(tmp_path):
    wd = workflow_copy(tmp_path, SEED)
    run = snakemake(wd, "-n", TARGET, "--config", "contexts=[8192,32768]", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    bad = snakemake(wd, "-n", TARGET, "--config", "contexts=[8192,abc]", timeout=300)
    assert bad.returncode != 0
    lines = [line for line in bad.stderr.splitlines() if line.startswith("moeplace:")]
    assert lines == ["moeplace: config: contexts.1: 'abc' is not of type 'integer'."], bad.stderr[-3000:]
