"""Every architecture moeplace twins, against the pinned llama.cpp: each tiny variant loads and decodes in
llama-bench with the KV and recurrent-state buffers our memory model predicts, each full-size spec's header twin
has the bytes llama-quantize gives the same shapes, and docs/models.md's model-zoo table is current."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from llamacpp_helpers import manifest

from moeplace.model.gguf_file import read_header
from moeplace.model.kvcache import kv_bytes
from moeplace.model.memory import state_bytes
from moeplace.model.metadata import inspect_model
from moeplace.model.recipe import PRESETS, UNQUANTIZED
from moeplace.model.twin import load_spec, tensor_type_args, twin_types, write_twin

SPECS = sorted((ROOT / "config/models").glob("*.yaml"))
TINY = [p for p in SPECS if p.name.startswith("tiny-") and load_spec(p).n_expert]
FULL = [p for p in SPECS if not p.name.startswith("tiny-") and load_spec(p).n_expert]
BUFFER = re.compile(r"(KV|RS) buffer size =\s+([\d.]+) MiB")
# llama-quantize's line per tensor: "[ 12/579] blk.0.attn_v.weight - [ 2048, 512, 1, 1], type = f16, ..."
DRY_RUN_LINE = re.compile(r"\]\s+(\S+)\s+- \[.*?type =\s+(\w+), size =[^(\n]*(?:\((\w+)\))?")


def bin_path(tool: str) -> str:
    return str(Path(manifest()["bin_dir"]) / tool)


@pytest.mark.llamacpp
@pytest.mark.parametrize("spec", TINY, ids=lambda p: p.stem)
def test_the_tiny_variant_decodes_with_the_kv_and_state_we_predict(spec, tmp_path):
    model = write_twin(load_spec(spec), tmp_path / "tiny.gguf", "random")
    cmd = [bin_path("llama-bench"), "-m", str(model), "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "jsonl", "-v"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(r["avg_ts"] > 0 for r in rows)
    first_context = out.stderr.split("constructing llama_context")[1]  # llama-bench makes one per test
    n_ctx = int(re.search(r"n_ctx\s+= (\d+)", first_context)[1])
    printed = {"KV": 0.0, "RS": 0.0}
    for kind, mib in BUFFER.findall(first_context):  # an interleaved-SWA model prints two KV caches
        printed[kind] += float(mib)
    meta = inspect_model(model)
    ours = {"KV": kv_bytes(meta, n_ctx) / 2**20, "RS": state_bytes(meta) / 2**20}
    assert printed == pytest.approx(ours, abs=0.011), (printed, ours)


@pytest.mark.llamacpp
@pytest.mark.parametrize("spec", FULL, ids=lambda p: p.stem)
def test_the_header_twin_has_llama_quantizes_types_for_every_preset(spec, tmp_path):
    """Every llama-quantize preset (Q2_K .. Q8_0, IQ1_S .. IQ4_XS, TQ, MXFP4_MOE) on an F16 header twin, with the
    spec's tensor_types as --tensor-type: llama-quantize --dry-run's type for each tensor is ours."""
    twin = load_spec(spec)
    f16 = write_twin(dataclasses.replace(twin, ftype="F16", tensor_types={}), tmp_path / "f16.gguf")
    overrides = tensor_type_args(twin.tensor_types)
    for preset in [p for p, qtype in PRESETS.items() if qtype not in UNQUANTIZED]:
        cmd = [bin_path("llama-quantize"), "--dry-run", *overrides, str(f16), preset]
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        theirs = {m[1]: (m[3] or m[2]).upper() for m in DRY_RUN_LINE.finditer(out.stdout + out.stderr)}
        ours = {name: qtype.name for name, qtype in twin_types(dataclasses.replace(twin, ftype=preset)).items()}
        assert ours == theirs, (preset, {n: (t, theirs.get(n)) for n, t in ours.items() if theirs.get(n) != t})
    size = float(re.search(r"quant size\s+=\s+([\d.]+) MiB", out.stdout + out.stderr)[1])
    print(f"{spec.stem}: {len(PRESETS) - len(UNQUANTIZED)} presets, every tensor's type as llama-quantize's; "
          f"{preset} {size:.0f} MiB")  # fmt: skip


def test_the_model_zoo_page_is_what_the_specs_give():
    done = subprocess.run([sys.executable, str(ROOT / "docs/model_zoo.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("spec", "model_size"), [("gpt-oss-20b", 12_096_558_336), ("gpt-oss-120b", 63_374_323_968)])
def test_a_type_map_copies_a_published_files_mix_to_the_byte(spec, model_size, tmp_path):
    """MXFP4 experts and Q8_0 elsewhere: the model_size llama-bench printed for ggml-org's gpt-oss GGUFs
    (tests/data/published/sweeps.csv, MoEArc's runs)."""
    twin = write_twin(load_spec(ROOT / f"config/models/{spec}.yaml"), tmp_path / "t.gguf")
    assert sum(t.n_bytes for t in read_header(twin).tensors) == model_size
