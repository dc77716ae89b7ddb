"""A request llama.cpp refuses (a quantized V cache without flash attention) is a recorded "unsupported" row in
every stage that would run it, on one device or several, never a crash: llama.cpp is not started for it. The
one test they all ask is runtime/llamacpp_args.refusal. No llama.cpp build needed: stand-ins where it would run."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import pytest
from conftest import ROOT

from moeplace.core.config import BenchSettings, Device, DeviceTarget, TuneSettings
from moeplace.core.errors import MoeplaceError
from moeplace.model.memory import Workload
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.runtime.build import Build
from moeplace.runtime.device import DeviceSetup
from moeplace.runtime.llamacpp_args import UNSUPPORTED, refusal

CAPS = [40 * 10**6, 30 * 10**6]
# A llama-bench that must not run: it leaves a mark and fails.
NEVER = f"""#!{sys.executable}
import pathlib, sys
pathlib.Path(__file__).with_name("ran").write_text(" ".join(sys.argv))
sys.exit(1)
"""


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """The tiny qwen3moe twin's header (no weights: nothing here loads it) and its metadata."""
    path = write_twin(load_spec(ROOT / "config/models/tiny-qwen3moe.yaml"), tmp_path_factory.mktemp("t") / "t.gguf",
                      "none")  # fmt: skip
    return path, inspect_model(path)


@pytest.fixture
def never_bench(tmp_path):
    program = tmp_path / "bin/llama-bench"
    program.parent.mkdir(parents=True)
    program.write_text(NEVER)
    program.chmod(0o755)
    return program


@pytest.mark.parametrize(
    "flash_attn,type_v,refused",
    [
        ("off", "q8_0", True),
        ("off", "q4_0", True),
        ("off", "f16", False),
        ("off", "bf16", False),
        ("on", "q8_0", False),
        ("auto", "q8_0", False),
    ],  # fmt: skip
)
def test_llamacpp_refuses_only_a_quantized_v_cache_without_flash_attention(flash_attn, type_v, refused):
    reason = refusal(flash_attn, type_v)
    assert bool(reason) == refused
    if refused:
        assert type_v in reason and "flash attention" in reason


def test_the_budget_check_over_two_devices_records_a_refused_cell_and_checks_the_others(twin, monkeypatch, tmp_path):
    """On two devices, a grid cell llama.cpp refuses (a q8_0 V cache without flash attention, on which the
    llama-fit-params reserve aborts; it once stopped the DAG) is a row "unsupported" with no llama.cpp run, and the
    other cells are planned, reserved and loaded as before; the stage's table, summary and figure take it."""
    from moeplace.measure import budget_check
    from moeplace.plan.devices import plan_devices
    from moeplace.report.figures.budget_check import devices_figure

    path, meta = twin
    reserved, loads = [], []

    @contextmanager
    def rpc_device(manifest, cap, cpus, log_path):
        yield f"127.0.0.1:{5000 + len(cpus)}"

    def reserved_plan(meta, w, devices, at):
        if refusal(w.flash_attn, w.type_v):  # what the pinned llama-fit-params does with it: it aborts
            raise MoeplaceError("llama-fit-params failed: quantized V cache requires flash_attn")
        reserved.append(w)
        return plan_devices(meta, devices, w)

    def load_probe(manifest, model, args, n_cpu_moe, rpc, log_path):
        assert "-fa" in args and args[args.index("-fa") + 1] != "off" or args[args.index("-ctv") + 1] == "f16"
        loads.append(args)
        return "ok", None

    # budget_check imports them by name: the stand-ins go where it looks them up
    monkeypatch.setattr(budget_check, "rpc_device", rpc_device)
    monkeypatch.setattr(budget_check, "reserved_plan", reserved_plan)
    monkeypatch.setattr(budget_check, "load_probe", load_probe)
    workloads = budget_check.grid([4096], [256], ["f16", "q8_0"], ["on", "off"])
    model = budget_check.CheckedModel("tiny-qwen3moe", str(path), meta, {}, tmp_path / "check.log")
    rows = budget_check.check_devices(model, workloads, CAPS)
    assert [(r["type_k"], r["flash_attn"], r["status"]) for r in rows] == [
        ("f16", "on", "ok"), ("f16", "off", "ok"), ("q8_0", "on", "ok"), ("q8_0", "off", UNSUPPORTED)]  # fmt: skip
    assert len(reserved) == 3 and len(loads) >= 3  # every other cell planned and loaded
    (refused,) = [r for r in rows if r["status"] == UNSUPPORTED]
    assert refused["caps_mib"] == "38.15/28.61" and "exact" not in refused

    table = budget_check.devices_table(rows, "tiny-qwen3moe")
    assert table.exact.isna().tolist() == [False, False, False, True]
    assert budget_check.devices_summary(table).endswith(f"of 3 cells; 1 {UNSUPPORTED} (not run)")
    table.to_csv(tmp_path / "t.csv", index=False)  # the figure stage reads the per-model tables back
    import pandas as pd

    again = budget_check.devices_table(pd.read_csv(tmp_path / "t.csv").to_dict("records"))
    assert budget_check.devices_summary(again) == budget_check.devices_summary(table)
    devices_figure(again, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_a_sweep_llamacpp_refuses_is_recorded_unsupported_without_running_it(never_bench, tmp_path):
    from moeplace.measure.bench import BenchJob, Rig, run_sweep

    settings = BenchSettings(prompt=16, gen=4, repetitions=3, threads=1, timeout_s=60, type_k="q8_0", type_v="q8_0",
                             flash_attn="off")  # fmt: skip
    rig = Rig(settings, DeviceSetup("gpu", "fake", 0), Build(never_bench.parent), tmp_path / "bench.log",
              tmp_path)  # fmt: skip
    records = run_sweep(BenchJob("fake", "fake.gguf", [], 1024, 1), [2, 1], rig)
    assert [(r["n_cpu_moe"], r["test"], r["status"]) for r in records] == [
        (1, "pp", UNSUPPORTED), (1, "tg", UNSUPPORTED), (2, "pp", UNSUPPORTED), (2, "tg", UNSUPPORTED)]  # fmt: skip
    assert all("without flash attention" in r["error"] and r["flash_attn"] == "off" for r in records)
    assert not (never_bench.parent / "ran").exists()


def test_the_fit_params_variant_llamacpp_refuses_is_recorded_without_llama_fit_params(twin, never_bench, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    """The fit_params variant asks llama-fit-params first, and a placement it does not find raises: for a refused
    cache it is not asked, and the variant's records say unsupported."""
    import moeplace.runtime.allocation as allocation
    from moeplace.measure.bench import BenchJob, Rig
    from moeplace.measure.placement import run_variant

    def fitted_placement(*args, **kwargs):
        raise AssertionError("llama-fit-params started for a cache llama.cpp refuses")

    monkeypatch.setattr(allocation, "fitted_placement", fitted_placement)
    path, meta = twin
    settings = BenchSettings(prompt=16, gen=4, repetitions=3, threads=1, timeout_s=60, type_k="q8_0", type_v="q8_0",
                             flash_attn="off")  # fmt: skip
    rig = Rig(settings, DeviceSetup("gpu", "fake", 0), Build(never_bench.parent), tmp_path / "v.log",
              tmp_path)  # fmt: skip
    for variant in ("fit_params", "first_n"):
        records = run_variant(variant, meta, 2, {}, BenchJob("m", str(path), [], 4096, 2), rig)
        assert {r["status"] for r in records} == {UNSUPPORTED}, variant
    assert not (never_bench.parent / "ran").exists()


def test_the_tune_rule_records_a_kv_type_llamacpp_refuses_without_a_probe(twin, monkeypatch, tmp_path):
    """tune.cache_types [f16, q8_0] with flash_attn: off gives a q8_0 cell llama.cpp refuses: its record says
    unsupported (not does_not_fit after a probe at every n), and the matrix figure says so in its cell."""
    from moeplace.measure import tune as tune_module
    from moeplace.measure.tune import Probing, matrix_table, tune_model

    def tune(*args, **kwargs):
        raise AssertionError("probed a workload llama.cpp refuses")

    monkeypatch.setattr(tune_module, "tune", tune)
    path, meta = twin
    probing = Probing(TuneSettings(0, 60, 1), {}, tmp_path / "tune.log", tmp_path)
    result, record = tune_model(model_name="m", model_path=str(path), meta=meta,
                                workload=Workload(4096, 256, "off", "q8_0", "q8_0"),
                                target=DeviceTarget("emulated", "", CAPS[0]), memory=Device(CAPS[0], 0),
                                probing=probing)  # fmt: skip
    assert result.loads == 0 and result.chosen_n is None
    assert record["status"] == UNSUPPORTED and record["cache_type"] == "q8_0" and record["probes"] == ""

    import pandas as pd
    from matplotlib.figure import Figure

    from moeplace.report.figures.matrix import matrix_figure

    ok = {**record, "cache_type": "f16", "status": "ok", "chosen_n": 2, "chosen_tg_tok_s": 30.0, "predicted_n": 2}
    figures: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *args, **kwargs: figures.append(self))
    matrix_figure(matrix_table(pd.DataFrame([ok, record])), tmp_path / "m.png")
    cells = [t.get_text() for ax in figures[0].axes for t in ax.texts]
    assert cells.count(UNSUPPORTED) == 2 and "does not fit" not in cells
