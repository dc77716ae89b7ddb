"""Every setting's default is written once, in the config schema (src/moeplace/core/config.schema.yaml): the typed
settings, the command line and the pinned llama.cpp take it from there, and none of them writes it again. The
Snakefile's start-up (moeplace.cli.pipeline) reads the config once, leaves it as given and reads each file the
DAG needs once."""

from __future__ import annotations

import ast
import copy
import json
from dataclasses import fields

import pandas as pd
import yaml
from conftest import ROOT

from moeplace.cli import build_parser, pipeline
from moeplace.core.config import (
    SCHEMA_PATH,
    BenchSettings,
    LlamacppSettings,
    ModelEntry,
    default,
    params,
    parse_settings,
)
from moeplace.core.config_schema import validate_config
from moeplace.measure.placement import VARIANTS
from moeplace.plan.request import Request

SRC = ROOT / "src/moeplace"
DEFAULT_CONFIG = yaml.safe_load((ROOT / "config/config.yaml").read_text())

# (object, its default, the schema's setting): each pair is one setting read in two places
TYPED = [
    *[
        (BenchSettings, f, s)
        for f, s in [
            ("type_k", "cache_type_k"),
            ("type_v", "cache_type_v"),
            ("noisy_cv", "bench.noisy_cv"),
            ("precision", "bench.precision"),
            ("time_budget_s", "bench.time_budget_s"),
            ("ubatch", "ubatch"),
            ("flash_attn", "flash_attn"),
        ]
    ],
    *[(ModelEntry, f, f"models.*.{f}") for f in ("weights", "quant", "seed", "bench")],
    *[
        (Request, f, s)
        for f, s in [
            ("type_k", "cache_type_k"),
            ("type_v", "cache_type_v"),
            ("ubatch", "ubatch"),
            ("flash_attn", "flash_attn"),
        ]
    ],
]
# (subcommand, option's dest, the schema's setting)
OPTIONS = [
    *[
        (cmd, dest, s)
        for cmd in ("recommend", "tune", "predict")
        for dest, s in [("ubatch", "ubatch"), ("cache_type_k", "cache_type_k"), ("cache_type_v", "cache_type_v")]
    ],
    ("recommend", "flash_attn", "flash_attn"),
    ("tune", "flash_attn", "flash_attn"),
    ("tune", "safety_layers", "tune.safety_layers"),
    ("tune", "threads", "bench.threads"),
    ("tune", "device", "device.kind"),
    ("doctor", "backend", "llamacpp.backend"),
    ("twin", "seed", "models.*.seed"),
]
# Defaults in the typed settings that are not the config's, on purpose: what a run outside the pipeline gets.
NOT_THE_CONFIGS = {
    "max_repetitions": "0: exactly `repetitions` (the config's bench.max_repetitions applies to auto only)",
    "quiet_wait_s": "a probe outside the pipeline starts at once",
    "host_slowdown": "1: a device outside the pipeline is not slowed",
}


def _subparser(name: str):
    actions = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them here
    return actions[name]


def test_every_default_read_elsewhere_is_the_schemas():
    for cls, name, setting in TYPED:
        assert {f.name: f.default for f in fields(cls)}[name] == default(setting), (cls.__name__, name)
    for command, dest, setting in OPTIONS:
        assert _subparser(command).get_default(dest) == default(setting), (command, dest)
    pinned = LlamacppSettings()
    assert (pinned.version, pinned.sha256) == (default("llamacpp.version"), default("llamacpp.sha256"))


def _literal_defaults(path):
    """(name, line) of every default written as a literal: an argparse `default=` and a dataclass field's value."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            option = next((a.value for a in node.args if isinstance(a, ast.Constant)), "")
            for kw in node.keywords:
                if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                    yield option.lstrip("-").replace("-", "_"), node.lineno
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.value, ast.Constant | ast.UnaryOp):
                    if getattr(item.value, "value", 0) is not None:
                        yield item.target.id, item.lineno


def test_no_default_of_a_setting_is_written_twice():
    """The modules that read settings write none of their defaults themselves (the schema's are the only ones)."""
    commands = {"cli/__init__.py": ("tune", "predict", "doctor", "twin"), "cli/recommend.py": ("recommend",)}
    for module, names in commands.items():
        shared = {dest for command, dest, _ in OPTIONS if command in names}
        assert [(n, line) for n, line in _literal_defaults(SRC / module) if n in shared] == [], module
    shared = {name for cls, name, _ in TYPED if cls is Request}
    assert [(n, line) for n, line in _literal_defaults(SRC / "plan/request.py") if n in shared] == []
    typed = list(_literal_defaults(SRC / "core/config.py"))
    assert [name for name, _ in typed if name not in NOT_THE_CONFIGS] == []
    assert "512" not in (SRC / "runtime/llamacpp_args.py").read_text()
    assert LlamacppSettings().sha256 not in (SRC / "runtime/llamacpp.py").read_text()


def test_the_schema_is_one_file_the_workflow_links_to():
    link = ROOT / "workflow/schemas/config.schema.yaml"
    assert link.is_symlink() and link.resolve() == SCHEMA_PATH.resolve()


def test_rule_params_are_the_configs_own_sections():
    """The sections passed whole to a rule keep the values (and so Snakemake's rerun triggers) they had raw."""
    cfg = validate_config(copy.deepcopy(DEFAULT_CONFIG))
    settings = parse_settings(cfg)
    assert params(settings.budget_check) == cfg["budget_check"]
    assert params(settings.llamacpp) == cfg["llamacpp"]
    assert settings.sweep.values is None and settings.sweep.step == cfg["bench"]["sweep_step"]
    assert {name: params(m) for name, m in settings.models.items()} == {
        name: {"name": name, "gguf": None, "twin": None, "constants": None} | m for name, m in cfg["models"].items()
    }


def test_start_reads_the_default_config_once_and_leaves_it_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the run's directory
    given = copy.deepcopy(DEFAULT_CONFIG)
    run = pipeline.start(given, tmp_path, main_process=False)
    assert given == DEFAULT_CONFIG
    assert run.bench_models == run.weight_models == ["tiny-qwen3moe", "tiny-gpt-oss"]
    assert run.file_models == [*run.bench_models, "tiny-deepseek2"] == run.budget_check_models
    assert run.quants_model == "tiny-qwen3moe" and run.quants and run.ceilings and run.variants == VARIANTS
    assert run.plain_config["bench"]["precision"] == default("bench.precision")  # the published config: filled


def test_a_caption_is_filled_as_snakemakes_report_fills_it():
    text = pipeline.caption(ROOT / "workflow/report/ncmoe.rst", {"ctx": "32k"})
    assert "at context 32k" in text and "{{" not in text
    assert "{{" not in pipeline.caption(ROOT / "workflow/report/ncmoe.rst", {})


def test_an_auto_sweep_reads_its_budget_table_once(tmp_path):
    budget, meta = tmp_path / "budget.csv", tmp_path / "meta.json"
    pd.DataFrame({"ctx": [4096, 32768], "n_cpu_moe": [0, 2], "status": ["ok", "ok"]}).to_csv(budget, index=False)
    meta.write_text(json.dumps({"n_layer": 8}))
    before = pipeline._budget_and_layers.cache_info().misses  # noqa: SLF001 - the cache is what is tested
    assert pipeline.sweep_values(str(budget), str(meta), 32768, 0) == [1, 2, 3, 5, 8]
    assert pipeline.sweep_values(str(budget), str(meta), 4096, 0) == [0, 1, 4, 8]
    assert pipeline.sweep_values(str(budget), str(meta), 65536, 0) == []
    assert pipeline._budget_and_layers.cache_info().misses == before + 1  # noqa: SLF001
