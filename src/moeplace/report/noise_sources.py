"""Which of the machine's doings explains the spread of a sweep's repetitions (issue 65): each repetition's speed
against its configuration's median, set beside what the kernel saw of that repetition (runtime/noise.py).

    python -m moeplace.report.noise_sources results/bench/*/*.jsonl

For every measure (steal, the slowed core's duty cycle, each process's time on a CPU or waiting, its involuntary
switches) it prints the rank correlation of its deviation from its configuration's median with the repetition's
speed deviation, and the share of the speed's variance a straight line through them explains, pooled over the
configurations of each test; a measure that explains the spread has |rho| and R² well above 0.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from ..core.records import BenchRecord


@dataclass(frozen=True)
class Source:
    test: str
    measure: str
    reps: int
    rho: float
    r2: float
    typical: float  # the measure's median over the repetitions


def _read(record: BenchRecord) -> list[tuple[float, dict[str, float]]]:
    """(tok/s, what the machine did) of each of a record's repetitions that has a reading."""
    return [(v, n) for v, n in zip(record.get("samples_ts") or [], record.get("samples_noise") or []) if n]


def _deviations(record: BenchRecord) -> list[tuple[float, dict[str, float]]]:
    """(log speed / the configuration's median, each measure less its median) of a record's repetitions."""
    pairs = _read(record)
    if len(pairs) < 4:
        return []
    median = statistics.median(v for v, _ in pairs)
    keys = set.intersection(*(set(n) for _, n in pairs))
    centre = {k: statistics.median(n[k] for _, n in pairs) for k in keys}
    return [(math.log(v / median), {k: n[k] - centre[k] for k in keys}) for v, n in pairs]


def noise_sources(records: list[BenchRecord]) -> list[Source]:
    """Per test and measure, how well the measure's deviations explain the speed's."""
    found: list[Source] = []
    for test in sorted({r["test"] for r in records}):
        reps = [d for r in records if r["test"] == test and r["status"] == "ok" for d in _deviations(r)]
        measures = sorted(set.intersection(*(set(n) for _, n in reps))) if reps else []
        raw = {k: [n[k] for r in records if r["test"] == test for _, n in _read(r)] for k in measures}
        for measure in (m for m in measures if m != "wall_ms"):  # the repetition's time is its speed
            speed = np.array([d for d, _ in reps])
            value = np.array([n[measure] for _, n in reps])
            if value.std() == 0 or speed.std() == 0:
                continue
            rho = float(spearmanr(value, speed).statistic)
            r2 = float(np.corrcoef(value, speed)[0, 1] ** 2)
            found.append(Source(test, measure, len(reps), rho, r2, statistics.median(raw[measure])))
    return found


def render(sources: list[Source]) -> str:
    lines = ["| test | measure | repetitions | median | rank corr. with speed | R² |", "|---|---|---|---|---|---|"]
    for s in sorted(sources, key=lambda s: (s.test, -s.r2)):
        lines.append(f"| {s.test} | {s.measure} | {s.reps} | {s.typical:.4g} | {s.rho:+.2f} | {s.r2:.2f} |")
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    records = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines() if line.strip()]
    print(render(noise_sources(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
