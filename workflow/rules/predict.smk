rule predict:
    input:
        unpack(get_predict_inputs),
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
