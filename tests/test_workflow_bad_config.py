"""A bad config through the real Snakefile: the run stops before any job, with one line that names the field (or
the pair of settings llama.cpp refuses), no traceback and no results folder."""

from __future__ import annotations

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

SEED = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda c: c["device"].update(vram="-16GB"), "config: device.vram"),
        (lambda c: c.update(contexts=[0]), "config: contexts.0"),
        (lambda c: c.update(cache_type_v="q9"), "config: cache_type_v"),
        # the schema takes it, llama.cpp refuses it (a quantized V cache needs flash attention): no stage could load
        (
            lambda c: c.update(cache_type_v="q8_0", flash_attn="off"),
            "config cache_type_v/flash_attn: llama.cpp refuses",
        ),
    ],
)
def test_bad_config_stops_before_any_job_with_one_line(tmp_path, change, needle):
    cfg = yaml.safe_load(yaml.safe_dump(SEED))
    change(cfg)
    wd = workflow_copy(tmp_path, cfg)
    run = snakemake(wd, "results/tables/budget/qwen3-coder-30b-a3b.csv")
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.startswith("moeplace:")]
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in run.stderr
    assert not (wd / "results").exists()
