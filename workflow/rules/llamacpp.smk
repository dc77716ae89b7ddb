rule llamacpp:
    output:
        "resources/llamacpp/llamacpp.json",
    log:
        "logs/llamacpp/llamacpp.log",
    conda:
        "../../environment.yml"
    params:
        llamacpp=config["llamacpp"],
    script:
        "../scripts/llamacpp.py"
