rule budget_check_model:
    input:
        model=get_model_gguf,
        metadata=rules.metadata.output[0],
        llamacpp=rules.llamacpp.output[0],
    output:
        "results/budget_check/{model}.csv",
    log:
        "logs/budget_check/{model}.log",
    conda:
        "../../environment.yml"
    threads: SETTINGS.bench.threads
    resources:
        bench_device=1,
    params:
        grid=params(SETTINGS.budget_check),
        device=params(SETTINGS.device),
        memory=params(SETTINGS.memory),
    script:
        "../scripts/budget_check_model.py"


rule budget_check:
    input:
        expand(rules.budget_check_model.output[0], model=BUDGET_CHECK_MODELS),
    output:
        table=report(
            "results/tables/budget_check.csv",
            caption="../report/budget_check.rst",
            category="Budget",
        ),
        figure=report(
            "results/figures/budget_check.png",
            caption="../report/budget_check.rst",
            category="Budget",
        ),
    log:
        "logs/budget_check/all.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/budget_check.py"
