"""scripts/gpu-check on a machine without a GPU: both of its workflows plan (the full one scoring the speed model
on the card), it refuses to measure without CUDA, and its summary finds the out-of-memory cliff where the tables
put it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys

import pandas as pd
from conftest import ROOT

SCRIPT = ROOT / "scripts/gpu-check"


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    loader.exec_module(module)
    return module


def test_both_plans_are_valid_and_a_cpu_machine_is_refused_in_one_line(tmp_path):
    dry = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 0, (tmp_path / "full.log").read_text()[-3000:] if (tmp_path / "full.log").exists() else dry
    assert "both plans are valid" in dry.stdout
    config = (tmp_path / "full/config/config.yaml").read_text()
    assert "weights: blocks" in config and "vram: 16GiB" in config and "sweep_step: 4" in config
    assert "rule fidelity:" in (tmp_path / "full.log").read_text()  # the speed model is scored on the card
    real = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert real.returncode == 1 and real.stderr.strip().startswith("gpu-check: this machine would use cpu, not cuda")
    assert "Traceback" not in real.stderr


def test_the_summary_finds_the_cliff_at_the_budgets_minimum(tmp_path):
    gpu_check = load_script()
    tables = tmp_path / "results/tables"
    (tables / "budget").mkdir(parents=True)
    pd.DataFrame({"ctx": [4096, 32768], "n_cpu_moe": [3, 14]}).to_csv(tables / "budget/m.csv", index=False)
    runs = [(4096, n, "oom" if n < 3 else "ok", 100.0 - n) for n in (1, 2, 3, 7, 48)]
    runs += [(32768, n, "oom" if n < 15 else "ok", 50.0 - n) for n in (12, 13, 14, 15, 48)]  # off by one
    measured = pd.DataFrame(runs, columns=["ctx", "n_cpu_moe", "status", "avg_ts"]).assign(
        model="m", test="tg", variant="ncmoe"
    )
    measured.to_csv(tables / "measured.csv", index=False)
    assert gpu_check.cliffs(tmp_path) == [
        "| m | 4096 | 3 | 3 | 2 | yes | 97.0 .. 52.0 |",
        "| m | 32768 | 14 | 15 | 14 | no | 35.0 .. 2.0 |",
    ]


def test_the_summary_gives_the_card_each_parts_cliff_and_the_speed_models_errors(tmp_path):
    gpu_check = load_script()
    for part in gpu_check.PARTS:
        tables = tmp_path / part / "results/tables"
        (tables / "budget").mkdir(parents=True)
        pd.DataFrame({"ctx": [4096], "n_cpu_moe": [3]}).to_csv(tables / "budget/m.csv", index=False)
        runs = {"ctx": 4096, "n_cpu_moe": [2, 3], "status": ["oom", "ok"], "avg_ts": [0.0, 90.0]}
        pd.DataFrame(runs).assign(model="m", test="tg", variant="ncmoe").to_csv(tables / "measured.csv", index=False)
    scores = {"fit": "loo", "test": "tg", "depth": "all", "points": 9, "median_abs_error_pct": 3.14159}
    pd.DataFrame([scores]).to_csv(tmp_path / "full/results/tables/fidelity_summary.csv", index=False)
    doctor = {"name": "cuda", "reason": "nvidia-smi found a card", "devices": [{"name": "H200", "total_bytes": 2**37}]}
    text = gpu_check.summary(tmp_path, {"default": 60.0, "full": 300.0}, doctor)
    assert text.startswith("# moeplace GPU check on H200 (128 GiB)")
    assert "| total | 360 |" in text and text.count("| m | 4096 | 3 | 3 | 2 | yes | 90.0 .. 90.0 |") == 2
    assert ["loo", "tg", "all", "9", "3.1"] in [line.split() for line in text.splitlines()]
