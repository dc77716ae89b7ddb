"""The auto-tuner: two loads when the prediction is right, never much more than a bisection."""

from __future__ import annotations

import math

import pytest

from moeplace.tune import search


def threshold(t: int, speeds: dict[int, float] | None = None):
    return lambda n: ("ok", (speeds or {}).get(n, 10.0)) if n >= t else ("oom", None)


@pytest.mark.parametrize("n_layer", [8, 27, 48])
def test_search_finds_the_cliff_from_any_prediction(n_layer):
    worst = 0
    for predicted in range(n_layer + 1):
        for t in range(n_layer + 2):  # t = n_layer + 1: nothing fits
            r = search(predicted, n_layer, threshold(t))
            assert r.lowest_n == (t if t <= n_layer else None)
            if t == predicted and t > 0:
                assert r.loads == 2  # n* runs, n*-1 does not
            worst = max(worst, r.loads)
    assert worst <= math.ceil(math.log2(n_layer + 1)) + 2


def test_margin_adds_whole_layers():
    r = search(4, 8, threshold(4), margin=2)
    assert (r.lowest_n, r.chosen_n, r.loads) == (4, 6, 3)


def test_a_collapse_next_to_a_feasible_neighbour_is_a_silent_spill():
    # n = 3 'runs' but at a fifth of n = 4's speed: memory spilled, so 4 is the answer.
    r = search(4, 8, threshold(0, {3: 2.0, 4: 10.0}))
    assert r.lowest_n == 4


@pytest.mark.llamacpp
def test_tuner_agrees_with_an_exhaustive_sweep_in_fewer_loads(tmp_path):
    """On the emulated capped device: every n probed vs the tuner's search from the budget's prediction."""
    from conftest import ROOT
    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.bench import run_bench
    from moeplace.budget import Device, plan
    from moeplace.memory import Workload
    from moeplace.metadata import inspect_model
    from moeplace.runtime.device import DeviceSetup
    from moeplace.tune import PROBE_TOKENS, probe_settings, tune

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    ctx, cap = 8192, 50 * 10**6  # holds the 8K context and about half the experts
    device = DeviceSetup("emulated", "test device", cap)
    exhaustive = []
    for n in range(meta["n_layer"] + 1):
        (record,) = run_bench(
            model_name="m",
            model_path=str(path),
            model_files=meta["files"],
            ctx=ctx,
            n_cpu_moe=n,
            settings=probe_settings(2, 300),
            device=device,
            manifest=manifest(),
            log_path=tmp_path / "sweep.log",
            workdir=ROOT,
            depth=ctx - PROBE_TOKENS,
        )
        exhaustive.append(record["status"])
    lowest = exhaustive.index("ok")
    assert 0 < lowest < meta["n_layer"], exhaustive  # the cliff lies inside the range
    assert all(s == "ok" for s in exhaustive[lowest:]) and all(s == "oom" for s in exhaustive[:lowest])
    predicted = plan(meta, Device(cap, 0), Workload(ctx))["n_cpu_moe"]
    result = tune(str(path), ctx, device, manifest(), meta["n_layer"], predicted, tmp_path / "tune.log", ROOT)
    assert result.lowest_n == lowest
    assert result.loads < len(exhaustive)
    assert result.loads <= (2 if predicted == lowest else math.ceil(math.log2(meta["n_layer"] + 1)) + 2)
