"""-ot generation: shortest correct patterns, -ncmoe equivalence, variants at equal bytes, checked for real."""

from __future__ import annotations

import math
import re

import pytest
from conftest import ROOT

from moeplace.measure.bench import BenchJob, Rig
from moeplace.measure.placement import run_variant
from moeplace.model.meta import Layer, ModelMeta
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.offload import (
    expert_tensors,
    host_layers,
    int_range_regex,
    matching_tensors,
    ot_value,
    tensor_bytes,
    variants,
)

NCMOE = r"blk\.{}\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp's own -ncmoe pattern (common.h)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = write_twin(
        load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml"), tmp_path_factory.mktemp("q") / "q.gguf"
    )
    return inspect_model(path)


def ask(objective: str = "decode"):
    """A request for 32K as llama-bench runs it (its logits for a whole batch), ranked by `objective`."""
    from moeplace.plan.request import Request

    return Request((32768,), "model.gguf", vram=("16GB",), emit="bench", objective=objective, placement="optimal")


def choices(kv_types: list[tuple[str, str]], ubatches: list[int]):
    from moeplace.plan.optimal import Setting

    return [Setting(k, v, u) for k, v in kv_types for u in ubatches]


def certain(model):
    """The model as if exact (no spread): a test of the ranking's algebra, where every gain decides."""
    from dataclasses import replace

    from moeplace.plan.speed import SpeedModel

    return SpeedModel({t: replace(m, spread=0.0, ratio_bound=None) for t, m in model.tests.items()})


def matched(value: str, names: list[str]) -> set[str]:
    patterns = [p.rsplit("=", 1)[0] for p in value.split(";") if p]
    return {n for n in names if any(re.search(p, n) for p in patterns)}  # llama.cpp uses regex_search


@pytest.mark.parametrize("lo,hi", [(0, 17), (19, 47), (0, 9), (10, 29), (7, 123), (0, 100), (5, 5)])
def test_layer_ranges_match_exactly(lo, hi):
    pattern = int_range_regex(lo, hi)
    assert [i for i in range(1000) if re.fullmatch(pattern, str(i))] == list(range(lo, hi + 1))


def test_first_n_as_ot_places_exactly_what_ncmoe_places(qwen3):
    names = [n for layer in qwen3.layers for n in layer.expert_tensors] + ["blk.1.ffn_gate_inp.weight"]
    for n in (1, 12, 18, 27, 48):
        value = ot_value(expert_tensors(qwen3, list(range(n))))
        ncmoe = {name for name in names if any(re.search(NCMOE.format(i), name) for i in range(n))}
        assert matched(value, names) == ncmoe
    assert ot_value(expert_tensors(qwen3, list(range(18)))) == r"blk\.([0-9]|1[0-7])\.ffn_(up|down|gate)_exps=CPU"
    assert ot_value(set()) == ""


def test_variants_hold_about_the_same_host_bytes(qwen3):
    target = tensor_bytes(qwen3, expert_tensors(qwen3, list(range(18))))
    for name, tensors in variants(qwen3, 18).items():
        assert tensor_bytes(qwen3, tensors) == pytest.approx(target, rel=0.05), name
    up_down = variants(qwen3, 18)["up_down"]
    assert all("gate" not in t for t in up_down)
    value = ot_value(up_down)
    assert matched(value, [n for layer in qwen3.layers for n in layer.expert_tensors]) == up_down


def test_delta_interval_is_welch():
    from moeplace.core.stats import delta_interval

    delta, low, high = delta_interval([10.0, 11.0, 12.0], [8.0, 9.0, 10.0])
    assert delta == 2.0
    assert (low, high) == pytest.approx((2 - 2.776 * (2 / 3) ** 0.5, 2 + 2.776 * (2 / 3) ** 0.5), abs=1e-3)


@pytest.mark.llamacpp
def test_every_variant_is_placed_as_intended_by_llamacpp(tmp_path):
    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.core.config import BenchSettings
    from moeplace.measure.placement import VARIANTS
    from moeplace.runtime.device import DeviceSetup

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    for variant in VARIANTS:
        job = BenchJob("m", str(path), meta.files, 1024, 0)
        rig = Rig(BenchSettings(32, 8, 1, 2, 300), DeviceSetup("emulated", "test", 2**30), manifest(),
                  tmp_path / f"{variant}.log", ROOT)  # fmt: skip
        records = run_variant(variant, meta, 4, {"budget_bytes": 15 * 10**6}, job, rig)
        assert records[0]["status"] == "ok", records[0]["error"]
        # every variant but -ncmoe itself is measured interleaved with -ncmoe 4: both sets of samples kept
        assert bool(records[0].get("baseline_samples_ts")) == (variant != "first_n")
        assert records[0]["placement_match"], (
            variant,
            records[0]["placement_missing"],
            records[0]["placement_unexpected"],
        )


def uniform_meta(n_layer: int = 8, size: int = 100) -> ModelMeta:
    """A model of n_layer alike layers, each with three expert tensors of `size` bytes."""
    layers = [
        Layer(il, 3 * size, expert_tensors={f"blk.{il}.ffn_{k}_exps.weight": size for k in ("gate", "up", "down")})
        for il in range(n_layer)
    ]
    return ModelMeta(
        name="uniform",
        architecture="qwen3moe",
        n_layer=n_layer,
        n_expert=8,
        n_expert_used=2,
        n_expert_shared=0,
        n_ctx_train=0,
        expert_bytes=3 * size * n_layer,
        non_expert_bytes=50,
        total_bytes=50 + 3 * size * n_layer,
        global_bytes={},
        quant_types={},
        layers=layers,
        files=[],
        attention=None,
    )


def test_optimal_placement_reduces_to_a_clean_n_when_layers_are_alike():
    from moeplace.plan.offload import optimal_placement

    meta = uniform_meta(size=2**20)  # 1 MiB tensors: the knapsack's unit
    host = optimal_placement(meta, 5 * 3 * 2**20)  # room for exactly 5 layers
    assert host == expert_tensors(meta, [0, 1, 2])  # = --n-cpu-moe 3
    host = optimal_placement(meta, 5 * 3 * 2**20 + 2**20)  # and one tensor more: a partial layer 2
    assert expert_tensors(meta, [0, 1]) < host < expert_tensors(meta, [0, 1, 2])
    assert len(host) == 8


def test_optimal_placement_beats_ncmoe_on_the_real_recipe(qwen3):
    from moeplace.core.config import Bandwidths, Device
    from moeplace.model.memory import Workload
    from moeplace.plan.budget import plan
    from moeplace.plan.offload import optimal_placement
    from moeplace.plan.optimal import OnDevice, rank_placements
    from moeplace.plan.speed import prior

    device = Device(16 * 10**9, 10**9)
    p = plan(qwen3, device, Workload(32768))
    host = optimal_placement(qwen3, p["budget_bytes"])
    assert tensor_bytes(qwen3, expert_tensors(qwen3, list(range(p["n_cpu_moe"])))) >= tensor_bytes(qwen3, host)
    assert qwen3.expert_bytes - tensor_bytes(qwen3, host) <= p["budget_bytes"]  # it fits
    model = certain(prior(Bandwidths(640, 57.6)))
    ranked = rank_placements(
        OnDevice(qwen3, device, "rpc"), ask("decode"), 32768, model, choices=choices([("f16", "f16")], [512])
    )
    # whole layers on the host (-ngl) read their attention from RAM too: slower than either expert placement
    assert [r["placement"] for r in ranked] == ["optimal", "ncmoe", "ngl"] and ranked[0]["score"] > ranked[1]["score"]
    # a quantized KV cache leaves room for more experts on the card: faster still, and ranked first
    ranked = rank_placements(
        OnDevice(qwen3, device, "rpc"),
        ask("decode"),
        32768,
        model,
        choices=choices([("f16", "f16"), ("q8_0", "q8_0")], [512]),
    )
    assert ranked[0]["type_k"] == "q8_0"
    assert (
        rank_placements(
            OnDevice(qwen3, device, "rpc"),
            ask("prefill"),
            32768,
            prior(Bandwidths(640, 57.6)),
            choices=choices([("f16", "f16")], [512]),
        )[0]["score"]
        is None
    )  # prefill needs a calibration


def test_a_gain_inside_the_ratio_band_keeps_the_users_line_and_one_beyond_it_is_named(qwen3):
    """Before any run (the learned prior) at 16 GB and 32K, a q8_0 KV cache is predicted to decode about 26% faster
    (more experts fit on the card), inside the ratio band of a ratio that size (x/÷1.29, docs/speed-prior.md): the
    list is sorted by predicted speed, q8_0 first, every expert placement equivalent to it, and the advice keeps the
    user's f16 --n-cpu-moe with the q8_0 lines among the contenders tune measures. As if exact, the same gain is
    beyond the band: the advice names the fastest q8_0 line, its gain and its band, and the quality it costs."""
    from moeplace.core.config import Device
    from moeplace.plan.learned_prior import Machine, speed_model
    from moeplace.plan.optimal import OnDevice, advise, rank_placements

    model = speed_model(qwen3, Machine("cuda", 672, 60, 31.5, 44.1))
    kv_types = [("f16", "f16"), ("q8_0", "q8_0")]
    on = OnDevice(qwen3, Device(16 * 10**9, 10**9), "rpc")
    ranked = rank_placements(on, ask("decode"), 32768, model, choices=choices(kv_types, [512]))
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores, reverse=True) and ranked[0]["type_k"] == "q8_0"
    experts = [r for r in ranked if r["placement"] != "ngl"]  # whole layers on the host: slower beyond the band
    assert all(r["equivalent"] for r in experts) and not any(r["equivalent"] for r in ranked if r not in experts)
    yours = next(r for r in ranked if (r["placement"], r["type_k"]) == ("ncmoe", "f16"))
    ratio = ranked[0]["score"] / yours["score"]
    assert 1.2 < ratio < math.exp(model.ratio_bound("tg", math.log(ratio)))
    advice = advise(ranked, ask("decode"), model)
    assert advice.use is yours and advice.gain is None and ranked[0] in advice.contenders
    sure = certain(model)
    ranked = rank_placements(on, ask("decode"), 32768, sure, choices=choices(kv_types, [512]))
    advice = advise(ranked, ask("decode"), sure)
    assert advice.use is ranked[0] and advice.use["type_k"] == "q8_0" and advice.gain.low > 1.2
    assert advice.gain.ratio == pytest.approx(ranked[0]["score"] / advice.yours["score"])
    assert any("q8_0 KV cache" in c for c in advice.costs)


def test_optimal_placement_weighs_scattered_tensors_against_their_hops():
    from moeplace.plan.offload import optimal_placement

    meta = uniform_meta(n_layer=4)
    for layer in meta.layers:  # 2 + 2 + 3 MiB a layer, 28 MiB in all
        layer.expert_tensors.update({n: (3 if "down" in n else 2) * 2**20 for n in layer.expert_tensors})
    room = 22 * 2**20  # one layer on the host leaves 21 MiB on the card; two down tensors leave 22

    cheap = optimal_placement(meta, room, host_layer_bytes=0.5 * 2**20)  # a host layer's hops cost less than 1 MiB
    assert tensor_bytes(meta, cheap) == 6 * 2**20 and len(host_layers(cheap)) == 2
    assert optimal_placement(meta, room, host_layer_bytes=1.5 * 2**20) == expert_tensors(meta, [0])  # they cost more


def test_optimal_placement_finds_the_best_placement_by_brute_force():
    """Every host set of a small model with unequal tensors, against the knapsack: the most resident bytes within
    the budget, less the hop cost of each layer with an expert on the host."""
    import itertools
    import random

    from moeplace.plan.offload import optimal_placement

    rng = random.Random(7)
    for _ in range(20):
        meta = uniform_meta(n_layer=4)
        for layer in meta.layers:
            layer.expert_tensors.update({n: rng.randint(1, 6) * 2**20 for n in layer.expert_tensors})
        sizes = {n: b for layer in meta.layers for n, b in layer.expert_tensors.items()}
        budget, hop = rng.randint(3, 50) * 2**20, rng.choice([0, 0.5, 2, 5]) * 2**20

        def value(host: set[str]) -> float | None:
            resident = sum(b for n, b in sizes.items() if n not in host)
            return resident - hop * len(host_layers(host)) if resident <= budget else None

        every = (set(c) for k in range(len(sizes) + 1) for c in itertools.combinations(sizes, k))
        best = max(v for v in map(value, every) if v is not None)
        assert value(optimal_placement(meta, budget, hop)) == best


def test_decode_ranks_the_placement_that_pays_for_its_hops_first(qwen3):
    """With a hop cost, the most expert bytes on the card (Q6_K ffn_down tensors moved one by one to the host)
    adds a host layer per tensor: at 20 us a hop it is slower than --n-cpu-moe, and the knapsack that prices the
    hops finds a placement faster than both, with no more layers on the host than --n-cpu-moe."""
    from moeplace.core.config import Bandwidths, Device
    from moeplace.plan.optimal import OnDevice, rank_placements
    from moeplace.plan.speed import host_layer_bytes, prior

    model = certain(prior(Bandwidths(640, 57.6, measured_hop_s=20e-6)))
    # 2 hops of 20 us over (8/128 read) x (1/57.6 - 1/640) s/GB: 38.6 MiB
    assert host_layer_bytes(qwen3, model) == pytest.approx(40e-6 / (8 / 128 * (1 / 57.6 - 1 / 640) / 1e9))
    assert host_layer_bytes(qwen3, prior(Bandwidths(640, 57.6))) == 0  # no hop priced: bytes alone
    on = OnDevice(qwen3, Device(16 * 10**9, 10**9), "rpc")
    ranked = rank_placements(on, ask("decode"), 32768, model, choices=choices([("f16", "f16")], [512]))
    ranked = [r for r in ranked if r["placement"] != "ngl"]  # the expert placements (whole layers: another test)
    layers = [len(host_layers(r["host_tensors"])) or r["n_cpu_moe"] for r in ranked]
    ncmoe = next(i for i, r in enumerate(ranked) if r["placement"] == "ncmoe")
    assert len(ranked) == 3 and ncmoe == 1
    assert layers[0] <= layers[ncmoe] < layers[2]
    assert ranked[0]["score"] > ranked[1]["score"] > ranked[2]["score"]


def test_the_check_compares_each_tensors_destination_and_stops_on_a_mismatch():
    import pandas as pd

    from moeplace.core.errors import MoeplaceError
    from moeplace.measure.placement import check_placement, placement_check_table, require_placed_as_asked

    intended = {"blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"}
    right = {"blk.0.ffn_up_exps.weight": "CPU_REPACK", "blk.0.ffn_down_exps.weight": "CPU"}
    assert check_placement(intended, right)["match"]
    # overridden, but to the device: not where it was asked to go
    wrong = {**right, "blk.0.ffn_down_exps.weight": "RPC0[127.0.0.1:5000]"}
    check = check_placement(intended, wrong)
    assert not check["match"] and check["missing"] == ["blk.0.ffn_down_exps.weight"]
    base = {"model": "m", "ctx": 4096, "overrides": "x", "host_expert_bytes": 1, "cpu_tensors": []}
    records = [
        {**base, "variant": "last_n", "test": t, "status": "oom", "tensor_buffers": wrong, "placement_match": False,
         "placement_missing": check["missing"], "placement_unexpected": []}
        for t in ("pp", "tg")
    ] + [{**base, "variant": "up_down", "test": "tg", "status": "oom", "tensor_buffers": {}, "placement_match": None,
          "placement_missing": [], "placement_unexpected": []}]  # fmt: skip
    table = placement_check_table(records)
    assert table.variant.tolist() == ["last_n"]  # every run with a log, failed ones too; one row per run
    with pytest.raises(MoeplaceError, match=r"placed 1 variant\(s\) otherwise than asked \(m/last_n at 4096") as e:
        require_placed_as_asked(table, "logs/placement/4k.log")
    assert "\n" not in str(e.value)
    require_placed_as_asked(pd.DataFrame(), "x")  # nothing measured: nothing to stop


@pytest.mark.llamacpp
@pytest.mark.fault(
    fault="llama.cpp places tensors otherwise than asked",
    injected="an -ot value one tensor short of the intended placement",
    sees="the placement stage stops with one line naming the variants",
    kept="the load log and the per-tensor check in the job log",
)
def test_a_wrong_placement_is_caught_from_llamacpps_own_log(tmp_path, monkeypatch):
    """Ask llama.cpp for one tensor fewer on the host than the variant intends: the check sees it."""
    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.core.config import BenchSettings
    from moeplace.core.errors import MoeplaceError
    from moeplace.measure import placement
    from moeplace.runtime.device import DeviceSetup

    real = placement.ot_value
    monkeypatch.setattr(placement, "ot_value", lambda host, separator=";": real(set(sorted(host)[1:]), separator))
    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    job = BenchJob("m", str(path), meta.files, 1024, 0)
    rig = Rig(BenchSettings(32, 8, 1, 2, 300), DeviceSetup("emulated", "test", 2**30), manifest(), tmp_path / "v.log",
              ROOT)  # fmt: skip
    records = placement.run_variant("last_n", meta, 4, {"budget_bytes": 15 * 10**6}, job, rig)
    assert records[0]["status"] == "ok" and not records[0]["placement_match"]
    assert len(records[0]["placement_missing"]) == 1
    with pytest.raises(MoeplaceError, match="otherwise than asked"):
        placement.require_placed_as_asked(placement.placement_check_table(records), "v.log")


def test_ranking_searches_ubatch_with_its_compute_buffer(qwen3):
    """A larger ubatch's compute buffer (its logits alone: 151,936 x ubatch x 4 bytes) pushes experts to the host:
    for decode the smaller ubatch ranks first, even when given second."""
    from moeplace.core.config import Bandwidths, Device
    from moeplace.plan.optimal import OnDevice, rank_placements
    from moeplace.plan.speed import prior

    ranked = rank_placements(
        OnDevice(qwen3, Device(16 * 10**9, 0), "rpc"),
        ask("decode"),
        32768,
        certain(prior(Bandwidths(640, 57.6))),
        choices=choices([("f16", "f16")], [2048, 512]),
    )
    ncmoe = {r["ubatch"]: r for r in ranked if r["placement"] == "ncmoe"}
    assert ncmoe[2048]["n_cpu_moe"] > ncmoe[512]["n_cpu_moe"]
    assert ranked[0]["ubatch"] == 512 and ranked[0]["score"] > ncmoe[2048]["score"]


def test_an_ot_rule_naming_a_device_keeps_its_tensors_off_the_host():
    """llama-fit-params' placement over two RPC devices (2026-12-05, the tiny qwen3moe twin at 16K on 40/30 MB):
    layer 4's gate and down experts go to the first device, the rest of its rules to the CPU; the first matching
    rule wins, as in llama.cpp."""
    fit = ("blk\\.4\\.ffn_(gate|gate_up|down).*=RPC0[127.0.0.1:60841];blk\\.6\\.ffn_down.*=CPU;"
           "blk\\.7\\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU")  # fmt: skip
    names = [f"blk.{il}.ffn_{kind}_exps.weight" for il in (4, 6, 7) for kind in ("gate", "up", "down")]
    assert matching_tensors(fit, names) == {"blk.6.ffn_down_exps.weight"} | {n for n in names if "blk.7." in n}
    assert matching_tensors("blk\\.4\\..*=CUDA0;blk\\.4\\.ffn_up.*=CPU", names) == set()  # the first wins


@pytest.mark.parametrize("host_layers,override", [("", None), ("4 5", r"blk\.[4-5]\.ffn_(up|down|gate)_exps=CPU")])
def test_the_device_plan_variant_runs_the_budgets_split_and_host_rule(tmp_path, monkeypatch, host_layers, override):
    """Over several devices the device_plan variant takes -ts and its host rule from the budget table, as a CSV
    reads them back (an empty cell is NaN: no rule), and is not paired with an -ncmoe run that would not load."""
    import pandas as pd

    from moeplace.core.config import BenchSettings
    from moeplace.measure import placement
    from moeplace.runtime.device import DeviceSetup

    path = write_twin(load_spec(ROOT / "config/models/tiny-qwen3moe.yaml"), tmp_path / "t.gguf", "none")
    meta = inspect_model(path)
    pd.DataFrame([{"ctx": 4096, "tensor_split": "4/5", "device_plan_override": override or "",
                   "device_plan_host_layers": host_layers}]).to_csv(tmp_path / "b.csv", index=False)  # fmt: skip
    row = pd.read_csv(tmp_path / "b.csv").iloc[0].to_dict()
    asked = []
    monkeypatch.setattr(placement, "run_bench", lambda job, rig: asked.append(job) or [{"tensor_buffers": {}}])
    device = DeviceSetup("emulated", "two", 40 * 10**6, other_caps=(30 * 10**6,))
    rig = Rig(BenchSettings(32, 8, 1, 2, 300), device, {}, tmp_path / "v.log", ROOT)
    (record,) = placement.run_variant("device_plan", meta, 3, row, BenchJob("m", str(path), [], 4096, 3), rig)
    (job,) = asked
    assert (job.n_cpu_moe, job.overrides, job.tensor_split, job.paired_n_cpu_moe) == (0, override, "4/5", None)
    assert record["placement_match"] == (not host_layers)  # nothing was placed: right only when none was asked
