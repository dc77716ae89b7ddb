"""Issue #56: the GPU path on a real Vulkan device with no GPU under it, Mesa's lavapipe (llamacpp.backend: lavapipe).

The pinned llama.cpp built with Vulkan (its own cache entry, the pinned patch applied), lavapipe as Vulkan0: doctor
names it as software, -ot placements land on Vulkan0 and the host as the load log says, `explain` reads that log,
lavapipe shown as a card of the configured size (native/vkcap.c) refuses a buffer past it on a card's error path,
`recommend --vram auto` reads the device, and the example config's sweep, memory check and budget check run on
Vulkan0 through the real Snakefile.
Skipped, with the reason, where lavapipe or the Vulkan build tools are missing (tests/test_vulkan_unit.py needs none).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

from moeplace.core.config import DeviceTarget, LlamacppSettings, validate_config
from moeplace.core.errors import MoeplaceError
from moeplace.runtime.backend import detect
from moeplace.runtime.build import Build
from moeplace.runtime.llama_buffers import parse_buffers
from moeplace.runtime.llama_log import read_log
from moeplace.runtime.llamacpp import provision, require_binary
from moeplace.runtime.vulkan import PATCH

EXAMPLE = yaml.safe_load((ROOT / "config/examples/software-gpu.yaml").read_text())
MOEPLACE = str(Path(sys.executable).with_name("moeplace"))
LOG = Path("/tmp/moeplace-test-lavapipe.log")


def _missing() -> str | None:
    try:
        detect("lavapipe")
    except MoeplaceError as err:
        return str(err)
    return None


pytestmark = [pytest.mark.vulkan, pytest.mark.skipif(bool(_missing()), reason=f"no lavapipe here: {_missing()}")]


@cache
def manifest() -> Build:
    """The lavapipe build (built once per machine, ~7-8 min at -j2, cached under ~/.cache/moeplace)."""
    cfg = validate_config(EXAMPLE, ROOT / "workflow/schemas/config.schema.yaml")
    return provision(LlamacppSettings(**cfg["llamacpp"]), LOG, jobs=2)


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> Path:
    """The tiny qwen3moe twin (random Q4_K_M weights, ~35 MB), quantized by the lavapipe build's llama-quantize."""
    from moeplace.model.twin import load_spec, make_twin

    folder = tmp_path_factory.mktemp("lavapipe-twin")
    spec = load_spec(ROOT / "config/models/tiny-qwen3moe.yaml")
    return make_twin(spec, folder / "tiny-qwen3moe.gguf", "random", "Q4_K_M", 0, manifest(), folder / "q.log")


def test_the_vulkan_build_is_its_own_cache_entry_and_sees_lavapipe_as_vulkan0():
    m = manifest()
    assert m.backend == "lavapipe" and "-DGGML_VULKAN=ON" in m.cmake_options
    assert m.patches == (PATCH["sha256"],) and m.env == {"GGML_VK_VISIBLE_DEVICES": "0"}
    assert m.gpu_devices[0].startswith("Vulkan0: llvmpipe") and m.software_device
    assert m.mesa.startswith("Mesa ")
    doctor = subprocess.run([MOEPLACE, "doctor", "--backend", "lavapipe", "--json"], capture_output=True, text=True)
    found = json.loads(doctor.stdout)
    assert found["name"] == "lavapipe" and "software" in found["reason"] and "not a GPU" in found["reason"]
    assert [d["software"] for d in found["devices"]] == [True] and "llvmpipe" in found["devices"][0]["name"]


def _completion(twin: Path, log: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [str(require_binary(manifest(), "llama-completion")), "-m", str(twin), "-ngl", "99", "-c", "4096"]
    cmd += ["-fa", "off", "-n", "4", "-p", "Hello", "-no-cnv", "--no-warmup", "-fit", "off", "--temp", "0", "-v"]
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=600, env=env)
    log.write_text(done.stderr)
    return done


def test_ot_placements_land_on_vulkan0_and_the_host_and_explain_reads_the_log(twin, tmp_path):
    log = tmp_path / "completion.log"
    done = _completion(twin, log, "-ot", r"blk\.[0-2]\.ffn_(up|down|gate)_exps=CPU")
    assert done.returncode == 0, done.stderr[-3000:]
    report = read_log(done.stderr)
    pinned = {f"blk.{i}.ffn_{p}_exps.weight" for i in range(3) for p in ("up", "down", "gate")}
    assert report.overridden == dict.fromkeys(pinned, "Vulkan_Host")  # as on a card: pinned host memory
    buffers = parse_buffers(done.stderr)[-1]
    assert {"weights", "kv", "compute"} <= set(buffers.device("Vulkan0")), buffers.sizes
    assert "compute" in buffers.sizes["Vulkan_Host"] and "weights" in buffers.sizes["CPU_Mapped"]
    explained = subprocess.run([MOEPLACE, "explain", str(log), "--json"], capture_output=True, text=True)
    assert explained.returncode == 0, explained.stderr
    account = json.loads(explained.stdout)
    assert account["backend"] == "vulkan" and list(account["devices"]) == ["Vulkan0"] and account["status"] == "ok"
    assert account["experts_on_host"]["layer_list"] == [0, 1, 2]
    assert account["devices"]["Vulkan0"]["free_at_load"] == 2048.0  # the reported heap, whatever the size given


def test_a_buffer_past_the_configured_size_is_refused_on_the_cards_error_path(twin, tmp_path):
    from moeplace.runtime.allocation import load_probe
    from moeplace.runtime.device import attached, device_setup

    args = ["-c", "4096", "-fa", "off"]
    setup = device_setup(DeviceTarget("gpu", "", 30 * 10**6), manifest())
    assert "lavapipe (Mesa's CPU Vulkan), not a GPU" in setup.label and setup.cap_bytes == 30 * 10**6
    with attached(setup, manifest(), None, tmp_path / "probe.log"):
        model_too_big = load_probe(manifest(), str(twin), args, 0, None, tmp_path / "model.log")
        too_big = load_probe(manifest(), str(twin), args, 4, None, tmp_path / "full.log")
        fits = load_probe(manifest(), str(twin), args, 8, None, tmp_path / "fits.log")
    unlimited = load_probe(manifest(), str(twin), args, 0, None, tmp_path / "unlimited.log")
    assert model_too_big[0] == too_big[0] == "oom" and fits[0] == "ok"
    assert unlimited[0] == "ok"  # Mesa itself enforces nothing
    refused = (tmp_path / "full.log").read_text()  # the weights and KV cache fit; the compute buffer does not
    assert "vkcap: out of device memory" in refused and "ggml_vulkan: Device memory allocation of size" in refused
    for log in ("model.log", "full.log"):  # llama.cpp's own out-of-memory lines, as on a full card
        text = (tmp_path / log).read_text()
        assert read_log(text).oom is not None and "failed to allocate Vulkan0 buffer of size" in text
    assert read_log((tmp_path / "fits.log").read_text()).free_at_load == {"Vulkan0": 28 * 2**20}  # the size given
    assert sum(fits[1].device("Vulkan0").values()) <= setup.cap_bytes
    assert "Vulkan_Host" in fits[1].sizes  # host buffers are host memory, as on a card: not counted


def test_recommend_vram_auto_reads_lavapipe_where_ggml_vk_visible_devices_names_it(twin):
    env = {**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"}
    cmd = [MOEPLACE, "recommend", str(twin), "--vram", "auto", "--ctx", "4096", "--backend", "vulkan"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert re.search(r"llvmpipe .*software: not a GPU.*vulkaninfo", done.stdout), done.stdout
    unnamed = subprocess.run(cmd, capture_output=True, text=True, env={k: v for k, v in env.items()
                                                                       if k != "GGML_VK_VISIBLE_DEVICES"})  # fmt: skip
    assert unnamed.returncode != 0 and "Traceback" not in unnamed.stderr


def test_the_example_config_sweeps_checks_memory_and_budgets_on_vulkan0(tmp_path):
    """config/examples/software-gpu.yaml through the real Snakefile: one below the budget's minimum runs out of
    memory, the minimum loads; every record names lavapipe; the memory check and the budget check compare the
    plan's Vulkan0 buffers with llama.cpp's. At its smallest that proves it: 1K on 32 MB, where the minimum is 4 as
    at the example's 4K on 42 MB (lavapipe fills a 4K depth without flash attention in ~100 s, a 1K one in a few),
    and one below the minimum, the minimum and all layers, one repetition each (what is asserted is where buffers
    land, not speed)."""
    grid = {"contexts": [1024], "ubatch": [512], "cache_types": ["f16"], "flash_attn": ["off"], "depth_checks": 0}
    smallest = {**EXAMPLE["bench"], "repetitions": 1, "sweep_step": 8}
    device = {**EXAMPLE["device"], "vram": "32MB"}
    wd = workflow_copy(
        tmp_path, {**EXAMPLE, "contexts": [1024], "device": device, "bench": smallest, "budget_check": grid}
    )
    run = snakemake(wd, "results/figures/ncmoe_1k.png", "results/tables/memory_check.csv", "budget_check",
                    timeout=2400)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    budget = pd.read_csv(wd / "results/tables/budget/tiny-qwen3moe.csv").iloc[0]
    n_min = int(budget.n_cpu_moe)
    measured = pd.read_csv(wd / "results/tables/measured/1k.csv")
    tg = measured[measured.test == "tg"].set_index("n_cpu_moe")
    assert n_min > 0 and tg.loc[n_min, "status"] == "ok" and tg.loc[n_min - 1, "status"] == "oom"
    assert tg.device.str.contains("lavapipe (Mesa's CPU Vulkan), not a GPU", regex=False).all()
    records = [json.loads(line) for line in (wd / "results/bench/tiny-qwen3moe/1k.jsonl").read_text().splitlines()]
    assert all(set(r["buffers"]) >= {"Vulkan0"} for r in records if r.get("status") == "ok" and r.get("buffers"))
    memory = pd.read_csv(wd / "results/tables/memory_check.csv")  # the plan's Vulkan0 buffers against llama.cpp's
    ok_runs = set(tg.index[tg.status == "ok"])
    assert set(memory.n_cpu_moe) >= ok_runs and set(memory.buffer) == {"weights", "kv", "compute"}
    assert memory.within_tolerance.all()
    check = pd.read_csv(wd / "results/tables/budget_check.csv").iloc[0]  # the budget, the loads, llama-fit-params
    assert check.predicted_n == check.measured_n == check.fit_params_n == n_min and check.status == "ok"
    assert (wd / "results/figures/ncmoe_1k.png").stat().st_size > 20_000


def test_a_draft_model_s_buffers_on_vulkan0_are_the_plan_s(tmp_path):
    """Issue 63 on a Vulkan device: llama-server with the tiny draft twin (-md) beside the tiny MoE twin, half its
    experts on the host: the main model's and the draft's weights and KV caches on Vulkan0 are the plan's, to the
    0.01 MiB llama.cpp prints (the emulated device's check is tests/test_draft_llamacpp.py)."""
    from test_draft_llamacpp import CTX, MODELS, contexts_of, device_of
    from test_recommend_llamacpp import PRINTED, MiB, serve_one_completion

    from moeplace.model.draft import draft_need, read_speculative
    from moeplace.model.kvcache import pad
    from moeplace.model.memory import SERVER, Workload, device_need
    from moeplace.model.metadata import inspect_model
    from moeplace.model.twin import load_spec, write_twin

    model, draft = (str(write_twin(load_spec(MODELS / f"{n}.yaml"), tmp_path / f"{n}.gguf", "random"))
                    for n in ("tiny-qwen3moe", "tiny-draft"))  # fmt: skip
    # flash attention off: Debian 12's lavapipe crashes decoding with it (config/examples/software-gpu.yaml)
    meta, w = inspect_model(model), Workload(CTX, flash_attn="off", outputs=SERVER)
    spec = read_speculative("draft-simple", model, draft)
    n = meta.n_layer // 2
    main, ours = device_need(meta, spec.main(meta, w), n), draft_need(spec, meta, w, n)
    argv = [str(require_binary(manifest(), "llama-server")), "-m", model, "-c", str(CTX), "-ngl", "99"]
    argv += ["--n-cpu-moe", str(n), "--parallel", "1", *w.llama_args()[4:8], *spec.llama_args(draft), "-v", "-t", "1"]
    assert serve_one_completion(argv, tmp_path / "server.log")["tokens_predicted"] == 1
    log = (tmp_path / "server.log").read_text()
    (main_load, main_ctx), (draft_load, draft_ctx) = contexts_of(log, pad(CTX))[-2:]
    assert list(main_load.weights.devices) == ["Vulkan0"] and draft_load is not main_load
    for logged, planned in (
        (device_of(main_load.weights)["weights"], main.weights),
        (device_of(main_ctx)["kv"], main.kv),
        (device_of(draft_load.weights)["weights"], ours.weights),
        (device_of(draft_ctx)["kv"], ours.kv),
    ):
        assert logged / MiB == pytest.approx(planned / MiB, abs=PRINTED), (logged, planned)
