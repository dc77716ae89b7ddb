"""Plans over several devices (plan/devices.py): the layer split as llama.cpp computes it, and the emitted line
loaded by the pinned llama-bench on two capped emulated devices, each device's buffers as llama.cpp logs them."""

from __future__ import annotations

import shlex
import subprocess
import sys
from bisect import bisect_right
from contextlib import ExitStack

import pandas as pd
import pytest
from conftest import ROOT

from moeplace.core.config import Device
from moeplace.model.memory import Workload
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.devices import default_split, minimum_ncmoe, ncmoe_plan, plan_devices

MiB = 2**20


def llamacpp_device_of(il: int, tensor_split: tuple[int, ...], n_layer: int) -> int:
    """llama.cpp's layer split (llama-model.cpp, load_tensors): layer il (the output layer being il = n_layer) goes
    to the first device whose cumulative share of -ts is above il / (n_layer + 1)."""
    total, acc, cumulative = sum(tensor_split), 0, []
    for share in tensor_split:
        acc += share
        cumulative.append(acc / total)
    return bisect_right(cumulative, il / (n_layer + 1))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    spec = load_spec(ROOT / "config/models/qwen3-coder-30b-a3b.yaml")
    return inspect_model(write_twin(spec, tmp_path_factory.mktemp("q") / "q.gguf", "none"))


@pytest.mark.parametrize("sizes", [(24, 12), (16, 16), (12, 8, 8), (10, 6)])
def test_the_layer_split_is_llamacpps_and_each_device_fits(qwen3, sizes):
    """-ts as layer counts puts exactly the planned layers, and the output layer, on each device as llama.cpp's
    formula does; every device keeps its margin; the experts on the host are those no device holds."""
    devices = [Device(gib * 2**30, 768 * MiB) for gib in sizes]
    w = Workload(65536, outputs="server")
    plan = plan_devices(qwen3, devices, w)
    n = qwen3.n_layer
    for d in plan.devices:
        assert [llamacpp_device_of(il, plan.tensor_split, n) for il in range(d.first, d.end)] == [d.index] * (
            d.end - d.first
        )
        assert d.free_bytes >= 0 and set(d.expert_layers) <= set(range(d.first, d.end))
    assert llamacpp_device_of(n, plan.tensor_split, n) == len(devices) - 1  # the output layer
    held = sorted(il for d in plan.devices for il in d.expert_layers)
    assert sorted(held + list(plan.host_expert_layers)) == list(range(n))


@pytest.mark.parametrize("free", [(24, 12), (16, 16), (12, 8, 8), (40, 30), (7, 3)])
def test_llamacpps_own_split_follows_each_devices_free_memory(qwen3, free):
    """With no -ts llama.cpp splits by free memory with the formula -ts uses; 48 layers over 24 and 12 GB: layers
    0-32 (33 < 2/3 of 49) on the first card, by hand."""
    n = qwen3.n_layer
    bounds = default_split(n, list(free))
    edges = [0, *bounds, n]
    for i in range(len(free)):
        assert {llamacpp_device_of(il, free, n) for il in range(edges[i], edges[i + 1])} <= {i}
    if free == (24, 12):
        assert bounds == [33]


def test_ncmoe_across_devices_fills_the_last_device_first(qwen3):
    """--n-cpu-moe takes the first layers' experts, all on the first card: at 64K on 16 + 8 GB the second card runs
    out first, so the lowest -ncmoe keeps more experts on the host than the per-device plan."""
    devices = [Device(16 * 2**30, 768 * MiB), Device(8 * 2**30, 768 * MiB)]
    w = Workload(65536, outputs="server")
    n, at_n = minimum_ncmoe(qwen3, devices, w)
    assert n is not None and at_n.fits and at_n.host_expert_layers == tuple(range(n))
    assert not ncmoe_plan(qwen3, devices, w, n - 1).fits
    assert n > len(plan_devices(qwen3, devices, w).host_expert_layers)


def test_fit_params_rules_naming_rpc_servers_survive_a_restart_on_new_ports():
    from moeplace.runtime.device import bound_rules, portable_rules

    found = r"blk\.4\.ffn_down.*=RPC0[127.0.0.1:41001];blk\.6\.ffn_down.*=CPU"
    portable = portable_rules(found, "127.0.0.1:41000,127.0.0.1:41001")
    assert portable == r"blk\.4\.ffn_down.*=RPC0[#1];blk\.6\.ffn_down.*=CPU"
    assert bound_rules(portable, "127.0.0.1:52000,127.0.0.1:52001") == found.replace("41001", "52001")
    assert portable_rules(found, None) == found and bound_rules(None, "127.0.0.1:1") is None


def test_a_device_that_cannot_hold_its_layers_says_so(qwen3):
    plan = plan_devices(qwen3, [Device(2 * 2**30, 768 * MiB), Device(1 * 2**30, 768 * MiB)], Workload(131072))
    assert any(d.free_bytes < 0 for d in plan.devices)
    done = subprocess.run([sys.executable, "-m", "moeplace.cli", "recommend", str(qwen3.files[0].path),
                           "--vram", "2GiB,1GiB", "--ctx", "131072", "--backend", "cuda"],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    assert "does not fit on these devices even with every expert on the host" in done.stderr


def test_two_cards_decode_as_one_less_a_hop_per_card_boundary(qwen3):
    """recommend --vram 24GB,12GB prints each context's expected decode; the speed model prices a plan over two
    cards as the same placement on one card plus one hop per token (the activations moving on to the next card)."""
    import json

    from moeplace.plan.learned_prior import Machine
    from moeplace.plan.learned_prior import speed_model as learned
    from moeplace.plan.speed import Run

    plan = plan_devices(qwen3, [Device(16 * 10**9, 768 * MiB), Device(8 * 10**9, 768 * MiB)], Workload(32768))
    assert plan.fits and plan.device_hops == 1 and plan.host_expert_layers
    model = learned(qwen3, Machine("cuda", 640.0, 57.6, 31.5, 48.7))
    host = frozenset(plan.host_tensors(qwen3))
    one, two = (model.predict(qwen3, Run(0, 0, "tg", 128, host_tensors=host, device_hops=h))["tok_s"] for h in (0, 1))
    assert 1 / two - 1 / one == pytest.approx(model.tests["tg"].coef["hops"], rel=1e-6)
    cmd = [sys.executable, "-m", "moeplace.cli", "recommend", str(qwen3.files[0].path), "--vram", "16GB,8GB",
           "--ctx", "32768", "--backend", "cuda"]  # fmt: skip
    (printed,) = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    assert printed["speed"]["tg_empty"]["tok_s"] == pytest.approx(two, rel=1e-6)
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "speeds: 640 GB/s and 48.7 TFLOPS on every card, 57.6 GB/s host RAM (moeplace's defaults)" in text
    assert f"expected: decode {two:.1f} tok/s" in text


@pytest.mark.llamacpp
@pytest.mark.untimed
def test_the_emitted_line_loads_on_two_capped_devices_with_the_planned_buffers(tmp_path):
    """recommend --vram 30MB,22MB --emit bench on the tiny twin: the pinned llama-bench, given two emulated devices
    capped at those sizes, loads it and runs; each device's weights and KV cache are the plan's (to the 0.01 MiB
    llama.cpp prints), its compute buffer no larger than the plan's estimate, and every buffer within its cap."""
    from llamacpp_helpers import manifest, rpc_servers, tiny_twin

    from moeplace.runtime.device import rpc_device
    from moeplace.runtime.llama_buffers import parse_buffers

    path = tiny_twin(tmp_path)
    meta = inspect_model(path)
    caps = (30 * 10**6, 22 * 10**6)
    line = subprocess.run([sys.executable, "-m", "moeplace.cli", "recommend", str(path), "--vram", "30MB,22MB",
                           "--ctx", "4096", "--backend", "rpc", "--emit", "bench"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    plan = plan_devices(meta, [Device(c, 0) for c in caps], Workload(4096, outputs="batch"))
    args = shlex.split(line)
    assert args[args.index("-ts") + 1] == "/".join(map(str, plan.tensor_split)) and plan.host_expert_layers
    assert 0 < len(plan.host_expert_layers) < meta.n_layer
    args[0] = str(manifest().bin_dir / "llama-bench")
    args[args.index("-r") + 1] = "1"
    args[args.index("-n") + 1] = "4"
    with ExitStack() as stack:
        endpoints = [stack.enter_context(rpc_device(manifest(), cap, (i % 2,), tmp_path / f"rpc{i}.log"))
                     for i, cap in enumerate(caps)]  # fmt: skip
        done = subprocess.run([*args, "--rpc", ",".join(endpoints), "-v"], capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    assert rpc_servers() == 0
    assert done.returncode == 0, done.stderr[-2000:]
    (load, *_) = parse_buffers(done.stderr)
    for d, endpoint, cap in zip(plan.devices, endpoints, caps):
        logged = next(sizes for name, sizes in load.sizes.items() if name.endswith(f"[{endpoint}]"))
        print(f"device {d.index}: planned weights {d.weights}, KV {d.kv}, compute {d.compute}; logged {logged}")
        for kind, planned in (("weights", d.weights), ("kv", d.kv)):  # llama.cpp prints MiB to two decimals
            assert round(logged[kind] / MiB, 2) == round(planned / MiB, 2), kind
        assert logged["compute"] <= d.compute and sum(logged.values()) <= cap


@pytest.mark.llamacpp
@pytest.mark.untimed
def test_the_budget_grid_on_two_capped_devices_is_exact(tmp_path):
    """check_devices on the tiny qwen3moe twin over two emulated devices capped at 40 and 30 MB, 24 cells (4K to
    32K, ubatch 256 and 512, an f16 or q8_0 cache with flash attention, f16 without): every plan that fits loads,
    each device that leaves experts on the host runs out of memory with one more of them, and every plan that does
    not fit runs out of memory (24 of 24 on both twins, 2026-12-05). The grid holds all three kinds of cell, and a
    plan that keeps every expert on the devices where llama.cpp's pipelined buffers would not fit."""
    from llamacpp_helpers import manifest, rpc_servers, tiny_twin

    from moeplace.measure.budget_check import CheckedModel, check_devices, grid

    path = tiny_twin(tmp_path)
    workloads = [w for w in grid([4096, 8192, 16384, 32768], [256, 512], ["f16", "q8_0"], ["on", "off"])
                 if w.flash_attn == "on" or w.type_v == "f16"]  # fmt: skip
    caps = [40 * 10**6, 30 * 10**6]
    model = CheckedModel("tiny-qwen3moe", str(path), inspect_model(path), manifest(), tmp_path / "grid.log")
    rows = check_devices(model, workloads, caps)
    assert rpc_servers() == 0
    for r in rows:
        print(r)
    assert len(rows) == 24 and all(r["exact"] for r in rows)
    assert not [r for r in rows if r["fits"] and r["status"] != "ok"]  # never on the out-of-memory side
    kinds = {(r["fits"], r["host_expert_layers"] > 0) for r in rows}
    assert kinds == {(True, False), (True, True), (False, True)}
    # 4K, ubatch 256, no flash attention: pipelined, the devices' compute buffers (25 MiB each) would not fit
    (cell,) = [r for r in rows if (r["ctx"], r["ubatch"], r["flash_attn"]) == (4096, 256, "off")]
    assert cell["fits"] and cell["host_expert_layers"] == 0


@pytest.mark.llamacpp
@pytest.mark.untimed
def test_the_lowest_ncmoe_across_two_devices_is_what_loads(tmp_path):
    """The budget over two emulated devices (40 and 30 MB): the lowest --n-cpu-moe under llama.cpp's own split,
    with each device's compute buffer as llama.cpp reserves it, loads at the full context, and one less runs out
    of memory, over 4K-32K and ubatch 256/512 (flash attention, f16 cache); where it says none fits (32K: 2 of 8
    cells, 2026-12-05), every expert on the host runs out of memory too."""
    from llamacpp_helpers import manifest, rpc_servers, tiny_twin

    from moeplace.core.config import DeviceTarget
    from moeplace.plan.devices_budget import devices_budget_table
    from moeplace.runtime.allocation import load_probe
    from moeplace.runtime.cpus import split_cpus
    from moeplace.runtime.device import attached, device_setup

    path, m = str(tiny_twin(tmp_path)), manifest()
    meta = inspect_model(path)
    target = DeviceTarget("emulated", "", 40 * 10**6, 1.0, (30 * 10**6,))
    workloads = [Workload(ctx, ub, "on") for ctx in (4096, 8192, 16384, 32768) for ub in (256, 512)]
    log = tmp_path / "budget.log"
    table = devices_budget_table(meta, path, m, target, Device(target.vram_bytes, 0), workloads, log)
    setup = device_setup(target, m)
    with attached(setup, m, split_cpus(True), log) as rpc:
        for w, n in zip(workloads, table.n_cpu_moe):
            print(w.ctx, w.ubatch, n)
            if pd.isna(n):  # no --n-cpu-moe fits: every expert on the host still runs out of memory
                assert load_probe(m, path, w.llama_args(), meta.n_layer, rpc, log)[0] == "oom"
                continue
            assert load_probe(m, path, w.llama_args(), int(n), rpc, log)[0] == "ok"
            if n:
                assert load_probe(m, path, w.llama_args(), int(n) - 1, rpc, log)[0] == "oom"
    assert rpc_servers() == 0
    assert table.n_cpu_moe.max() > 0 and table.n_cpu_moe.isna().any()  # experts on the host; a cell where none fits
