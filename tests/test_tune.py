"""The auto-tuner: two loads when the prediction is right, never much more than a bisection."""

from __future__ import annotations

import math

import pytest

from moeplace.measure.tune import search


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


def test_safety_layers_add_whole_layers():
    r = search(4, 8, threshold(4), safety_layers=2)
    assert (r.lowest_n, r.chosen_n, r.loads) == (4, 6, 3)


def test_a_collapse_next_to_a_feasible_neighbour_is_a_silent_spill():
    # n = 3 'runs' but at a fifth of n = 4's speed: memory spilled, so 4 is the answer.
    r = search(4, 8, threshold(0, {3: 2.0, 4: 10.0}))
    assert r.lowest_n == 4


@pytest.mark.llamacpp
@pytest.mark.long
def test_tuner_agrees_with_an_exhaustive_sweep_in_fewer_loads(tmp_path):
    """On the emulated capped device: every n probed vs the tuner's search from the budget's prediction."""
    from conftest import ROOT
    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.core.config import Device, TuneSettings
    from moeplace.measure.bench import BenchJob, Rig, run_sweep
    from moeplace.measure.tune import PROBE_TOKENS, Probing, probe_settings, tune
    from moeplace.model.memory import Workload
    from moeplace.model.metadata import inspect_model
    from moeplace.plan.budget import plan
    from moeplace.runtime.device import DeviceSetup

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    ctx, cap = 8192, 50 * 10**6  # holds the 8K context and about half the experts
    device = DeviceSetup("emulated", "test device", cap)
    # Every n, in one sweep: each value that runs out of memory ends its llama-bench process, the rest share one
    # depth fill (the tuner's probes are processes of their own).
    job = BenchJob("m", str(path), meta.files, ctx, 0, depth=ctx - PROBE_TOKENS)
    rig = Rig(probe_settings(2, 300), device, manifest(), tmp_path / "sweep.log", ROOT)
    records = run_sweep(job, list(range(meta.n_layer + 1)), rig)
    assert [r["n_cpu_moe"] for r in records] == list(range(meta.n_layer + 1))
    exhaustive = [r["status"] for r in records]
    lowest = exhaustive.index("ok")
    assert 0 < lowest < meta.n_layer, exhaustive  # the cliff lies inside the range
    assert all(s == "ok" for s in exhaustive[lowest:]) and all(s == "oom" for s in exhaustive[:lowest])
    predicted = plan(meta, Device(cap, 0), Workload(ctx))["n_cpu_moe"]
    probing = Probing(TuneSettings(0, 3600, 2), manifest(), tmp_path / "tune.log", ROOT)
    result = tune(str(path), Workload(ctx), device, meta.n_layer, predicted, probing)
    assert result.lowest_n == lowest
    assert result.loads < len(exhaustive)
    assert result.loads <= (2 if predicted == lowest else math.ceil(math.log2(meta.n_layer + 1)) + 2)


def speed_calibration(meta: dict, folder) -> str:
    """A calibration of both tests (from two made-up runs each: this checks the wiring, not the fit)."""
    from moeplace.plan.speed import Run
    from moeplace.plan.speed_fit import fit
    from moeplace.runtime.outputs import write_json

    made_up = [(0, "tg", 128, 50.0), (8, "tg", 128, 20.0), (0, "pp", 512, 500.0), (8, "pp", 512, 200.0)]
    model = fit(meta, [Run(n, 0, test, size, tok_s=tok_s) for n, test, size, tok_s in made_up])
    write_json(folder / "calibration.json", model.to_json())
    return str(folder / "calibration.json")


def test_tune_reads_its_calibration_before_any_load(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    from moeplace.model.twin import load_spec, write_twin

    path = write_twin(load_spec(ROOT / "config/models/tiny-qwen3moe.yaml"), tmp_path / "tiny.gguf", "none")
    (tmp_path / "bad.json").write_text("{not json")
    args = [str(path), "--ctx", "4096", "--vram", "1GB", "--bin-dir", str(tmp_path / "none"), "--calibration"]
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "tune", *args, str(tmp_path / "bad.json")],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"moeplace: --calibration {tmp_path / 'bad.json'}: cannot read it")
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.llamacpp
def test_tune_prints_the_speed_its_calibration_expects_at_the_chosen_n(tmp_path):
    """moeplace tune --calibration: beside the measured probe, decode at an empty context and at the target, and
    prefill, as recommend computes them for the n the loads chose."""
    import subprocess
    import sys

    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.model.memory import Workload
    from moeplace.model.metadata import inspect_model
    from moeplace.plan.assumed import describe_speed, expected
    from moeplace.plan.speed import SpeedModel

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    calibration = speed_calibration(meta, tmp_path)
    args = [str(path), "--ctx", "8192", "--vram", "50MB", "--device", "emulated", "--calibration", calibration,
            "--bin-dir", str(manifest().bin_dir), "--log", str(tmp_path / "tune.log")]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "tune", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    chosen = int(done.stdout.split("chosen n = ")[1].split()[0])
    model = SpeedModel.from_json(__import__("json").loads((tmp_path / "calibration.json").read_text()))
    host = frozenset(name for layer in meta.layers[:chosen] for name in layer.expert_tensors)
    line = "  expected: " + describe_speed(expected(meta, model, host, Workload(8192)), 8192)
    assert line in done.stdout.splitlines() and "prefill unknown" not in line


@pytest.mark.llamacpp
def test_tune_calibrates_the_speed_model_and_plans_with_it(tmp_path):
    """moeplace tune without --calibration: after the search, decode and a prefill at the chosen n and with every
    expert on the host, written as a calibration that predicts those two runs (a two-point fit, exact where no
    coefficient met its bound: on the emulated device without its slowed host side, the host may be as fast) and
    gives the speed it prints for the chosen n."""
    import json
    import subprocess
    import sys

    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.model.memory import Workload
    from moeplace.model.metadata import inspect_model
    from moeplace.plan.assumed import describe_speed, expected
    from moeplace.plan.speed import Run, SpeedModel

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    out = tmp_path / "calibration.json"
    args = [str(path), "--ctx", "8192", "--vram", "50MB", "--device", "emulated", "--calibration-out", str(out),
            "--bin-dir", str(manifest().bin_dir), "--log", str(tmp_path / "tune.log")]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "tune", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    chosen = int(done.stdout.split("chosen n = ")[1].split()[0])
    data = json.loads(out.read_text())
    assert data["status"] == "calibrated" and set(data["tests"]) == {"tg", "pp"}
    model = SpeedModel.from_json(data)
    measured = {}
    for line in done.stdout.splitlines():
        if line.startswith("  calibrating: --n-cpu-moe "):
            n, rest = line.removeprefix("  calibrating: --n-cpu-moe ").split(", ", 1)
            test, speed = rest.split(": ")
            measured[int(n), test] = float(speed.split()[0])
    assert {n for n, _ in measured} == {chosen, meta.n_layer} and len(measured) == 4
    for (n, test), tok_s in measured.items():
        if model.tests[test].at_zero:
            continue
        run = Run(n, 0, test, 32 if test == "tg" else 512)
        assert model.predict(meta, run)["tok_s"] == pytest.approx(tok_s, rel=0.02), (n, test)
    host = frozenset(name for layer in meta.layers[:chosen] for name in layer.expert_tensors)
    assert (
        "  expected: " + describe_speed(expected(meta, model, host, Workload(8192)), 8192) in done.stdout.splitlines()
    )


def _row(name: str, score: float) -> dict:
    """A ranked placement as race takes it (its name in `placement`'s stead: the fake runs look it up)."""
    return {"placement": "ncmoe", "n_cpu_moe": 0, "type_k": "f16", "type_v": "f16", "ubatch": 512, "score": score,
            "name": name}  # fmt: skip


def test_a_race_stops_once_one_placement_is_clearly_ahead():
    """tune --placement optimal's race, with runs of known speed and 2% noise: each round runs every contender in an
    order rotated round by round; one 25% faster than the others is clearly ahead after the fewest rounds, a placement
    that fails stops running, and two alike race to the last round with neither clearly ahead."""
    import itertools

    from moeplace.measure.contenders import FEWEST_ROUNDS, MAX_ROUNDS, race

    noise = itertools.cycle([0.99, 1.02, 0.985, 1.01, 1.0, 0.98, 1.015])
    order = []

    def measure(row: dict):
        order.append(row["name"])
        if row["name"] == "broken":
            return "oom: failed to allocate"
        return {"tg": {"fast": 50.0, "slow": 40.0, "alike": 40.0}[row["name"]] * next(noise)}

    rows = [_row("slow", 45.0), _row("fast", 44.0), _row("broken", 43.0)]
    raced = race(rows, measure, "decode")
    assert raced.winner.row["name"] == "fast" and raced.clear and raced.rounds == FEWEST_ROUNDS
    delta, low, high = raced.intervals[0]
    assert 0 < low < 0.25 < high and delta == pytest.approx(0.25, abs=0.03)
    assert order[:3] == ["slow", "fast", "broken"] and order[3:5] == ["fast", "slow"]  # rotated; broken stopped
    assert raced.contenders[2].failure.startswith("oom")
    even = race([_row("slow", 45.0), _row("alike", 44.0)], measure, "decode")
    assert even.rounds == MAX_ROUNDS and not even.clear


@pytest.mark.llamacpp
def test_the_race_picks_the_placement_measured_faster_on_the_emulated_device(tmp_path):
    """Twins of one model on the emulated device (host side 8x slower), whose speed differs by far more than 20%:
    every expert on the card against six of eight layers' experts on the host. The race names the first, clearly
    ahead, before its last round; a paired, interleaved comparison of the two with the -ot variants stage's method
    (run_bench with the other as its -ncmoe baseline), run independently after, agrees."""
    from conftest import ROOT
    from llamacpp_helpers import manifest, tiny_twin

    from moeplace.core.config import BenchSettings, TuneSettings
    from moeplace.core.stats import delta_interval
    from moeplace.measure.bench import BenchJob, run_bench
    from moeplace.measure.contenders import MAX_ROUNDS, bench_measure, race
    from moeplace.measure.tune import Probing
    from moeplace.model.metadata import inspect_model
    from moeplace.plan.request import Request
    from moeplace.runtime.device import DeviceSetup

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    ctx, device = 4096, DeviceSetup("emulated", "test device", 60 * 10**6)  # every expert fits at 4K
    probing = Probing(TuneSettings(0, 600, 2), manifest(), tmp_path / "race.log", ROOT)
    request = Request((ctx,), str(path), vram=("60MB",), emit="bench", placement="optimal")
    measure, _ = bench_measure(meta, str(path), request, ctx, device, probing, 0)
    card, host = {**_row("card", 1.0), "n_cpu_moe": 0}, {**_row("host", 1.0), "n_cpu_moe": 6}
    raced = race([host, card], measure, "decode")  # the slower first, as its prediction were higher
    assert raced.winner.row is card and raced.clear and raced.rounds < MAX_ROUNDS
    delta, low, _ = raced.intervals[0]
    assert low > 0 and delta >= 0.2
    settings = BenchSettings(prompt=0, gen=32, repetitions=3, threads=2, timeout_s=600)
    job = BenchJob(meta.name, str(path), meta.file_records(), ctx, 0, "check", paired_n_cpu_moe=6)
    (record,) = run_bench(job, probing.rig(settings, device))
    check, check_low, _ = delta_interval(record["samples_ts"], record["baseline_samples_ts"])
    assert record["status"] == "ok" and check_low > 0, (check, check_low)


@pytest.mark.llamacpp
def test_tune_placement_optimal_races_the_contenders_and_prints_the_winners_line(tmp_path):
    """moeplace tune --placement optimal on the emulated device: after the search, the placements the speed model
    cannot tell apart (yours among them) race; it prints each one's measured speed, the winner's llama-server line,
    and the list ranked again with the calibration the race gave. --objective without it is refused."""
    import subprocess
    import sys

    from llamacpp_helpers import manifest, tiny_twin

    path = tiny_twin(tmp_path)
    args = [str(path), "--ctx", "2048", "--vram", "35MB", "--device", "emulated", "--bin-dir",
            str(manifest().bin_dir), "--log", str(tmp_path / "tune.log"), "--calibration-out",
            str(tmp_path / "cal.json")]  # fmt: skip
    refused = subprocess.run([sys.executable, "-m", "moeplace.cli", "tune", *args, "--objective", "decode"],
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 2 and "add --placement optimal" in refused.stderr
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "tune", *args, "--placement", "optimal"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    lines = done.stdout.splitlines()
    raced = lines.index(next(line for line in lines if line.startswith("raced ")))
    winner = lines.index(next(line for line in lines if line.startswith("measured winner")))
    rows = lines[raced + 1 : winner]
    assert len(rows) >= 2 and sum("the fastest" in row and "faster" not in row for row in rows) == 1
    assert lines[winner + 1].strip().startswith("llama-server ")
