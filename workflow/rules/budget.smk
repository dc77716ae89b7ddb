checkpoint budget:
    input:
        metadata="results/metadata/{model}.json",
    output:
        "results/tables/budget/{model}.csv",
    log:
        "logs/budget/{model}.log",
    conda:
        "../../environment.yml"
    params:
        device=config["device"],
        contexts=config["contexts"],
        cache_type_k=config["cache_type_k"],
        cache_type_v=config["cache_type_v"],
        bandwidths=get_bandwidths(),
    script:
        "../scripts/budget.py"
