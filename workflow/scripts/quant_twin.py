"""Stage 'twin' (quant comparison): the model's F16 twin -> resources/quants/{model}/{quant}.gguf."""

from moeplace.outputs import read_json, stage
from moeplace.twin import quantize

with stage(snakemake.log[0]) as log:
    w = snakemake.wildcards
    quantize(read_json(snakemake.input.llamacpp), snakemake.input.f16, snakemake.output[0], w.quant, snakemake.log[0])
    log.info("quantized %s to %s", w.model, w.quant)
