"""Stage 'calibrate': one model's bench records (every context) -> results/calibration/{model}.json."""

from moeplace.calibrate import calibration_file
from moeplace.outputs import read_json, read_jsonl, stage, write_json
from moeplace.predict import Bandwidths

with stage(snakemake.log[0]) as log:
    i = snakemake.input
    records = [r for path in i.bench for r in read_jsonl(path)]
    calibration = calibration_file(read_json(i.metadata), records, Bandwidths(**snakemake.params.bandwidths))
    for test, m in calibration["tests"].items():
        log.info("%s from %d runs: %s (sources %s)", test, m["runs"], m["coef"], m["source"])
    if "not_calibrated" in calibration:
        log.warning("not calibrated: %s", calibration["not_calibrated"])
    write_json(snakemake.output[0], calibration)
