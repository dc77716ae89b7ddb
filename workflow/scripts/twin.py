"""Stage 'twin': architecture spec -> resources/models/{model}.gguf (sparse, or the F16 twin quantized)."""

from moeplace.outputs import read_json, stage
from moeplace.twin import load_spec, quantize, write_twin

with stage(snakemake.log[0]) as log:
    i, p = snakemake.input, snakemake.params
    spec = load_spec(i.spec)
    if p.weights == "random":
        quantize(read_json(i.llamacpp), i.f16, snakemake.output[0], p.quant, snakemake.log[0])
    else:
        write_twin(spec, snakemake.output[0], "none")
    log.info("wrote %s twin of %s (%s weights)", p.quant if p.weights == "random" else spec.ftype, spec.name, p.weights)
