"""The stages on what real cards printed: the budget's reserve, the bench stage with its memory check and the
measured table, and the placement check, each fed a corpus text (tests/data/llamacpp/) through the seam where
llama.cpp's output enters moeplace: a stand-in program that replays the text as the real one printed it. Nothing
of moeplace's own is stubbed; the expected values are those typed by hand in each corpus file's header."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus import CORPUS, load

from moeplace.core.config import BenchSettings
from moeplace.core.errors import MoeplaceError
from moeplace.measure.bench import BenchJob, Rig, parse_log, run_bench
from moeplace.measure.placement import check_placement
from moeplace.model.memory import Workload
from moeplace.plan.budget import reserved_compute
from moeplace.report.aggregate import measured_table, memory_check_table
from moeplace.runtime.allocation import load_probe, reserve
from moeplace.runtime.build import Build
from moeplace.runtime.device import DeviceSetup

MiB = 2**20
CUDA_ONE = "cuda-single-qwen3-235b-ot-cpu-mapped-3090"  # mainline b5269: CUDA_Host compute and output buffers
CUDA_TWO = "cuda-multi-mainline-qwen3-30b-ot-cpu-4090-5090"  # CUDA0 and CUDA1
CUDA_OLD = "cuda-single-ik-deepseek-r1-ot-exps-4090d"  # 2025 style: "Tensor ... buffer type overriden to CPU"
VULKAN = "vulkan-cpu-moe-docker-vulkan-host-overrides"  # --cpu-moe on Vulkan: experts to Vulkan_Host
RECORDS = "bench-jsonl-qwen25-7b-rtx4080-cuda"  # llama-bench -o jsonl on an RTX 4080


def replay(folder: Path, program: str, stdout: str = "", stderr: str = "", code: int = 0) -> Build:
    """A llama.cpp build whose `program` prints what a real one printed (whatever it is asked) and exits: the
    manifest the stages take."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{program}.out").write_text(stdout)
    (folder / f"{program}.err").write_text(stderr)
    script = folder / program
    script.write_text(f"#!/bin/sh\ncat '{folder / program}.out'\ncat '{folder / program}.err' >&2\nexit {code}\n")
    script.chmod(0o755)
    source = "a replay of published output"
    return Build(
        folder, source, version="replay", build_number=0, build_commit="replay", gpu_devices=("CUDA0: replay",)
    )


def text(name: str) -> str:
    return load(CORPUS / f"{name}.txt").text


def expect(name: str) -> dict:
    return load(CORPUS / f"{name}.txt").expect


def test_the_budget_reserves_a_cuda_cards_compute_and_leaves_its_pinned_host_buffers_on_the_host(tmp_path):
    """llama-fit-params' reserve logs the same buffer lines a load does; on CUDA the host's compute buffer is
    CUDA_Host, which moeplace once counted as device memory (and then never found a host compute buffer)."""
    manifest = replay(tmp_path / "bin", "llama-fit-params", stderr=text(CUDA_ONE))
    buffers = reserve(manifest, "model.gguf", Workload(16384).llama_args(), 0, None, tmp_path / "reserve.log")
    typed = expect(CUDA_ONE)
    assert buffers.only_device()["compute"] / MiB == pytest.approx(typed["devices"]["CUDA0"]["compute"], abs=0.005)
    assert buffers.host["compute"] / MiB == pytest.approx(
        typed["host"]["CPU"]["compute"] + typed["host"]["CUDA_Host"]["compute"], abs=0.01
    )
    compute = reserved_compute(manifest, "model.gguf", None, tmp_path / "reserve.log")
    assert compute(Workload(16384), 0) / MiB == pytest.approx(typed["devices"]["CUDA0"]["compute"], abs=0.005)


def test_a_load_probe_whose_log_lost_its_tail_is_run_again(tmp_path):
    """llama.cpp logs from a thread the process does not wait for at exit: a run on busy cores can end, exit code
    0, before its compute buffers are logged (on this VM, 1 in ~12 runs of llama-completion -v on a tiny model).
    The probe runs again rather than report a load without them."""
    log = text(CUDA_ONE)
    cut = log[: log.index("llama_context:      CUDA0 compute buffer size")]
    manifest = replay(tmp_path / "bin", "llama-completion", stderr=log)
    (tmp_path / "bin/cut.err").write_text(cut)
    script = tmp_path / "bin/llama-completion"  # the first run prints the cut log, the next ones the whole log
    runs = tmp_path / "runs"
    script.write_text(f"#!/bin/sh\necho run >> '{runs}'\n"
                      f"if [ $(wc -l < '{runs}') = 1 ]; then cat '{tmp_path}/bin/cut.err' >&2; "
                      f"else cat '{tmp_path}/bin/llama-completion.err' >&2; fi\n")  # fmt: skip
    status, buffers = load_probe(manifest, "model.gguf", Workload(16384).llama_args(), 0, None, tmp_path / "p.log")
    assert status == "ok" and runs.read_text().count("run") == 2
    assert buffers.only_device()["compute"] / MiB == pytest.approx(774.00)


def test_a_plan_for_one_device_refuses_a_two_gpu_reserve_in_one_line(tmp_path):
    manifest = replay(tmp_path / "bin", "llama-fit-params", stderr=text(CUDA_TWO))
    buffers = reserve(manifest, "model.gguf", Workload(16384).llama_args(), 0, None, tmp_path / "reserve.log")
    assert set(buffers.devices) == {"CUDA0", "CUDA1"}  # two device totals, never one
    with pytest.raises(MoeplaceError, match=r"^llama.cpp used 2 devices \(CUDA0, CUDA1\)"):
        buffers.only_device()


def _bench(tmp_path: Path, log: str, small_moe: Path) -> list[dict]:
    manifest = replay(tmp_path / "bin", "llama-bench", stdout=text(RECORDS), stderr=text(log))
    settings = BenchSettings(prompt=512, gen=128, repetitions=5, threads=2, timeout_s=60)
    rig = Rig(settings, DeviceSetup("gpu", "replayed card", 0), manifest, tmp_path / "bench.log", tmp_path)
    return run_bench(BenchJob("real", str(small_moe), [], 16384, 0), rig)


def test_the_bench_stage_records_a_gpu_runs_results_and_the_memory_check_reads_its_device(tmp_path, small_moe):
    from moeplace.model.metadata import inspect_model

    records = _bench(tmp_path, CUDA_ONE, small_moe)
    # What llama-bench printed, not read back through moeplace's reader: the averages as the corpus file's header
    # types them by hand, the samples copied from its two JSON lines (pp 512, then tg 128).
    pp, tg = expect(RECORDS)["records"]
    assert (pp["n_prompt"], tg["n_gen"]) == (512, 128)
    published = {
        "pp": {"avg_ts": pp["avg_ts"], "samples_ts": [7155.74, 7188.71, 7276.44, 7373.37, 7323.8]},
        "tg": {"avg_ts": tg["avg_ts"], "samples_ts": [120.038, 120.203, 118.624, 120.377, 119.982]},
    }
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert [r["test"] for r in records] == ["pp", "tg"]
    for r in records:
        assert r["avg_ts"] == pytest.approx(published[r["test"]]["avg_ts"])
        assert r["samples_ts"] == published[r["test"]]["samples_ts"]
    table = measured_table(records).set_index("test")
    assert table.loc["tg", "avg_ts"] == pytest.approx(119.844681)
    check = memory_check_table(records, {"real": inspect_model(small_moe)}).set_index("buffer")
    card = expect(CUDA_ONE)["devices"]["CUDA0"]
    assert check.llamacpp_mib.to_dict() == pytest.approx(card, abs=0.005)  # CUDA0's lines, not CUDA_Host's
    assert set(check.devices) == {1}


def test_the_memory_check_sums_two_gpus_weights_and_kv_and_leaves_their_compute_alone(tmp_path, small_moe):
    from moeplace.model.metadata import inspect_model

    records = _bench(tmp_path, CUDA_TWO, small_moe)
    check = memory_check_table(records, {"real": inspect_model(small_moe)}).set_index("buffer")
    cards = expect(CUDA_TWO)["devices"]
    assert set(check.index) == {"weights", "kv"} and set(check.devices) == {2}
    for kind in ("weights", "kv"):
        assert check.loc[kind, "llamacpp_mib"] == pytest.approx(sum(d[kind] for d in cards.values()), abs=0.01)


@pytest.mark.parametrize("name", [CUDA_OLD, VULKAN])
def test_the_placement_check_reads_where_real_cards_put_each_tensor(name):
    """The experts a person sees overridden to a host buffer (CPU on CUDA, Vulkan_Host on Vulkan) are the host
    set; the ones overridden to the card are not."""
    on_host = {
        CUDA_OLD: {f"blk.{il}.ffn_{kind}_exps.weight" for il in (10, 60) for kind in ("gate", "down", "up")},
        VULKAN: {f"blk.{il}.ffn_{kind}_exps.weight" for il in (18, 26, 38) for kind in ("gate", "down", "up")},
    }[name]
    buffers = parse_log(text(name))["tensor_buffers"]
    assert check_placement(on_host, buffers)["match"]
    assert not check_placement(on_host - {min(on_host)}, buffers)["match"]


def test_the_compute_estimate_may_be_over_but_hardly_under():
    """llama.cpp's allocator packs tighter than our no-reuse sum (over is safe, costs a layer at most); under
    risks an out-of-memory. Figures: the tiny qwen3moe twin at 32K, every expert on the host (llama-fit-params)."""
    from moeplace.report.aggregate import within_tolerance

    assert within_tolerance("compute", 42 * MiB, int(36.01 * MiB))  # 16.6% over
    assert not within_tolerance("compute", 44 * MiB, int(36.01 * MiB))  # 22% over
    assert not within_tolerance("compute", 34 * MiB, int(36.01 * MiB))  # 5.6% under
    assert within_tolerance("kv", 64 * MiB, 64 * MiB + 50_000) and not within_tolerance("kv", 64 * MiB, 65 * MiB)
