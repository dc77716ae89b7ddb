"""recommend's default margins against real cards' published out-of-memory boundaries (tests/data/real_cards.yaml:
the lowest --n-cpu-moe that ran and the one that failed, llama-bench runs on an RTX 4070 Ti SUPER and an Arc
B580): the answer is never on the out-of-memory side, and says the boundary itself where the data allows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import moeplace
from conftest import ROOT

from moeplace.core.backends import margin_bytes
from moeplace.model.twin import load_spec, write_twin

BOUNDARIES = yaml.safe_load((ROOT / "tests/data/real_cards.yaml").read_text())["boundaries"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[tuple[str, str | None], Path]:
    import dataclasses

    folder, made = tmp_path_factory.mktemp("twins"), {}
    for b in BOUNDARIES:
        key = (b["spec"], b.get("quant"))
        if key not in made:
            spec = load_spec(ROOT / b["spec"])
            spec = dataclasses.replace(spec, ftype=b["quant"]) if b.get("quant") else spec
            made[key] = write_twin(spec, folder / f"twin{len(made)}.gguf")
    return made


def minimum_n(model: Path, b: dict, vram_mib: int, *extra: str) -> int:
    args = ["recommend", str(model), "--vram", f"{vram_mib}MiB", "--backend", b["backend"], "--ctx", str(b["ctx"]),
            "--json", "--flash-attn", b.get("flash_attn", "auto"), "--cache-type-k",
            b.get("type_k", "f16"), "--cache-type-v", b.get("type_v", "f16"), *extra]  # fmt: skip
    out = moeplace(*args)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)[0]  # the boundaries are llama-bench's: its n, which may be one past the server's
    return plan["n_cpu_moe_by_tool"]["bench"] if plan["n_cpu_moe"] is not None else None


def test_default_margins_never_fall_on_the_out_of_memory_side_of_a_published_boundary(twins):
    exact, cases = 0, 0
    for b in BOUNDARIES:
        model = twins[(b["spec"], b.get("quant"))]
        answers = [minimum_n(model, b, b["vram_nominal"])]  # the card's size, the default margin
        if "free_at_load" in b:  # its free memory, the margin --vram auto takes
            margin_mib = margin_bytes(b["backend"], against_free=True) >> 20
            answers.append(minimum_n(model, b, b["free_at_load"], "--margin", str(margin_mib)))
        for n in answers:
            cases += 1
            assert n > b["failed"], (b["setup"], b["ctx"], n, b["failed"])
            exact += n <= b["ran"]
    print(f"default margins at {cases} published boundaries: {exact} exact, none on the out-of-memory side")
    assert exact >= cases - 2
