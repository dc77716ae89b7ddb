"""`moeplace explain LOG` on every real log of the corpus: per device its weights, KV and compute as the log's lines
say, what stayed on the host, and why it ran out of memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from corpus import ids, samples

LOGS = samples("log")
MiB = 2**20


def explain(tmp_path, text: str, *args: str) -> subprocess.CompletedProcess:
    log = tmp_path / "pasted.log"
    log.write_text(text)
    return subprocess.run([sys.executable, "-m", "moeplace.cli", "explain", str(log), *args], capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip


@pytest.mark.parametrize("sample", LOGS, ids=ids(LOGS))
def test_explain_gives_each_devices_totals_as_the_log_does(sample, tmp_path):
    out = explain(tmp_path, sample.text, "--json")
    expect = sample.expect
    status = expect.get("status", "ok")
    assert out.returncode == (1 if status == "oom" else 0), out.stderr
    found = json.loads(out.stdout)
    assert found["status"] == status
    for device, kinds in expect.get("devices", {}).items():
        assert found["devices"][device]["total"] == pytest.approx(sum(kinds.values()), abs=0.02), device
    if "devices" in expect:
        assert set(found["devices"]) == set(expect["devices"])
    if "host" in expect:
        assert found["host"]["total"] == pytest.approx(sum(sum(k.values()) for k in expect["host"].values()), abs=0.02)
    if status == "oom":
        assert found["oom"]["stage"] == expect["oom"]["stage"]
        assert found["fix"].startswith("moeplace recommend ")
    text = explain(tmp_path, sample.text)
    assert "Traceback" not in text.stderr and text.stdout.startswith("backend: ")


def test_explain_says_where_the_experts_went_and_why_it_ran_out(tmp_path):
    (cuda,) = [s for s in LOGS if s.path.stem == "cuda-single-ik-deepseek-r1-ot-exps-4090d"]
    out = explain(tmp_path, cuda.text).stdout
    assert "experts in host RAM: 6 tensors in 2 layers" in out  # the 6 expert lines the excerpt kept
    assert "CUDA0" in out and "host" in out and "CUDA_Host" in out
    (oom,) = [s for s in LOGS if s.path.stem == "rocm-kv-oom-qwen35-27b-rx9060xt"]
    why = explain(tmp_path, oom.text).stdout
    assert "ROCm0 ran out of memory while allocating the KV cache (2,048.00 MiB asked)" in why
    assert "Qwen3.5-27B-Q4_K_M.gguf" in why and "--backend rocm" in why


@pytest.mark.parametrize("pasted", ["hello world\n", "", "Traceback (most recent call last):\n  File x\n"])
def test_text_that_is_not_a_llamacpp_log_gets_one_line(pasted, tmp_path):
    out = explain(tmp_path, pasted)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "is not a llama.cpp log" in line


def test_explain_reads_llama_bench_tables_too(tmp_path):
    (table,) = [s for s in samples("bench-md") if s.path.stem == "bench-md-qwen3-30b-moe-rtx5070-cuda"]
    out = explain(tmp_path, table.text)
    assert out.returncode == 0 and out.stdout.startswith("llama-bench results: 2 records")
