rule ceilings:
    input:
        unpack(get_ceilings_inputs),
        llamacpp="resources/llamacpp/llamacpp.json",
        dense="resources/ceilings/dense.gguf",
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
    threads: config["bench"]["threads"]
    resources:
        bench_device=1,
    params:
        models=WEIGHT_MODELS,
        ceilings=config["ceilings"],
        threads=config["bench"]["threads"],
        device=config["device"],
        # random disk reads of the size a page fault reads under the RAM tier's readahead
        random_kib=config["ram_tier"]["readahead_kb"] or 4,
    script:
        "../scripts/ceilings.py"


rule dense_twin:
    input:
        spec=config["ceilings"]["dense_twin"],
        llamacpp="resources/llamacpp/llamacpp.json",
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
