rule figure_ncmoe:
    input:
        measured=lambda wildcards: f"results/tables/measured/ctx{LABELS[wildcards.label]}.csv",
        compare=lambda wildcards: f"results/tables/compare/ctx{LABELS[wildcards.label]}.csv",
        predicted=expand("results/tables/predicted/{model}.csv", model=BENCH_MODELS),
    output:
        tg=report(
            "results/figures/ncmoe_{label}.png",
            caption="../report/ncmoe.rst",
            category="Figures",
        ),
        pp=report(
            "results/figures/ncmoe_{label}_pp.png",
            caption="../report/ncmoe_pp.rst",
            category="Figures",
        ),
    log:
        "logs/figures/ncmoe_{label}.log",
    conda:
        "../../environment.yml"
    params:
        models=BENCH_MODELS,
        ctx=lambda wildcards: LABELS[wildcards.label],
    script:
        "../scripts/figures.py"
