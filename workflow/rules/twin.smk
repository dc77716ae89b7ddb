rule twin:
    input:
        unpack(get_twin_inputs),
    output:
        "resources/models/{model}.gguf",
    log:
        "logs/twin/{model}.log",
    conda:
        "../../environment.yml"
    params:
        weights=lambda wildcards: model_config(wildcards.model)["weights"],
        quant=lambda wildcards: model_config(wildcards.model)["quant"],
        seed=lambda wildcards: model_config(wildcards.model)["seed"],
    script:
        "../scripts/twin.py"
