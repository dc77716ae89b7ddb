"""Stage 'placement' (one context): variant records -> variants and placement_check tables; a mismatch fails."""

from moeplace.errors import MoeplaceError
from moeplace.outputs import read_jsonl, stage, write_csv
from moeplace.placement import placement_check_table, variants_table

with stage(snakemake.log[0]) as log:
    records = [r for path in snakemake.input for r in read_jsonl(path)]
    check = placement_check_table(records)
    write_csv(snakemake.output.check, check)
    write_csv(snakemake.output.variants, variants_table(records))
    bad = check[~check.match.astype(bool)]
    if len(bad):
        raise MoeplaceError(
            f"llama.cpp placed {len(bad)} variant(s) differently than intended "
            f"({', '.join(bad.model + '/' + bad.variant)}); see {snakemake.output.check}."
        )
    log.info("%d variants, all placed as intended", len(check))
