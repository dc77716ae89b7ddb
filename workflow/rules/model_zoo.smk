rule model_zoo:
    input:
        specs=get_zoo_specs,
    output:
        table=report(
            "results/tables/model_zoo.csv",
            caption="../report/model_zoo.rst",
            category="Tables",
        ),
        markdown="results/model_zoo.md",
    log:
        "logs/model_zoo/model_zoo.log",
    conda:
        "../../environment.yml"
    script:
        "../scripts/model_zoo.py"
