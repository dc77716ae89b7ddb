from snakemake.utils import min_version

min_version("9.20")


# The default run, unless --configfile names another (Snakemake would merge the two: models would add up).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/llamacpp.smk"
include: "workflow/rules/twin.smk"
include: "workflow/rules/metadata.smk"
include: "workflow/rules/ceilings.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/budget.smk"
include: "workflow/rules/budget_check.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/placement.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/tune.smk"
include: "workflow/rules/routing.smk"
include: "workflow/rules/ram_tier.smk"
include: "workflow/rules/quants.smk"
include: "workflow/rules/publish.smk"
include: "workflow/rules/model_zoo.smk"


report: "workflow/report/workflow.rst"


# On a cluster these run where Snakemake runs; everything that measures goes to the nodes.
localrules:
    all,
    metadata,
    predict,
    budget,
    aggregate,
    aggregate_table,
    precision,
    calibrate,
    fidelity,
    figure_ncmoe,
    matrix,
    placement_table,
    figure_variants,
    routing_table,
    ram_tier_table,
    model_zoo,


rule all:
    input:
        get_final_outputs(),
