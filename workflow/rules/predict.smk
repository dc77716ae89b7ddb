rule predict:
    input:
        unpack(get_ceilings_table),
        metadata=rules.metadata.output[0],
    output:
        "results/tables/predicted/{model}.csv",
    log:
        "logs/predict/{model}.log",
    conda:
        "../../environment.yml"
    params:
        bandwidths=params(SETTINGS.bandwidths),
        bench=params(SETTINGS.bench),  # the ceilings probe's runs, which the prior is anchored to
    script:
        "../scripts/predict.py"
