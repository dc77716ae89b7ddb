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
    script:
        "../scripts/predict.py"
