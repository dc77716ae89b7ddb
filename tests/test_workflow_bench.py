"""The benchmark half through the real Snakefile: the default run, caching, reruns, the report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from workflow_helpers import SNAKEMAKE, snakemake, workflow_copy

from moeplace.measure.bench import auto_sweep

pytestmark = [pytest.mark.llamacpp, pytest.mark.long]
DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())


PREDICTED = tuple(f"results/tables/predicted/{m}.csv" for m in ("tiny-qwen3moe", "tiny-gpt-oss"))
TARGETS = ("results/tables/measured.csv", "results/tables/compare.csv", *PREDICTED)


def planned_jobs(wd, *args) -> dict[str, int]:
    """Rule -> job count of a dry run for the measured tables."""
    out = snakemake(wd, "-n", *args, *TARGETS)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.MULTILINE)}


# The README's first command on the default config, with 3 repetitions where auto counts 9-20: nothing asserted here
# depends on how many ran, and CI's time does not follow the host's noise. The README's precision figures come from
# recorded runs of the default (docs/first_run.py); auto passes through the Snakefile are the two-device run's
# (tests/test_workflow_devices.py), their stopping rule tests/test_bench_llamacpp.py's.
FEW = {**DEFAULT, "bench": {**DEFAULT["bench"], "repetitions": 3}}


def test_default_pipeline_makes_the_32k_figure_from_real_runs(tmp_path):
    wd = workflow_copy(tmp_path, FEW)
    run = snakemake(wd, "results/figures/ncmoe_32k.png", timeout=3000)
    assert run.returncode == 0, run.stderr[-4000:]
    assert (wd / "results/figures/ncmoe_32k.png").stat().st_size > 20_000
    assert (wd / "results/figures/ncmoe_32k_pp.png").stat().st_size > 20_000
    budget = pd.read_csv(wd / "results/tables/budget/tiny-qwen3moe.csv").set_index("ctx")
    n_min = budget.loc[32768, "n_cpu_moe"]
    measured = pd.read_csv(wd / "results/tables/measured/32k.csv")
    ok = measured[measured.status == "ok"]
    for test, runs in ok.groupby("test"):  # the default run's precision (a benchmark figure, printed)
        print(f"32K {test}: median CV {100 * runs.cv.median():.1f}%, {int(runs.target_reached.sum())} of "
              f"{len(runs)} configurations reached the 5% target")  # fmt: skip
    tg = measured[(measured.test == "tg") & (measured.model == "tiny-qwen3moe")].set_index("n_cpu_moe")
    assert tg.index.tolist() == auto_sweep(n_min, 8) and tg.index[0] == n_min - 1
    assert (tg.loc[n_min:, "status"] == "ok").all()  # the budget's minimum really fits
    assert tg.loc[n_min - 1, "status"] == "oom"  # one layer fewer really does not: exact to the layer
    assert (tg.loc[tg.status == "ok", "avg_ts"] > 0).all()
    assert tg.device.str.contains("emulated device").all()
    # The sliding-window twin's KV cache barely grows with context: everything fits at 32K.
    swa = measured[(measured.test == "tg") & (measured.model == "tiny-gpt-oss")]
    assert swa.n_cpu_moe.min() == 0 and (swa.status == "ok").all()
    memory = pd.read_csv(wd / "results/tables/memory_check/32k.csv")
    exact = memory[memory.buffer != "compute"]  # weights and KV to llama.cpp's logged 0.01 MiB
    assert len(exact) and exact.diff_mib.abs().max() <= 0.02, memory.to_string()
    assert memory.within_tolerance.all(), memory.to_string()
    records = [json.loads(line) for line in (wd / "results/bench/tiny-qwen3moe/32k.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["n_cpu_moe"] == n_min and r["test"] == "tg"]
    for key in ("pipeline_commit", "llamacpp_version", "model_files", "host", "cpu", "device", "started"):
        assert record[key] not in (None, "")
    assert_publishes(wd, runs=len(measured), ctx=32768)


def moeplace_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moeplace.cli", *args], capture_output=True, text=True)


def assert_publishes(wd, runs: int, ctx: int) -> None:
    """What the README's first command made publishes as a directory that stands alone: its manifest verifies,
    llama.cpp's own compare-llama-bench.py tables its runs by placement and depth, a tampered file fails verify,
    and a second host's copy merges into one figure with two lines."""
    from moeplace.core.units import Context
    from moeplace.report.publish import (
        DICTIONARY,
        MANIFEST,
        load_dictionary,
        read_sqlite,
        table_name,
        write_manifest,
        write_sqlite,
    )

    run = snakemake(wd, "publish")
    assert run.returncode == 0, run.stderr[-3000:]
    folder = wd / "publish/moeplace-results"
    assert (wd / "publish/moeplace-results.tar.gz").stat().st_size > 20_000
    check = moeplace_cli("verify", str(folder))
    assert check.returncode == 0 and "files match MANIFEST.json" in check.stdout, check.stderr
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["pipeline"]["pipeline_commit"] and manifest["llamacpp"]["version"]
    assert set(manifest["models"]) >= {"tiny-qwen3moe", "tiny-gpt-oss"} and manifest["config"]["contexts"]
    dictionary = load_dictionary(DICTIONARY)
    tables = sorted((folder / "tables").rglob("*.csv"))
    assert {table_name(str(t.relative_to(folder))) for t in tables} >= {"measured", "compare", "budget", "memory_check"}
    data = (folder / "DATA.md").read_text()
    for t in tables:  # every column of every table is described (publish validated them too)
        name = table_name(str(t.relative_to(folder)))
        assert f"## {name}" in data and set(pd.read_csv(t).columns) <= set(dictionary[name]["columns"])
    index = (folder / "index.html").read_text()
    assert (folder / "report.html").stat().st_size > 100_000  # Snakemake's own report, of what was run
    # The figure, and what the first command did not make.
    assert f"figures/ncmoe_{Context(ctx).label}.png" in index and "Not run" in index
    rows = read_sqlite(folder / "llama-bench.sqlite")
    assert len(rows) == runs and {r["n_depth"] for r in rows} and all(r["build_commit"] for r in rows)
    script = Path(manifest["llamacpp"]["bin_dir"]).parent / "scripts/compare-llama-bench.py"
    build = rows[0]["build_commit"]
    show = ["-s", "n_cpu_moe,tensor_buft_overrides"]
    table = subprocess.run([sys.executable, str(script), "-i", "llama-bench.sqlite", "-b", build, "-c", build, *show],
                           cwd=folder, capture_output=True, text=True)  # fmt: skip
    assert table.returncode == 0, table.stderr
    ok = {(r["n_cpu_moe"], r["n_depth"]) for r in rows if r["status"] == "ok" and r["n_gen"]}
    assert all(f"@d{depth}" in table.stdout for _, depth in ok) and len(table.stdout.splitlines()) >= len(ok) + 2

    # A second host: the same directory relabelled, its manifest rewritten; they merge into two lines per figure.
    other = wd / "publish/other-host"
    shutil.copytree(folder, other)
    relabelled = [{**r, "host": "other-host", "provenance": "other-host"} for r in rows]
    (other / "llama-bench.sqlite").unlink()
    write_sqlite(relabelled, other / "llama-bench.sqlite")
    write_manifest(other, {**manifest, "name": "other-host"})
    merged = moeplace_cli("merge", str(folder), str(other), "-o", str(wd / "publish/merged"))
    assert merged.returncode == 0, merged.stderr
    both = pd.read_csv(wd / "publish/merged/tables/merged.csv")
    assert set(both.host) == {rows[0]["host"], "other-host"} and len(both) == 2 * runs
    assert (wd / f"publish/merged/figures/merged_tiny-qwen3moe_{ctx}.png").stat().st_size > 20_000
    again = moeplace_cli("merge", str(folder), str(folder), "-o", str(wd / "publish/twice"))  # the same runs twice
    assert again.returncode == 0 and len(pd.read_csv(wd / "publish/twice/tables/merged.csv")) == runs
    assert moeplace_cli("verify", str(wd / "publish/merged")).returncode == 0
    # The same model name for a different file is refused, in one line.
    (other / "llama-bench.sqlite").unlink()
    write_sqlite([{**r, "model_header_sha256": "f" * 64} for r in relabelled], other / "llama-bench.sqlite")
    write_manifest(other, {**manifest, "name": "other-host"})
    conflict = moeplace_cli("merge", str(folder), str(other), "-o", str(wd / "publish/conflict"))
    assert conflict.returncode == 2 and "is a different file than in" in conflict.stderr
    assert not (wd / "publish/conflict").exists()

    # A tampered table fails verify, naming it.
    target = next(p for p in (folder / "tables").rglob("*.csv") if table_name(str(p.relative_to(folder))) == "measured")
    target.write_text(target.read_text().replace("ok", "oom", 1))
    tampered = moeplace_cli("verify", str(folder))
    assert tampered.returncode == 2 and f"changed: {target.relative_to(folder)}" in tampered.stderr


def test_reruns_only_what_changed_and_never_for_a_commit(tmp_path):
    cfg = {
        **DEFAULT,
        "contexts": [1024],
        "bench": {"prompt": 32, "gen": 8, "repetitions": 1, "n_cpu_moe": [0, 8]},
        "ceilings": {"enabled": False},
    }
    wd = workflow_copy(tmp_path, cfg)
    subprocess.run(["git", "init", "-q"], cwd=wd, check=True)
    commit = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam"]
    subprocess.run(["git", "add", "-A"], cwd=wd, check=True)
    subprocess.run([*commit, "one"], cwd=wd, check=True)
    run = snakemake(wd, *TARGETS, "results/figures/ncmoe_1k.png")
    assert run.returncode == 0, run.stderr[-4000:]
    assert planned_jobs(wd) == {}  # a finished run reruns nothing
    (wd / "notes.txt").write_text("a new commit")
    subprocess.run(["git", "add", "-A"], cwd=wd, check=True)
    subprocess.run([*commit, "two"], cwd=wd, check=True)
    assert planned_jobs(wd) == {}  # the commit is recorded, not a rerun trigger
    cfg["device"]["bw_vram_gbps"] = 2 * cfg["device"]["bw_vram_gbps"]
    (wd / "config/config.yaml").write_text(yaml.safe_dump(cfg))
    plan = planned_jobs(wd)  # a bandwidth re-predicts; nothing is measured again, the budget stays
    assert plan["predict"] == 2 and plan["aggregate"] == 1  # (its out-of-sample fits use the priors)
    assert not {"bench", "placement", "tune", "ceilings", "budget", "metadata", "twin"} & set(plan), plan
    cfg["contexts"] = [1024, 2048]
    (wd / "config/config.yaml").write_text(yaml.safe_dump(cfg))
    plan = planned_jobs(wd)
    assert plan["bench"] == 2  # only the new context's sweeps (2 models, each both n values)
    assert snakemake(wd, *TARGETS).returncode == 0
    cfg["bench"]["repetitions"] = 2
    (wd / "config/config.yaml").write_text(yaml.safe_dump(cfg))
    assert planned_jobs(wd)["bench"] == 4  # repetitions changed: every sweep reruns (2 models x 2 contexts)
    # The speed model on the pipeline's own runs: calibrated per model, checked out of sample.
    speed = ["results/calibration/tiny-qwen3moe.json", "results/tables/fidelity.csv", "results/figures/fidelity.png"]
    run = snakemake(wd, *speed)
    assert run.returncode == 0, run.stderr[-4000:]
    calibration = json.loads((wd / speed[0]).read_text())
    assert {"tg", "pp"} <= set(calibration["tests"])
    assert calibration["tests"]["tg"]["source"]["layers"] == "fit" and calibration["tests"]["tg"]["runs"] == 4
    fidelity = pd.read_csv(wd / speed[1])
    two_point = fidelity[fidelity.fit == "two_point"]
    # The other depth: each context's runs fill it to ctx - prompt (992 and 2016 tokens).
    assert set(zip(two_point.fit_depth, two_point.depth)) == {(992, 2016), (2016, 992)}
    loo = fidelity[fidelity.fit == "loo"]
    assert len(loo) == 2 * 2 * 4 and loo.error_pct.notna().all()  # models x tests x (n, depth)
    prior = fidelity[fidelity.fit == "prior"]  # bandwidths alone: decode only, every point
    assert len(prior) == 2 * 4 and (prior.test == "tg").all() and prior.fit_depth.isna().all()
    report = subprocess.run(
        [SNAKEMAKE, "--cores", "1", "--report", "results/report.html", *TARGETS, "results/figures/ncmoe_1k.png"],
        cwd=wd,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert "ncmoe_1k.png" in (wd / "results/report.html").read_text(errors="replace")


def test_budget_check_grid_agrees_with_the_device(tmp_path):
    """The grid target on a subset (CI): every cell's predicted minimum n is the measured one; the depth-filled
    probe agrees with the load probe on its sample."""
    grid = {"contexts": [4096, 32768], "ubatch": [512, 2048], "cache_types": ["f16", "q8_0"],
            "flash_attn": ["on", "off"], "depth_checks": 1}  # fmt: skip
    wd = workflow_copy(tmp_path, {**DEFAULT, "budget_check": grid})
    run = snakemake(wd, "budget_check", timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:]
    table = pd.read_csv(wd / "results/tables/budget_check.csv")
    assert set(table.model) == {"tiny-qwen3moe", "tiny-gpt-oss", "tiny-deepseek2"} and len(table) == 3 * 16
    assert (table.status == "unsupported").sum() == 3 * 4  # a q8_0 V cache needs flash attention
    cells = table[table.status == "ok"].fillna(-1)
    assert (cells.predicted_n == cells.measured_n).all(), cells.to_string()
    sample = cells[cells.depth_n >= 0]
    assert len(sample) == 3 and (sample.depth_n == sample.measured_n).all()
    assert (wd / "results/figures/budget_check.png").stat().st_size > 20_000
