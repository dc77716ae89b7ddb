rule variant:
    input:
        model=get_model_gguf,
        metadata="results/metadata/{model}.json",
        budget="results/tables/budget/{model}.csv",
        llamacpp="resources/llamacpp/llamacpp.json",
    output:
        "results/variants/{model}/ctx{ctx}/{variant}.jsonl",
    log:
        "logs/variants/{model}/ctx{ctx}/{variant}.log",
    conda:
        "../../environment.yml"
    threads: config["bench"]["threads"]
    resources:
        bench_device=1,
    params:
        settings=get_bench_settings(),
        device=config["device"],
    script:
        "../scripts/variant.py"


rule placement:
    input:
        expand(
            "results/variants/{model}/ctx{{ctx}}/{variant}.jsonl",
            model=BENCH_MODELS,
            variant=VARIANTS,
        ),
    output:
        variants="results/tables/variants/ctx{ctx}.csv",
        check="results/tables/placement_check/ctx{ctx}.csv",
    log:
        "logs/placement/ctx{ctx}.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/placement.py"


rule figure_variants:
    input:
        variants=lambda wildcards: f"results/tables/variants/ctx{LABELS[wildcards.label]}.csv",
    output:
        report(
            "results/figures/variants_{label}.png",
            caption="../report/variants.rst",
            category="Figures",
        ),
    log:
        "logs/figures/variants_{label}.log",
    conda:
        "../../environment.yml"
    params:
        ctx=lambda wildcards: LABELS[wildcards.label],
    script:
        "../scripts/figure_variants.py"
