"""Stage 'metadata': GGUF header (or the seed's constants) -> results/metadata/{model}.json."""

from moeplace.model.meta import to_json
from moeplace.model.metadata import from_constants, inspect_model
from moeplace.runtime.outputs import stage, write_json

with stage(snakemake.log[0]) as log:
    model = snakemake.wildcards.model
    constants = snakemake.params.constants
    meta = (from_constants(model, constants) if constants else inspect_model(snakemake.input.gguf[0])).named(model)
    log.info(
        "%s: %d layers, %.3f GB expert, %.3f GB non-expert",
        model,
        meta.n_layer,
        meta.expert_bytes / 1e9,
        meta.non_expert_bytes / 1e9,
    )
    write_json(snakemake.output[0], to_json(meta))
