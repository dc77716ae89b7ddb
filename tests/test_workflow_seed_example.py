"""The seed example through the real Snakefile: its predicted table and minimum --n-cpu-moe reproduce seed 000's
(§5.3-5.4), its twin's budget counts exact bytes and llama.cpp's own compute buffer, and a finished run reruns
nothing."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

SEED = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())


@pytest.mark.llamacpp  # the budget stage reads the compute buffer from the pinned llama.cpp's reserve
def test_seed_example_reproduces_predicted_table_and_minimum_n(tmp_path):
    wd = workflow_copy(tmp_path, SEED)
    targets = [
        f"results/tables/{t}/{m}.csv"
        for t in ("predicted", "budget")
        for m in ("qwen3-coder-30b-a3b", "qwen3-coder-30b-a3b-twin")
    ]
    run = snakemake(wd, *targets)
    assert run.returncode == 0, run.stderr[-3000:]
    predicted = pd.read_csv(wd / "results/tables/predicted/qwen3-coder-30b-a3b.csv").set_index("n_cpu_moe")
    for n, tok_s in {0: 323, 8: 168, 16: 113, 18: 105, 24: 86, 32: 69, 48: 49}.items():
        assert predicted.loc[n, "tok_s"] == pytest.approx(tok_s, rel=0.01)
    budget = pd.read_csv(wd / "results/tables/budget/qwen3-coder-30b-a3b.csv")
    assert budget.n_cpu_moe.tolist() == [12, 18, 27]
    twin = pd.read_csv(wd / "results/tables/budget/qwen3-coder-30b-a3b-twin.csv")
    # Exact per-tensor bytes and llama.cpp's own compute buffers, with the example's 1.0 GB kept free on top. By
    # hand against the seed's: the twin keeps 1.00 GB of non-expert weights on the card (the seed 0.89) and a
    # ~0.33 GB compute buffer besides the same 1.0 GB, so 0.44 GB less room for experts of 0.366 GB a layer: one
    # or two layers more on the host at every context. (13, 19, 29 is what this build reserves: a regression pin;
    # budget_check proves the method against real loads on the tiny twins.)
    assert all(1 <= t - s <= 2 for t, s in zip(twin.n_cpu_moe, [12, 18, 27]))
    assert twin.n_cpu_moe.tolist() == [13, 19, 29]
    assert (twin.compute_source == "llama.cpp").all() and (twin.compute_bytes > 300 * 2**20).all()
    assert (wd / "logs/metadata/qwen3-coder-30b-a3b.log").exists()
    # A finished run reruns nothing.
    again = snakemake(wd, "-n", *targets)
    assert "Nothing to be done" in again.stdout + again.stderr
