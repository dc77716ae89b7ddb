"""Stage 'placement' (its table, one context): every variant's records -> variants and placement_check
tables; a placement llama.cpp did not make as asked fails."""

from moeplace.measure.placement import placement_check_table, require_placed_as_asked, variants_table
from moeplace.runtime.outputs import read_jsonl, stage, write_csv

with stage(snakemake.log[0]) as log:
    records = [r for path in snakemake.input for r in read_jsonl(path)]
    check = placement_check_table(records)
    log.info("where llama.cpp put each variant's tensors:\n%s", check.to_string())
    require_placed_as_asked(check, snakemake.log[0])
    write_csv(snakemake.output.check, check)
    write_csv(snakemake.output.variants, variants_table(records))
    log.info("%d variant runs, all placed as asked", len(check))
