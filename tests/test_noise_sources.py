"""report/noise_sources.py: a measure that drives the repetitions' speed is found to explain its spread, one that
does not is not (records built here with a known cause)."""

from __future__ import annotations

import random

from moeplace.report.noise_sources import noise_sources, render


def _record(n: int, rng: random.Random) -> dict:
    steal = [rng.choice([0.0, 0.0, 10.0, 30.0, 60.0]) for _ in range(12)]
    switches = [rng.uniform(900, 1100) for _ in range(12)]
    # each millisecond stolen of a 300 ms repetition costs it that share of its speed; switches do nothing
    speed = [50.0 / (1 + s / 300) for s in steal]
    noise = [{"steal_host_ms": s, "host_switches": w} for s, w in zip(steal, switches)]
    return {"test": "tg", "status": "ok", "n_cpu_moe": n, "samples_ts": speed, "samples_noise": noise}


def test_the_measure_that_slows_the_repetitions_is_the_one_found():
    rng = random.Random(1)
    found = {s.measure: s for s in noise_sources([_record(n, rng) for n in range(4)])}
    assert found["steal_host_ms"].rho < -0.95 and found["steal_host_ms"].r2 > 0.95
    assert abs(found["host_switches"].rho) < 0.3 and found["host_switches"].r2 < 0.1
    assert found["steal_host_ms"].reps == 48
    assert "| tg | steal_host_ms | 48 |" in render(list(found.values())).splitlines()[2]


def test_repetitions_without_a_reading_are_left_out():
    rng = random.Random(2)
    record = _record(0, rng)
    record["samples_noise"] = [None] * 12
    assert noise_sources([record]) == []
