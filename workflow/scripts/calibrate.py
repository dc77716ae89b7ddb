"""Stage 'calibrate': one model's bench records (every context) -> results/calibration/{model}.json; the
ceilings stage's measured bandwidths and attention cost, where it ran, are the priors."""

import pandas as pd

from moeplace.core.config import Bandwidths, BenchSettings
from moeplace.model.meta import read_metadata
from moeplace.plan.calibrate import calibration_file
from moeplace.plan.measured_prior import measured_prior
from moeplace.runtime.outputs import read_jsonl, stage, write_json

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    records = [r for path in i.bench for r in read_jsonl(path)]
    ceilings = pd.read_csv(i.ceilings) if "ceilings" in i.keys() else None
    meta = read_metadata(i.metadata)
    base, _, _ = measured_prior(
        Bandwidths(**p.bandwidths), ceilings, snakemake.wildcards.model, meta, BenchSettings(**p.bench)
    )
    calibration = calibration_file(meta, records, base)
    for test, m in calibration["tests"].items():
        log.info("%s from %d runs: %s (sources %s)", test, m["runs"], m["coef"], m["source"])
    if calibration.get("left_out_partial"):
        log.warning("left out %d records of runs that failed after some repetitions (status and samples in the "
                    "bench records)", calibration["left_out_partial"])  # fmt: skip
    if "not_calibrated" in calibration:
        log.warning("not calibrated: %s", calibration["not_calibrated"])
    for note in calibration.get("notes", []):
        log.warning("%s", note)
    write_json(snakemake.output[0], calibration)
