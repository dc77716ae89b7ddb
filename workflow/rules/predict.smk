rule predict:
    input:
        metadata="results/metadata/{model}.json",
    output:
        "results/tables/predicted/{model}.csv",
    log:
        "logs/predict/{model}.log",
    conda:
        "../../environment.yml"
    params:
        bandwidths=get_bandwidths(),
    script:
        "../scripts/predict.py"
