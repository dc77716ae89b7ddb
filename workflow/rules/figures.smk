rule figure_ncmoe:
    input:
        measured=rules.aggregate_context.output.measured,
        compare=rules.aggregate_context.output.compare,
        predicted=expand(rules.predict.output[0], model=BENCH_MODELS),
    output:
        tg=report(
            "results/figures/ncmoe_{ctx}.png",
            caption="../report/ncmoe.rst",
            category="Figures",
        ),
        pp=report(
            "results/figures/ncmoe_{ctx}_pp.png",
            caption="../report/ncmoe_pp.rst",
            category="Figures",
        ),
    log:
        "logs/figures/ncmoe_{ctx}.log",
    conda:
        "../../environment.yml"
    params:
        models=BENCH_MODELS,
        ctx=ctx_tokens,
    script:
        "../scripts/figures.py"
