rule dense_twin:
    input:
        spec=SETTINGS.stages.dense_twin,
        llamacpp=rules.llamacpp.output[0],
    output:
        "resources/ceilings/dense.gguf",
    log:
        "logs/ceilings/dense_twin.log",
    conda:
        "../../environment.yml"
    params:
        weights="random",
        quant=lambda wildcards, input: load_spec(input.spec).ftype,
        seed=0,
    script:
        "../scripts/twin.py"


rule ceilings:
    input:
        unpack(get_ceilings_inputs),
        llamacpp=rules.llamacpp.output[0],
        dense=rules.dense_twin.output[0],
    output:
        report(
            "results/tables/ceilings.csv",
            caption="../report/ceilings.rst",
            category="Tables",
        ),
    log:
        "logs/ceilings/ceilings.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        models=WEIGHT_MODELS,
        ceilings=params(SETTINGS.ceilings),
        bench=params(SETTINGS.bench),
        device=params(SETTINGS.device),
    script:
        "../scripts/ceilings.py"
