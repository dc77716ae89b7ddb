rule calibrate:
    input:
        unpack(get_ceilings_table),
        bench=get_model_bench,
        metadata=rules.metadata.output[0],
    output:
        "results/calibration/{model}.json",
    log:
        "logs/calibrate/{model}.log",
    conda:
        "../../environment.yml"
    params:
        bandwidths=params(SETTINGS.bandwidths),
        bench=params(SETTINGS.bench),  # the ceilings probe's runs, which the prior is anchored to
    script:
        "../scripts/calibrate.py"


rule fidelity:
    input:
        unpack(get_ceilings_table),
        bench=get_all_bench,
        metadata=expand(rules.metadata.output[0], model=BENCH_MODELS),
    output:
        table=report(
            "results/tables/fidelity.csv",
            caption="../report/fidelity.rst",
            category="Speed model",
        ),
        summary=report(
            "results/tables/fidelity_summary.csv",
            caption="../report/fidelity.rst",
            category="Speed model",
        ),
        figure=report(
            "results/figures/fidelity.png",
            caption="../report/fidelity.rst",
            category="Speed model",
        ),
    log:
        "logs/calibrate/fidelity.log",
    conda:
        "../../environment.yml"
    params:
        models=BENCH_MODELS,
        bandwidths=params(SETTINGS.bandwidths),
        bench=params(SETTINGS.bench),  # the ceilings probe's runs, which the prior is anchored to
    script:
        "../scripts/fidelity.py"
