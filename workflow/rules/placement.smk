rule placement:
    input:
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        budget=rules.budget.output[0],
        llamacpp=rules.llamacpp.output[0],
    output:
        "results/variants/{model}/{ctx}/{variant}.jsonl",
    log:
        "logs/variants/{model}/{ctx}/{variant}.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        settings=params(SETTINGS.bench),
        device=params(SETTINGS.device),
        ctx=ctx_tokens,
    script:
        "../scripts/placement.py"


rule placement_table:
    input:
        expand(
            rules.placement.output[0],
            model=BENCH_MODELS,
            variant=RUN_VARIANTS,
            allow_missing=True,
        ),
    output:
        variants="results/tables/variants/{ctx}.csv",
        check="results/tables/placement_check/{ctx}.csv",
    log:
        "logs/placement/{ctx}.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/placement_table.py"


rule figure_variants:
    input:
        variants=rules.placement_table.output.variants,
    output:
        report(
            "results/figures/variants_{ctx}.png",
            caption="../report/variants.rst",
            category="Figures",
        ),
    log:
        "logs/figures/variants_{ctx}.log",
    conda:
        "../../environment.yml"
    params:
        ctx=ctx_tokens,
    script:
        "../scripts/figure_variants.py"
