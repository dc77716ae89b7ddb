rule publish:
    input:
        unpack(get_publish_inputs),
    output:
        folder=directory(f"publish/{SETTINGS.publish_name}"),
        archive=f"publish/{SETTINGS.publish_name}.tar.gz",
    log:
        "logs/publish/publish.log",
    conda:
        "../../environment.yml"
    params:
        captions=get_publish_captions,
        missing=get_publish_missing,
        stale=get_publish_stale,
        config=PIPELINE.plain_config,
        configfiles=[str(f) for f in workflow.overwrite_configfiles or []],
    script:
        "../scripts/publish.py"
