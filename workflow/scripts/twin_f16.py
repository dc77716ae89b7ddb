"""Stage 'twin' (F16 step): architecture spec -> resources/f16/{model}.gguf, random F16 weights."""

from moeplace.outputs import stage
from moeplace.twin import load_spec, write_twin

with stage(snakemake.log[0]) as log:
    spec = load_spec(snakemake.input.spec)
    write_twin(spec, snakemake.output[0], "random", snakemake.params.seed)
    log.info("wrote the random F16 twin of %s (seed %d)", spec.name, snakemake.params.seed)
