"""moeplace as a library: the README's example runs and gives what the command line prints; the layers under the
command line print nothing; the library, `recommend --json` and the pipeline's budget stage answer one question
the same way over generated requests."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moeplace
from moeplace.core.errors import MoeplaceError

PACKAGE = ROOT / "src" / "moeplace"


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```python\n(import moeplace.*?)```", text, re.DOTALL)
    return block


def _cli_json(cwd, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "recommend", *args, "--json"], cwd=cwd,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_the_readmes_example_prints_what_recommend_prints(qwen3_twin, tmp_path):
    (tmp_path / "qwen3.gguf").symlink_to(qwen3_twin)
    done = subprocess.run([sys.executable, "-c", _readme_example()], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    card = ("--card", "RTX 4070 Ti SUPER", "-ctk", "q8_0", "-ctv", "q8_0")
    plans = _cli_json(tmp_path, "qwen3.gguf", "--ctx", "8192,32768", *card)
    for i, p in enumerate(plans):  # the library's n, KV bytes and line are the command's, context by context
        ctx, n, kv, _ = lines[2 * i].split()
        assert (int(ctx), int(n), int(kv)) == (p["ctx"], p["n_cpu_moe"], p["kv_bytes"])
        assert lines[2 * i + 1] == p["command"] == p["commands"]["server"]
        assert f"--n-cpu-moe {n} " in p["command"] and "--cache-type-k q8_0" in p["command"]
    assert lines[4] == "768 MiB kept free; every context fits: True"  # CUDA's default margin (core/backends.py)


def test_a_bad_option_is_one_line_not_a_traceback(qwen3_twin):
    with pytest.raises(MoeplaceError, match="no option 'ctx_size'"):
        moeplace.recommend(str(qwen3_twin), ctx=8192, card="RTX 3060 12GB", ctx_size=4)
    with pytest.raises(MoeplaceError, match="--cache-type-k q9"):
        moeplace.recommend(str(qwen3_twin), ctx=8192, card="RTX 3060 12GB", type_k="q9")


# Where output to a person belongs: the command line and the report. The pipeline's scripts print through
# runtime/outputs.stage, which ends a stage with its one line (sys.exit with the message, not a print).
PRINTING = ("cli", "report")


def _prints(path) -> list[int]:
    """Lines of a module that print or write to stdout/stderr."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr"):
            if isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(node.lineno)
    return found


def test_only_the_command_line_and_the_report_print():
    offenders = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in PRINTING and (lines := _prints(path))
    }
    assert offenders == {}
    assert _prints(PACKAGE / "cli" / "recommend.py")  # the check can see a print where there is one


# One answer: the same card, model and request through the pipeline's budget stage, `recommend --json` and the
# library give one n for llama-bench (what the sweep runs) and keep the same bytes free.
SPECS = ("qwen3-coder-30b-a3b", "gpt-oss-20b", "glm-4.5-air", "gemma-4-26b-a4b", "nemotron-3-nano-30b-a3b")
CARD_NAMES = ("RTX 3060 12GB", "RTX 4070 Ti SUPER", "RTX 4090", "RX 7900 XTX", "RTX 5090", "RTX 3090")


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, str]:
    from moeplace.model.twin import load_spec, write_twin

    folder = tmp_path_factory.mktemp("twins")
    return {name: str(write_twin(load_spec(ROOT / f"config/models/{name}.yaml"), folder / f"{name}.gguf"))
            for name in SPECS}  # fmt: skip


def _stage_budget(path: str, card_name: str, ctx: int, ubatch: int, flash_attn: str, kv: str) -> dict:
    """The budget stage's row for this card as the stage plans it (plan/budget.py's StageDevice, device.margin
    auto), with the estimate for the compute buffer where the stage asks llama.cpp."""
    from moeplace.core.config import Device
    from moeplace.model.metadata import inspect_model
    from moeplace.plan.budget import StageDevice, budget_table
    from moeplace.plan.cards import card_named

    card = card_named(card_name)
    on = StageDevice(Device(card.memory_bytes, None).for_backend(card.backend), card.backend, None)
    table = budget_table(inspect_model(path), on.device, [on.workload(ctx, ubatch, flash_attn, kv, kv)], on.compute)
    return table.iloc[0].to_dict()


@settings(max_examples=210, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.sampled_from(SPECS),
    card=st.sampled_from(CARD_NAMES),
    ctx=st.sampled_from([4096, 16384, 32768, 65536, 131072]),
    ubatch=st.sampled_from([256, 512, 2048]),
    kv=st.sampled_from(["f16", "q8_0", "q4_0"]),
)
def test_the_pipeline_recommend_and_the_library_give_one_answer(twins, capsys, spec, card, ctx, ubatch, kv):
    from moeplace.cli import main

    path, flash = twins[spec], "on" if kv != "f16" else "auto"
    row = _stage_budget(path, card, ctx, ubatch, flash, kv)
    args = ["--card", card, "--ctx", str(ctx), "--ubatch", str(ubatch), "-ctk", kv, "-ctv", kv, "--flash-attn", flash]
    main(["recommend", path, *args, "--json"])
    (cli,) = json.loads(capsys.readouterr().out)
    (lib,) = moeplace.recommend(path, ctx=ctx, card=card, ubatch=ubatch, type_k=kv, type_v=kv, flash_attn=flash).plans
    stage_n = None if row["n_cpu_moe"] is None or row["n_cpu_moe"] != row["n_cpu_moe"] else int(row["n_cpu_moe"])
    assert cli["margin_bytes"] == lib["margin_bytes"] == row["margin_bytes"]
    if cli["n_cpu_moe"] is None:  # nothing fits the server: nor llama-bench, which needs more
        assert stage_n is None and lib["n_cpu_moe"] is None
        return
    assert cli["n_cpu_moe_by_tool"] == lib["n_cpu_moe_by_tool"]
    assert cli["n_cpu_moe_by_tool"]["bench"] == stage_n
    assert cli["n_cpu_moe_by_tool"]["server"] == cli["n_cpu_moe"] == lib["n_cpu_moe"]


def test_every_emit_format_is_one_record_with_its_renderer():
    from moeplace.cli.recommend_text import RENDERERS
    from moeplace.plan.emit_formats import NAMES

    assert set(RENDERERS) == set(NAMES)
    assert _choices("--emit") == NAMES


def _choices(flag: str) -> tuple[str, ...]:
    from moeplace.cli import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None))
    return tuple(next(a for a in sub.choices["recommend"]._actions if flag in a.option_strings).choices)
