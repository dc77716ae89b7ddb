"""Faults met through the real Snakefile: results an earlier config left in results/ are not published as this
config's."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

SEED = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())
MODEL = "qwen3-coder-30b-a3b"  # the seed's constants: no llama.cpp build, no GGUF


@pytest.mark.long
@pytest.mark.fault(
    fault="publish after a config change",
    injected="results/ holding a context (4k), a model and figures of an earlier config beside this config's tables",
    sees='publish/<name>/ holds only this config\'s outputs; the others listed under "Left out: not from this config"',
    kept="every file in results/ (nothing deleted); MANIFEST.json names the ones left out",
)
def test_publish_leaves_out_what_an_earlier_config_made(tmp_path):
    wd = workflow_copy(tmp_path, SEED)
    budget = f"results/tables/budget/{MODEL}.csv"
    made = snakemake(wd, budget, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    earlier = [
        "results/tables/measured/4k.csv",
        "results/figures/ncmoe_4k.png",
        f"results/bench/{MODEL}/4k.jsonl",
        "results/metadata/a-model-since-removed.json",
    ]
    for path in earlier:
        (wd / path).parent.mkdir(parents=True, exist_ok=True)
        (wd / path).write_text("{}\n" if path.endswith("json") else "n_cpu_moe\n1\n")
    published = snakemake(wd, "publish", timeout=600)
    assert published.returncode == 0, published.stderr[-2000:]
    out = wd / "publish/moeplace-results"
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert f"tables/budget/{MODEL}.csv" in files
    assert not {"tables/measured/4k.csv", "figures/ncmoe_4k.png"} & files
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["not_from_this_config"] == sorted(earlier)
    assert list(manifest["models"]) == [MODEL]
    assert "Left out: not from this config" in (out / "index.html").read_text()
    assert all((wd / path).exists() for path in earlier)
