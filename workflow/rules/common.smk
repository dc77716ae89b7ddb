import sys
from dataclasses import replace
from pathlib import Path

from moeplace.cli import pipeline
from moeplace.core.config import params
from moeplace.core.errors import MoeplaceError
from moeplace.model.gguf_file import shard_paths
from moeplace.model.kvcache import CACHE_TYPES
from moeplace.runtime.llamacpp import LAYOUT as LLAMACPP_CACHE_LAYOUT
from moeplace.model.twin import load_spec


def stop(message):
    """End the run before any job with one line naming the problem, no traceback."""
    sys.exit(f"moeplace: {message}")


# The config, read once: validated, typed, checked against the files it names (moeplace.cli.pipeline).
try:
    PIPELINE = pipeline.start(config, Path.cwd(), workflow.is_main_process)
except MoeplaceError as e:
    stop(e)
SETTINGS = PIPELINE.settings
MODELS = list(SETTINGS.models)
FILE_MODELS = PIPELINE.file_models
BENCH_MODELS = PIPELINE.bench_models
WEIGHT_MODELS = PIPELINE.weight_models
BUDGET_CHECK_MODELS = PIPELINE.budget_check_models
RAM_TIER_MODELS = PIPELINE.ram_tier_models
ROUTING_MODELS = PIPELINE.routing_models
QUANTS_MODEL = PIPELINE.quants_model
CEILINGS = PIPELINE.ceilings
QUANTS = PIPELINE.quants
# Over several devices (device.vram a list) the placement variants are those that place across them.
RUN_VARIANTS = PIPELINE.variants
# Each context's one label ("32k"), used in every path, table name and title.
CONTEXTS = {c.label: c for c in SETTINGS.contexts}


wildcard_constraints:
    model="[A-Za-z0-9][A-Za-z0-9._-]*",
    ctx="|".join(CONTEXTS),
    variant="|".join(RUN_VARIANTS),
    kv="|".join(CACHE_TYPES),
    quant="[A-Za-z0-9_]+",


def model_config(model):
    return SETTINGS.models[model]


def model_files(model):
    """The GGUF file(s) a model is read from: the user's file (all shards) or its twin."""
    m = model_config(model)
    if m.gguf is not None:
        try:
            return [str(p) for p in shard_paths(Path(m.gguf))]
        except MoeplaceError as e:
            stop(f"config models.{model}.gguf: {e}")
    if m.twin is not None:
        return [rules.twin.output[0].format(model=model)]
    return []


def get_model_gguf(wildcards):
    return model_files(wildcards.model)


def metadata_path(model):
    return rules.metadata.output[0].format(model=model)


def ctx_tokens(wildcards):
    """The context of a job, in tokens, from its {ctx} label."""
    return CONTEXTS[wildcards.ctx].tokens


def get_budget_inputs(wildcards):
    """A model with tensors gets its compute buffers from llama.cpp's own reserve; the seed's constants do not."""
    inputs = {"metadata": metadata_path(wildcards.model)}
    if model_files(wildcards.model):
        inputs |= {
            "model": model_files(wildcards.model),
            "llamacpp": rules.llamacpp.output[0],
        }
    return inputs


def get_ceilings_table(wildcards):
    """The ceilings table where that stage runs: its measured bandwidths fill the speed model's priors and the
    RAM tier's predicted column."""
    return {"ceilings": rules.ceilings.output[0]} if CEILINGS else {}


def get_ceilings_inputs(wildcards):
    """Every benchmarked model's file and metadata, named per model."""
    inputs = {}
    for model in WEIGHT_MODELS:
        inputs[f"model_{model}"] = model_files(model)
        inputs[f"metadata_{model}"] = metadata_path(model)
    return inputs


def get_final_outputs():
    outputs = [
        path.format(model=m)
        for m in MODELS
        for path in (
            rules.metadata.output[0],
            rules.predict.output[0],
            rules.budget.output[0],
        )
    ]
    if BENCH_MODELS:
        outputs += [
            rules.aggregate_table.output.measured,
            rules.aggregate_table.output.compare,
        ]
        outputs.append(rules.precision.output[0])
        outputs += [rules.calibrate.output[0].format(model=m) for m in BENCH_MODELS]
        outputs += [rules.fidelity.output.table, rules.fidelity.output.figure]
        outputs += [
            rules.figure_ncmoe.output.tg.format(ctx=label) for label in CONTEXTS
        ]
        outputs += [rules.matrix.output.matrix, rules.matrix.output.figure]
        outputs += [
            rules.figure_variants.output[0].format(ctx=label) for label in CONTEXTS
        ]
    if CEILINGS:
        outputs.append(rules.ceilings.output[0])
    if RAM_TIER_MODELS:
        outputs.append(rules.ram_tier_table.output.ram_tier)
        outputs += [
            rules.ram_tier.output.figure.format(model=m) for m in RAM_TIER_MODELS
        ]
    if QUANTS:
        outputs += [rules.quants.output.table, rules.quants.output.figure]
    if ROUTING_MODELS:
        outputs.append(rules.routing_table.output.routing)
        outputs += [rules.routing.output.figure.format(model=m) for m in ROUTING_MODELS]
    return outputs


def get_zoo_specs(wildcards):
    """Every model spec: the zoo table summarises the full-size ones and notes which architectures have tiny ones."""
    return sorted(str(p) for p in Path("config/models").glob("*.yaml"))


def get_twin_inputs(wildcards):
    m = model_config(wildcards.model)
    inputs = {"spec": m.twin}
    if m.weights == "random":
        inputs["llamacpp"] = rules.llamacpp.output[0]
    return inputs


def get_tools_manifest():
    """The build our own tools link against: the plain pinned one (see rule llamacpp_tools)."""
    if SETTINGS.llamacpp.bin_dir or SETTINGS.llamacpp.cmake_options:
        return rules.llamacpp_tools.output[0]
    return rules.llamacpp.output[0]


def sweep_values(model, ctx):
    """The n_cpu_moe values benchmarked for one model and context (auto: from the budget checkpoint)."""
    if SETTINGS.sweep.values is not None:  # checked against the layer count at start-up
        return list(SETTINGS.sweep.values)
    budget = checkpoints.budget.get(model=model).output[0]
    return pipeline.sweep_values(
        budget, metadata_path(model), ctx.tokens, SETTINGS.sweep.step
    )


def get_sweep_values(wildcards):
    return sweep_values(wildcards.model, CONTEXTS[wildcards.ctx])


def get_sweep_budget(wildcards):
    """The budget table an auto sweep's n values come from. Ancient: a new table (another context added)
    reruns a sweep only where its n values, a param, changed."""
    if SETTINGS.sweep.values is not None:
        return []
    return ancient(checkpoints.budget.get(model=wildcards.model).output[0])


def bench_files(models, contexts):
    """One record file per model and context: all its n values (none where the sweep is empty)."""
    return [
        rules.bench.output[0].format(model=model, ctx=label)
        for model in models
        for label in contexts
        if sweep_values(model, CONTEXTS[label])
    ]


def get_context_bench(wildcards):
    """Every benchmark record file of one context."""
    return bench_files(BENCH_MODELS, [wildcards.ctx])


def get_model_bench(wildcards):
    """Every benchmark record file of one model, all contexts."""
    return bench_files([wildcards.model], CONTEXTS)


def get_all_bench(wildcards):
    return bench_files(BENCH_MODELS, CONTEXTS)


def from_this_config(path):
    """Whether a file in results/ is this config's: a rule makes it at one of the config's contexts and variants
    (the wildcard constraints) and for one of its models. What an earlier config left there is not.
    """
    for maker in workflow.rules:
        for pattern in maker.output:
            if m := pattern.match(path):
                return m.groupdict().get("model", MODELS[0]) in MODELS
    return False


def results_found():
    """Every result publish takes, by kind, as results/ holds them now."""
    from glob import glob

    return {
        "tables": sorted(glob("results/tables/**/*.csv", recursive=True)),
        "figures": sorted(glob("results/figures/*.png")),
        "records": sorted(glob("results/bench/**/*.jsonl", recursive=True))
        + sorted(glob("results/variants/**/*.jsonl", recursive=True)),
        "metadata": sorted(glob("results/metadata/*.json")),
    }


def get_publish_inputs(wildcards):
    """What this config has run so far: publish works from any subset of the pipeline's outputs."""
    found = {
        kind: [p for p in paths if from_this_config(p)]
        for kind, paths in results_found().items()
    }
    if Path(rules.llamacpp.output[0]).exists():
        found["llamacpp"] = rules.llamacpp.output[0]
    return found


def get_publish_stale(wildcards):
    """The results an earlier config left (another context, model or variant): listed, not published."""
    return sorted(
        p
        for paths in results_found().values()
        for p in paths
        if not from_this_config(p)
    )


def get_publish_missing(wildcards):
    """The pipeline's final outputs that have not been made (listed on the published page)."""
    return sorted(str(p) for p in get_final_outputs() if not Path(p).exists())


def get_publish_captions(wildcards):
    """Each figure's caption: the report() caption its rule names, with the figure's wildcards filled in
    (ncmoe_32k_pp.png: ncmoe_pp.rst for ctx 32k; ram_tier_<model>.png: ram_tier.rst for that model).
    """
    figures = [(f, maker) for maker in workflow.rules for f in maker.output
               if str(f).startswith("results/figures/") and f.flags.get("report")]  # fmt: skip
    captions = {}
    for path in sorted(Path("results/figures").glob("*.png")):
        for pattern, maker in figures:
            if not (m := pattern.match(str(path))):
                continue
            rst = Path(maker.snakefile).parent / str(pattern.flags["report"].caption)
            if rst.exists():
                captions[f"figures/{path.name}"] = pipeline.caption(rst, m.groupdict())
            break
    return captions
