"""The speed prior learned from published sweeps: judged on setups it did not learn from (each left out in turn, and
the held-out sweeps of heldout.csv, never learned from), and used by predict/recommend before any run."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import moeplace
from conftest import ROOT
from published_sweeps import prior_points, published, twins

from moeplace.plan.learned_prior import (
    POOL,
    Machine,
    errors_against,
    held_out_errors,
    load,
    ratio_band,
    ratio_pairs,
    speed_model,
    top_picks,
)
from moeplace.plan.speed import Z95, Run, prefill_run, ratio_class


@pytest.fixture(scope="module")
def points(tmp_path_factory) -> dict:
    metas = twins(tmp_path_factory.mktemp("twins"))
    return {"sweeps": prior_points(published(), metas), "heldout": prior_points(published("heldout.csv"), metas)}


@pytest.fixture(scope="module")
def decode_left_out(points) -> list:
    """Each published decode point's error from terms learned without its source (the costly part: a fit each)."""
    return held_out_errors("tg", points["sweeps"])


def scored(pairs: list, learned, what: str) -> tuple[float, float, float]:
    """Median |error| (%), and the share inside each point's ~90% and ~95% intervals (its backend's), printed."""
    e = np.abs([e for _, e in pairs])
    pct = 100 * np.expm1(e)
    b90 = np.array([learned.log_q(p.machine.backend, "90") for p, _ in pairs])
    b95 = np.array([learned.log_q(p.machine.backend, "95") for p, _ in pairs])
    in90, in95 = float(np.mean(e <= b90)), float(np.mean(e <= b95))
    factor = math.exp(np.median(b90))
    print(f"{what}: {len(e)} points, median |error| {np.median(pct):.1f}%, p90 {np.percentile(pct, 90):.0f}%, inside "
          f"~90% {100 * in90:.1f}%, ~95% {100 * in95:.1f}%, median ~90% factor x{factor:.2f}")  # fmt: skip
    return float(np.median(pct)), in90, in95


def test_the_stored_prior_is_what_the_published_sweeps_give():
    check = subprocess.run(
        [sys.executable, "tools/speed_prior.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_decode_before_any_run_on_setups_it_did_not_learn_from(points, decode_left_out):
    """Decode: each published source (all of one author's setups) predicted by terms learned without it, and the
    held-out sweeps (other people's cards, sources in HELDOUT_SOURCES.md) by the stored terms. Each point's interval
    is its backend's left-out errors' quantiles; on the held-out sweeps it holds less often: a 192-thread run on a
    CPU quota of 82 and a regressed fork build are 2-6x slower than any learned setup, and a quantized KV cache at
    depth on ROCm many times slower than its bytes say (docs/speed-prior.md)."""
    prior = load()
    median, in90, in95 = scored(decode_left_out, prior["tg"], "decode, each source left out")
    # Issue 55's bar: 25%, met (22.0% with 70 setups from 25 machines, each machine's sources left out together;
    # docs/speed-prior.md).
    assert median <= 25 and 0.85 <= in90 <= 0.95 and 0.9 <= in95 <= 0.99
    held = errors_against(prior, [p for p in points["heldout"] if p.test == "tg"])
    median, in90, _ = scored(held, prior["tg"], "decode, held-out sweeps")
    # Issue 55's bar: median <= 20% and 80-97% inside the ~90% interval, met (19.8%, 81%; docs/speed-prior.md; 19.1%
    # before the per-backend pull, which was chosen on the left-out score).
    assert median <= 20 and 0.8 <= in90 <= 0.97
    # The bars on the interval's width are not met: its median half-width over the held-out points is +55% (bar +40%;
    # +76% with one pooled interval), and each source left out the ~90% factor is x1.71 (bar x1.5; per backend
    # x1.46-x1.86). These guards catch a regression beyond that.
    half = np.median([prior["tg"].log_q(p.machine.backend, "90") for p, _ in held])
    assert math.expm1(half) <= 0.6 and math.exp(np.quantile(np.abs([e for _, e in decode_left_out]), 0.9)) <= 1.75


def test_pulling_each_backend_toward_the_others_predicts_a_new_machine_better(points, decode_left_out):
    """Decode's card share per backend, pulled toward the backends' centre (POOL), predicts each source left out
    closer than each backend on its own (POOL was chosen on this score: the test guards the choice as data comes)."""
    pulled = np.median(np.abs([e for _, e in decode_left_out]))
    alone = np.median(np.abs([e for _, e in held_out_errors("tg", points["sweeps"], pool=0.0)]))
    assert POOL["tg"] > 0 and pulled < alone


def test_the_interval_is_per_backend_from_left_out_errors_only(decode_left_out):
    """Each backend's interval is the quantiles of its own left-out errors (never of the held-out sweeps), and a
    backend no source scored takes the pooled one: CUDA, learned from many machines, is narrower than SYCL, whose
    hybrid sweeps are one machine's."""
    prior = load()["tg"]
    for backend, q in prior.log_q_by_backend.items():
        e = np.abs([e for p, e in decode_left_out if p.machine.backend == backend])
        assert q["90"] == pytest.approx(np.quantile(e, 0.9), rel=1e-3)
        assert q["95"] == pytest.approx(np.quantile(e, 0.95), rel=1e-3)
    assert prior.log_q("cuda") < prior.log_q("sycl") and prior.log_q("metal") == prior.log_q95


def test_a_ratio_of_two_placements_of_one_machine_is_known_better_than_either_speed(points, decode_left_out):
    """Issue 64: a machine's own offset (host, threads, driver) is shared by its placements and cancels in their
    ratio. The stored ratio band is the quantiles of the left-out pairs' errors per class of predicted ratio (two
    points of one sweep of one machine at one depth, each predicted without its source), its median error is half the
    absolute one on the same points (11.0% against 22.0%), and on the held-out sweeps (never learned from) most
    pairs fall inside the shipped ~90% band of their class (docs/speed-prior.md)."""
    prior = load()
    pairs = [r for r in ratio_pairs(decode_left_out) if r.at_one_depth]
    for q, values in ratio_band(pairs).items():
        assert prior["tg"].log_q_ratio[q] == pytest.approx(values, rel=1e-3)
    ratio = np.median(np.abs([r.error for r in pairs]))
    assert ratio < 0.6 * np.median(np.abs([e for _, e in decode_left_out]))
    held = errors_against(prior, [p for p in points["heldout"] if p.test == "tg"])
    new = [r for r in ratio_pairs(held) if r.at_one_depth]
    bound = prior["tg"].log_q_ratio["90"]
    inside = np.mean([abs(r.error) <= bound[ratio_class(r.predicted)] for r in new])
    print(f"decode: {len(new)} held-out pairs, {100 * inside:.0f}% inside the ~90% ratio band")
    assert len(new) >= 100 and 0.7 <= inside


def test_the_placement_predicted_fastest_is_the_measured_fastest_in_most_published_sweeps(points, decode_left_out):
    """Issue 64's count: every published sweep of one machine with 3 placements or more the prediction tells apart,
    each source left out and the held-out sweeps (decode 21 of 29 and 6 of 10, prefill 19 of 26 and 13 of 18;
    the misses are mostly Arc B580 SYCL sweeps whose decode rises with host layers, and sweeps at a spill's edge)."""
    prior = load()
    counts = []
    for test, left_out in (("tg", decode_left_out), ("pp", held_out_errors("pp", points["sweeps"]))):
        held = errors_against(prior, [p for p in points["heldout"] if p.test == test])
        for picks in (top_picks(left_out), top_picks(held)):
            counts.append((sum(agree for _, agree, _ in picks), len(picks)))
    print("top pick is the measured fastest (decode left out, held out; prefill left out, held out):", counts)
    assert all(n >= 10 and agree > n / 2 for agree, n in counts)


def test_one_machines_sources_are_left_out_together(points):
    """A left-out score leaves out a machine, not a source_id: ikawrakow's Ryzen 9 7950X + RTX 4080 is three sources
    (two discussions and a PR), one group; and no held-out setup is learned from."""
    from published_sweeps import MACHINES

    ik = {p.source for p in points["sweeps"] if "rtx4080-" in p.setup and "4080s" not in p.setup}
    assert ik == {MACHINES["ik_llama-pr841"]}
    assert not {p.setup for p in points["heldout"]} & {p.setup for p in points["sweeps"]}


def test_prefill_before_any_run_is_given_with_its_interval(points):
    """Prefill from the learned terms: the card's compute per weight byte over its datasheet FP32 TFLOPS (per
    backend), the copy of host experts (over its PCIe link and through host RAM), depth. The held-out sweeps meet
    the bar (median <= 35%); the form of the copy term was chosen after reading the published copy rates of both
    sets (7-20 GB/s on PCIe 4.0 and 5.0 alike), its coefficients learned from sweeps.csv alone."""
    prior = load()
    left_out = held_out_errors("pp", points["sweeps"])
    _, _, in95 = scored(left_out, prior["pp"], "prefill, each source left out")
    assert 0.9 <= in95 <= 0.99
    held_out = errors_against(prior, [p for p in points["heldout"] if p.test == "pp"])
    median, inside_90, _ = scored(held_out, prior["pp"], "prefill, held-out sweeps")
    # Each source left out, a backend of one source is unknown when it is out: the interval learned that way is wide
    # enough that the held-out sweeps fall inside it more often than 90% (docs/speed-prior.md).
    assert median <= 35 and inside_90 >= 0.8


def test_predict_speaks_the_learned_prior_per_backend(tmp_path):
    """`moeplace predict` before any run: decode and prefill from the stored terms, for the backend named; the
    interval is the stored spread."""
    from moeplace.model.metadata import inspect_model
    from moeplace.model.twin import load_spec, write_twin

    path = write_twin(load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml"), tmp_path / "q.gguf", "none")
    meta = inspect_model(path)

    def predict(backend: str) -> dict:
        argv = ["predict", str(path), "--n-cpu-moe", "24", "--bw-vram", "672", "--bw-ddr", "60", "--card-tflops",
                "44.1", "--backend", backend, "--json"]  # fmt: skip
        out = moeplace(*argv)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)[0]

    cuda, vulkan = predict("cuda"), predict("vulkan")
    model = speed_model(meta, Machine("cuda", 672, 60, 31.5, 44.1))
    assert cuda["tg_tok_s"] == pytest.approx(model.predict(meta, Run(24, 0, "tg", 128))["tok_s"])
    assert cuda["pp_tok_s"] == pytest.approx(model.predict(meta, prefill_run(24, 0, 512))["tok_s"])
    assert cuda["tg_high"] / cuda["tg_tok_s"] == pytest.approx(math.exp(load()["tg"].log_q("cuda")), rel=1e-6)
    assert vulkan["tg_high"] / vulkan["tg_tok_s"] == pytest.approx(math.exp(load()["tg"].log_q("vulkan")), rel=1e-6)
    assert cuda["pp_tok_s"] > 0 and vulkan["tg_tok_s"] != pytest.approx(cuda["tg_tok_s"])
    assert math.log(cuda["tg_high"] / cuda["tg_tok_s"]) == pytest.approx(Z95 * model.tests["tg"].spread)


def test_a_layer_split_is_priced_by_the_same_decode_model(tmp_path):
    """-ngl G: all layers on the card (G > n_layer) is the --n-cpu-moe 0 placement; fewer on the card, slower."""
    from moeplace.model.metadata import inspect_model
    from moeplace.model.twin import load_spec, write_twin
    from moeplace.plan.layer_split import predict_ngl

    meta = inspect_model(write_twin(load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml"), tmp_path / "q.gguf"))
    model = speed_model(meta, Machine("rocm", 384, 57.6, 31.5, 13.2))
    n = meta.n_layer
    whole = predict_ngl(meta, model, n + 1)["tok_s"]
    assert whole == pytest.approx(model.predict(meta, Run(0, 0, "tg", 128))["tok_s"], rel=1e-3)
    speeds = [predict_ngl(meta, model, g)["tok_s"] for g in (0, n // 2, n, n + 1)]
    assert speeds == sorted(speeds) and speeds[0] < model.predict(meta, Run(n, 0, "tg", 128))["tok_s"]


def _published_directory(folder, gpu: str, speeds: dict[int, float]) -> None:
    """A moeplace publish/ directory as report.publish writes it: its SQLite runs and MANIFEST.json."""
    from moeplace.report.publish import MANIFEST, SQLITE, write_sqlite

    folder.mkdir()
    rows = [{"model": "qwen3-coder-30b-a3b", "gpu_info": gpu, "backends": "CUDA", "n_gpu_layers": 99, "n_cpu_moe": n,
             "n_depth": 0, "n_prompt": 0, "n_gen": 128, "n_ubatch": 512, "type_k": "f16", "type_v": "f16",
             "tensor_buft_overrides": "none", "avg_ts": ts} for n, ts in speeds.items()]  # fmt: skip
    write_sqlite(rows, folder / SQLITE)
    (folder / MANIFEST).write_text(json.dumps({"name": folder.name, "hosts": [f"{folder.name} (a CPU)"]}))


def test_a_prior_learned_from_published_directories_is_used_by_predict(tmp_path):
    """moeplace prior learn pools published directories with the shipped points; predict --prior uses the result.
    A directory that does not say its host RAM is refused in one line (a host term means nothing without it)."""
    from moeplace.cli import main

    _published_directory(tmp_path / "a", "NVIDIA GeForce RTX 4070 Ti SUPER", {0: 90.0, 24: 45.0, 48: 25.0})
    _published_directory(tmp_path / "b", "NVIDIA GeForce RTX 4080", {0: 100.0, 24: 50.0, 48: 28.0})
    spec = ROOT / "config/models/qwen3-coder-30b-a3b.yaml"
    out = tmp_path / "prior.json"
    argv = [
        "prior",
        "learn",
        str(tmp_path / "a"),
        str(tmp_path / "b"),
        "-o",
        str(out),
        "--model",
        f"qwen3-coder-30b-a3b={spec}",
    ]
    assert main(argv) == 2  # no host bandwidth
    assert main([*argv, "--bw-ddr", "64"]) == 0
    learned = json.loads(out.read_text())
    shipped = json.loads((ROOT / "src/moeplace/plan/learned_prior.json").read_text())
    assert learned["about"]["setups"]["tg"] == shipped["about"]["setups"]["tg"] + 2
    assert learned["about"]["sources"]["tg"] == shipped["about"]["sources"]["tg"] + 2
    from moeplace.model.twin import load_spec, write_twin

    gguf = write_twin(load_spec(spec), tmp_path / "q.gguf")
    speeds = {}
    for prior in (None, str(out)):
        argv = ["predict", str(gguf), "--n-cpu-moe", "24", "--bw-vram", "672", "--bw-ddr", "64", "--card-tflops", "44",
                "--json", *(["--prior", prior] if prior else [])]  # fmt: skip
        run = moeplace(*argv)
        assert run.returncode == 0, run.stderr
        speeds[prior] = json.loads(run.stdout)[0]["tg_tok_s"]
    model = speed_model(inspect_gguf(gguf), Machine("cuda", 672, 64, 31.5, 44), load(out))
    assert speeds[str(out)] == pytest.approx(model.predict(inspect_gguf(gguf), Run(24, 0, "tg", 128))["tok_s"])
    assert speeds[str(out)] != pytest.approx(speeds[None])


def inspect_gguf(path):
    from moeplace.model.metadata import inspect_model

    return inspect_model(path)


def test_a_measured_host_figure_is_not_discounted_as_a_datasheet_one():
    """The learned host share turns a datasheet figure into what llama.cpp reads; a measured figure already is
    that, so the same number given as measured predicts a faster host than given as a datasheet's. Issue 55's bar (a
    measured figure never predicts decode worse than the datasheet's) is not met: no worse on 4 of 7 setups, all one
    machine's (beyondvram, threads 4-12 the prior does not see); no learned setup gives a measured figure to learn a
    conversion from (docs/speed-prior.md), so nothing here asserts it."""
    prior = load()
    assert prior["tg"].coef["host"] > 1 and prior["tg"].coef["host_measured"] == pytest.approx(1.0)
    x = {"layers": 48, "device_gb": 1.0, "host_gb": 1.0, "hops": 48.0, "kv_gb": 0.0}
    datasheet = prior["tg"].seconds("tg", x, Machine("cuda", 672, 60, 31.5, 44))
    measured = prior["tg"].seconds("tg", x, Machine("cuda", 672, 60, 31.5, 44, host_measured=True))
    assert measured < datasheet
