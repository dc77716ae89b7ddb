"""Real llama-bench runs on the pinned build: KV accounting, out-of-memory, timeouts, cleanup."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT
from llamacpp_helpers import manifest, rpc_servers, tiny_twin

from moeplace.core.config import BenchSettings
from moeplace.measure.bench import BenchJob, Rig, run_bench
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec
from moeplace.report.aggregate import memory_check_table
from moeplace.runtime.device import DeviceSetup

pytestmark = pytest.mark.llamacpp
SPECS = {
    "qwen3moe": ROOT / "config/models/tiny-qwen3moe.yaml",
    "gpt-oss": ROOT / "tests/specs/tiny-gpt-oss.yaml",
    "deepseek2": ROOT / "config/models/tiny-deepseek2.yaml",
}
QUICK = BenchSettings(prompt=16, gen=4, repetitions=1, threads=2, timeout_s=300)


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("twins")
    return {arch: tiny_twin(folder, spec) for arch, spec in SPECS.items()}


def bench(
    path: Path, tmp_path: Path, ctx: int, cap: int, n: int = 0, settings: BenchSettings = QUICK, **extra
) -> list[dict]:
    meta = inspect_model(path)
    job = BenchJob(path.stem, str(path), meta.files, ctx, n, **extra)
    return run_bench(job, Rig(settings, DeviceSetup("emulated", "test device", cap), manifest(), tmp_path / "bench.log",
                              ROOT))  # fmt: skip


@pytest.mark.untimed
@pytest.mark.parametrize("arch", SPECS)
def test_kv_model_matches_llamacpp_accounting(arch, twins, tmp_path):
    records = bench(twins[arch], tmp_path, ctx=8192, cap=2 * 2**30)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["avg_ts"] > 0 for r in records)
    check = memory_check_table(records, {twins[arch].stem: inspect_model(twins[arch])}).set_index("buffer")
    # The depth fills the context: the pp test holds exactly the 8192 cells the budget plans.
    assert set(check.n_ctx) == {8192}
    # Weights and KV to the 0.01 MiB llama.cpp logs (plus tensor alignment); compute, our estimate, -5% to +20%.
    assert check.loc[["weights", "kv"], "diff_mib"].abs().max() <= 0.02, check.to_string()
    assert check.within_tolerance.all(), check.to_string()


@pytest.mark.fault(
    fault="the card runs out of memory",
    injected="a device capped below the model (devcap)",
    sees="status oom in the record and the tables, the OOM shaded in the figure",
    kept="every other configuration of the sweep; no RPC server left running",
)
@pytest.mark.untimed
def test_too_small_a_device_is_a_recorded_oom_and_the_server_is_stopped(twins, tmp_path):
    before = rpc_servers()
    records = bench(twins["qwen3moe"], tmp_path, ctx=4096, cap=8 * 2**20)
    assert [r["status"] for r in records] == ["oom", "oom"]
    assert "out of device memory" in (tmp_path / "bench.log").read_text()
    assert all(r["error"] and r["avg_ts"] is None for r in records)
    assert rpc_servers() == before


@pytest.mark.untimed
def test_experts_on_the_host_make_a_small_device_fit(twins, tmp_path):
    # 8 MiB holds the non-expert weights, the KV cache and compute buffers at 4K, not the experts.
    records = bench(twins["qwen3moe"], tmp_path, ctx=4096, cap=60 * 2**20, n=8)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert len(records[0]["cpu_tensors"]) == 3 * 8  # gate, up, down of every layer overridden to the host


@pytest.mark.fault(
    fault="llama-bench hangs",
    injected="a per-run timeout far below the run",
    sees="status timeout; its process group is killed",
    kept="the sweep goes on; no llama-bench left running",
)
def test_a_hanging_run_becomes_a_timeout_row(twins, tmp_path):
    before = rpc_servers()
    slow = BenchSettings(prompt=512, gen=128, repetitions=5, threads=2, timeout_s=3)
    records = bench(twins["qwen3moe"], tmp_path, ctx=32768, cap=2**30, settings=slow)
    assert [r["status"] for r in records] == ["timeout", "timeout"]
    assert rpc_servers() == before
    assert subprocess.run(["pgrep", "-f", f"llama-bench.*{twins['qwen3moe']}"], capture_output=True).returncode == 1


def run_and_kill(twins, tmp_path, pattern: str, sig: int) -> list[dict]:
    """Start a long run, send `sig` to the first process matching `pattern` once it runs, return the records."""
    import signal as _signal  # noqa: F401 - the caller passes signal numbers
    import threading
    import time

    result: list[list[dict]] = []
    slow = BenchSettings(prompt=512, gen=128, repetitions=5, threads=2, timeout_s=300)
    worker = threading.Thread(
        target=lambda: result.append(bench(twins["qwen3moe"], tmp_path, ctx=32768, cap=2**30, settings=slow))
    )
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
        if pids:
            time.sleep(3)  # let it load and start measuring
            subprocess.run(["kill", f"-{sig}", pids[0]])
            break
        time.sleep(0.2)
    worker.join(timeout=120)
    assert result, "run_bench did not return after the kill"
    return result[0]


@pytest.mark.fault(
    fault="llama-bench crashes",
    injected="SIGSEGV sent to llama-bench mid-run",
    sees="status crash, killed by SIGSEGV, with the stderr tail",
    kept="the sweep goes on; the device server is stopped",
)
def test_a_crash_is_recorded_with_its_signal(twins, tmp_path):
    import signal

    before = rpc_servers()
    records = run_and_kill(twins, tmp_path, f"llama-bench.*{twins['qwen3moe']}", signal.SIGSEGV)
    assert [r["status"] for r in records] == ["crash", "crash"]
    assert "SIGSEGV" in records[0]["error"]
    assert rpc_servers() == before


@pytest.mark.fault(
    fault="the device goes away mid-run",
    injected="SIGKILL sent to the RPC device server",
    sees="status crash (the RPC device went away)",
    kept="the sweep goes on",
)
def test_the_device_dying_mid_run_is_recorded(twins, tmp_path):
    import signal

    before = rpc_servers()
    records = run_and_kill(twins, tmp_path, "ggml-rpc-server -H 127.0.0.1", signal.SIGKILL)
    assert {r["status"] for r in records} == {"crash"}
    assert rpc_servers() == before


@pytest.mark.untimed
@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_a_blocks_twin_has_the_recipes_bytes_and_runs(arch, tmp_path):
    """weights: blocks (no F16 step): the header of the recipe's twin, with data llama.cpp decodes."""
    import json
    import math

    from moeplace.model.gguf_file import read_header
    from moeplace.model.twin import write_twin

    spec = load_spec(ROOT / f"config/models/tiny-{arch}.yaml")
    blocks, sparse = write_twin(spec, tmp_path / "b.gguf", "blocks"), write_twin(spec, tmp_path / "n.gguf", "none")
    assert [(t.name, t.type_name, t.n_bytes) for t in read_header(blocks).tensors] == [
        (t.name, t.type_name, t.n_bytes) for t in read_header(sparse).tensors
    ]
    assert blocks.stat().st_size == sparse.stat().st_size and blocks.stat().st_blocks > sparse.stat().st_blocks
    cmd = [str(manifest().bin_dir / "llama-bench"), "-m", str(blocks), "-p", "16", "-n", "4", "-r", "1"]
    out = subprocess.run([*cmd, "-t", "1", "-o", "jsonl"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(math.isfinite(r["avg_ts"]) and r["avg_ts"] > 0 for r in rows)
    assert "Q4_K - Medium" in rows[0]["model_type"]


def test_auto_repetitions_stop_at_the_precision_target_or_the_most_allowed(twins, tmp_path):
    """Adaptive repetitions: an easy target is met as soon as the median has a 95% interval (6 counted repetitions:
    one pass of 7, the first prompt run a warm-up, so decode has 7), an impossible one stops at the
    maximum; either way in one llama-bench process that fills the depth once; every record keeps its samples,
    count and interval; the device and llama-bench get disjoint CPUs."""
    import os
    import re

    auto = BenchSettings(prompt=16, gen=4, repetitions=3, threads=2, timeout_s=300, max_repetitions=6)
    easy = bench(twins["qwen3moe"], tmp_path / "easy", ctx=1024, cap=2**30, settings=replace(auto, precision=0.9))
    counted = {"pp": 6, "tg": 7}
    assert all(r["repetitions"] == counted[r["test"]] and r["target_reached"] and r["batches"] == 1 for r in easy)
    assert all(len(r["warmup_ts"]) == (1 if r["test"] == "pp" else 0) for r in easy), easy
    for r in easy:  # the order statistics' 95% interval: the range, of 6 and of 7 alike
        ordered = sorted(r["samples_ts"])
        assert (r["ci95_low_ts"], r["ci95_high_ts"]) == (ordered[0], ordered[-1]), r
    hard = bench(twins["qwen3moe"], tmp_path / "hard", ctx=1024, cap=2**30, settings=replace(auto, precision=1e-6))
    for r in hard:
        assert r["status"] == "ok" and r["repetitions"] == len(r["samples_ts"]) == counted[r["test"]]
        assert r["target_reached"] is False and r["batches"] == 1 and r["ci95_halfwidth_pct"] > 1e-4
    # One copy of each test, two contexts; llama.cpp's own count of the prompt tokens each context
    # processed shows the 1008-token depth filled in the first only, then restored.
    prompt_tokens = re.findall(r"prompt eval time = .* / +(\d+) tokens", (tmp_path / "hard/bench.log").read_text())
    assert len(prompt_tokens) == 2 and [int(n) >= 1008 for n in prompt_tokens] == [True, False]
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(hard[0]["bench_cpus"]) & set(hard[0]["device_cpus"])
        assert hard[0]["threads"] == len(hard[0]["bench_cpus"])


def test_a_paired_comparison_gets_the_minimum_in_one_batch_per_arm_whatever_its_budget(twins, tmp_path):
    """A variant and its -ncmoe baseline: each arm's first batch is the minimum, even when one batch already
    spends the time budget (a 32K depth fill is paid once per batch, not once per repetition)."""
    auto = BenchSettings(prompt=16, gen=4, repetitions=3, threads=2, timeout_s=300, max_repetitions=6,
                         time_budget_s=1e-3)  # fmt: skip
    overrides = r"blk\.[0-1]\.ffn_(up|down|gate)_exps=CPU"
    records = bench(twins["qwen3moe"], tmp_path, ctx=1024, cap=2**30, settings=auto, variant="first_n_ot",
                    overrides=overrides, paired_n_cpu_moe=2)  # fmt: skip
    for r in records:
        assert r["status"] == "ok" and r["batches"] == 1
        # 3 counted: decode's 4 repetitions, prefill's after its warm-up
        assert len(r["samples_ts"]) == len(r["baseline_samples_ts"]) == 3 + (r["test"] == "tg")
