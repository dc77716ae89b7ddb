"""Every architecture moeplace twins, against the pinned llama.cpp: each tiny variant loads and decodes in
llama-bench with the KV and recurrent-state buffers our memory model predicts, each full-size spec's header twin
has the bytes llama-quantize gives the same shapes, and docs/models.md's model-zoo table is current."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys

import pytest
from conftest import ROOT
from llamacpp_helpers import manifest

from moeplace.core.config import LlamacppSettings
from moeplace.model.describe import layer_kinds
from moeplace.model.gguf_file import read_header
from moeplace.model.kvcache import kv_bytes, layer_kv_bytes
from moeplace.model.memory import state_bytes
from moeplace.model.metadata import inspect_model
from moeplace.model.recipe import PRESETS, UNQUANTIZED
from moeplace.model.twin import load_spec, make_twin, tensor_type_args, twin_types, write_twin
from moeplace.runtime.build import Build
from moeplace.runtime.native import cache_root

SPECS = sorted((ROOT / "config/models").glob("*.yaml"))
TINY = [p for p in SPECS if p.name.startswith("tiny-") and load_spec(p).n_expert]
FULL = [p for p in SPECS if not p.name.startswith("tiny-") and load_spec(p).n_expert]
BUFFER = re.compile(r"(KV|RS) buffer size =\s+([\d.]+) MiB")
# llama-quantize's line per tensor: "[ 12/579] blk.0.attn_v.weight - [ 2048, 512, 1, 1], type = f16, ..."
DRY_RUN_LINE = re.compile(r"\]\s+(\S+)\s+- \[.*?type =\s+(\w+), size =[^(\n]*(?:\((\w+)\))?")


def bin_path(tool: str) -> str:
    return str(manifest().bin_dir / tool)


@pytest.mark.llamacpp
@pytest.mark.untimed
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
@pytest.mark.untimed
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
    (tools/published/sweeps.csv, MoEArc's runs)."""
    twin = write_twin(load_spec(ROOT / f"config/models/{spec}.yaml"), tmp_path / "t.gguf")
    assert sum(t.n_bytes for t in read_header(twin).tensors) == model_size


# Gemma 4 26B A4B (config/models/gemma-4-26b-a4b.yaml) against what llama.cpp printed for the published GGUFs.
GEMMA4 = ROOT / "config/models/gemma-4-26b-a4b.yaml"


def test_the_gemma4_26b_header_twin_is_the_published_model(tmp_path):
    twin = write_twin(load_spec(GEMMA4), tmp_path / "gemma4.gguf")
    header, meta = read_header(twin), inspect_model(twin)
    # "loaded meta data with 50 key-value pairs and 658 tensors" (LostRuins/koboldcpp#2262, its UD-Q4_K_XL GGUF)
    assert len(header.tensors) == 658
    # llama-bench's model_n_params for gemma-4-26B-A4B-it-UD-Q4_K_M.gguf (its -o csv row): 25233142046
    params = sum(math.prod(t.shape) for t in header.tensors)
    assert params == 25_233_142_046
    # the model card (as quoted in anomalyco/models.dev#1328): 25.2B total, 3.8B active (8 of 128 experts)
    expert_params = sum(math.prod(t.shape) for t in header.tensors if "_exps" in t.name)
    assert round(params / 1e9, 1) == 25.2 and round((params - expert_params * 120 / 128) / 1e9, 1) == 3.8
    # print_info: n_layer 30, n_expert 128, n_expert_used 8, n_swa 1024; sliding_window_pattern [true x 5, false, ...]
    assert (meta.n_layer, meta.n_expert, meta.n_expert_used, meta.n_ff_exp) == (30, 128, 8, 704)
    assert meta.attention.sliding_window == 1024
    assert [layer.swa for layer in meta.layers] == [il % 6 != 5 for il in range(30)]
    assert layer_kinds(meta) == {"attention": 5, "sliding-window": 25, "recurrent": 0, "MoE": 30, "dense": 30}
    # "gemma4 26B.A4B Q4_K - Medium | 15.63 GiB | 25.23 B" (llama-bench on lmstudio-community's Q4_K_M)
    assert round(meta.total_bytes / 2**30, 2) == 15.63
    # Expert bytes at Q4_K_M: gate_up Q4_K in all 30 layers; down (704-element rows, not whole 256-element K
    # blocks: llama-quantize's fallback) Q8_0 for Q6_K in its 14 "more bits" layers (0-2, 5, 8, ..., 23, 26-29),
    # Q5_0 for Q4_K in the other 16; the per-expert scales F32.
    gate_up, down = 2816 * 1408 * 128, 704 * 2816 * 128
    assert meta.expert_bytes == 30 * gate_up // 256 * 144 + (14 * 34 + 16 * 22) * down // 32 + 30 * 128 * 4
    # llama-server -c 8192 -ub 2048 on a gemma-4-26B-A4B GGUF (b9849): "creating non-SWA KV cache, size = 8192
    # cells ... KV buffer size = 160.00 MiB", "creating SWA KV cache, size = 3072 cells ... 600.00 MiB"
    per_layer = layer_kv_bytes(meta, 8192, n_ubatch=2048)
    full = sum(b for b, layer in zip(per_layer, meta.layers) if not layer.swa)
    assert (full, sum(per_layer) - full) == (160 * 2**20, 600 * 2**20)


def pinned_llamacpp() -> Build:
    """The pinned llama.cpp build where one is already built here (this test does not start a 5-15 minute build)."""
    builds = cache_root() / "llama.cpp"
    if not any(builds.glob(f"{LlamacppSettings().version}-*/manifest.json")):
        pytest.skip(f"no llama.cpp {LlamacppSettings().version} built under {builds} (moeplace builds it on first use)")
    return manifest()


@pytest.mark.llamacpp
@pytest.mark.untimed
def test_the_tiny_gemma4_quantizes_loads_and_generates_as_its_spec_says(tmp_path):
    """llama-quantize's Q4_K_M of the random tiny twin, generating 8 tokens in llama-completion; llama.cpp reads the
    layout the spec gives: five sliding layers of 64-wide heads and 2 KV heads, then a full one of 128 and 1."""
    build = pinned_llamacpp()
    spec = ROOT / "config/models/tiny-gemma4.yaml"
    model = make_twin(load_spec(spec), tmp_path / "tiny.gguf", "random", "Q4_K_M", 0, build, tmp_path / "q.log")
    # llama-completion logs from a thread that the process does not wait for at exit (llama.cpp#22142), so the last
    # lines, the timings with them, can be lost with exit code 0. The busier the cores, the likelier: with its two
    # threads on this 2-core VM, 37 of 40 runs lost them; with one, 0 of 60 here, and 1 in ~15 CI runs. A few tries.
    cmd = [str(build.bin_dir / "llama-completion"), "-m", str(model), "-n", "8", "-p", "Hello", "-no-cnv",
           "--no-warmup", "--temp", "0", "-t", "1", "-v"]  # fmt: skip
    for _ in range(5):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        if re.search(r"eval time =.*/\s+8 runs", out.stderr):
            break
    else:
        pytest.fail(f"llama-completion logged no timings for 8 generated tokens in 5 runs: {out.stderr[-2000:]}")
    printed = dict(re.findall(r"print_info: ([\w ]+?)\s+= (.+)", out.stderr))
    assert {k: printed[k] for k in ("n_layer", "n_head_kv", "n_embd_head_k", "n_embd_head_k_swa", "n_swa")} == {
        "n_layer": "6",
        "n_head_kv": "[2, 2, 2, 2, 2, 1]",
        "n_embd_head_k": "128",
        "n_embd_head_k_swa": "64",
        "n_swa": "128",
    }
    assert (printed["n_expert"], printed["n_expert_used"], printed["n_ff"]) == ("8", "2", "256")
    params = sum(math.prod(t.shape) for t in read_header(model).tensors)
    assert printed["model params"] == f"{params / 1e6:.2f} M"
