"""The command a user pastes runs as planned: every `recommend --emit server` and `--emit bench` line, for each tiny
twin architecture and with a pin of the user's, run in the pinned llama-server and llama-bench on an emulated
device capped to the --vram recommend was given. It loads and serves one completion (or one measurement), every
expert tensor lands where the plan put it (llama.cpp's own -v log), and the device's buffers are the plan's:
weights and KV to the 0.01 MiB llama.cpp prints, compute exact with --reserve (llama.cpp's own reserve) and
within the estimate's tolerance without it."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llamacpp_helpers import manifest

from moeplace.model.memory import SERVER, Workload, device_need, estimate_compute
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.offload import read_pins
from moeplace.runtime.allocation import reserve
from moeplace.runtime.device import rpc_device
from moeplace.runtime.llama_log import read_log
from moeplace.runtime.llama_names import is_host
from moeplace.runtime.tool_output import bench_records

pytestmark = [pytest.mark.llamacpp, pytest.mark.untimed]
TINY = [p for p in sorted((ROOT / "config/models").glob("tiny-*.yaml")) if load_spec(p).n_expert]
CTX = 2048
MiB = 2**20
# llama.cpp prints each buffer to 0.01 MiB: a sum of a few lines is within this of the exact bytes.
PRINTED = 0.02
# The emulated device (--backend rpc) with llama.cpp's own compute reserve; 1 MiB kept free for the RPC server's
# own scratch, which devcap's cap counts too (a few KiB: with less free, the server cannot serve a reserve).
RECOMMEND = ("--backend", "rpc", "--reserve", "--margin", "1")


def moeplace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moeplace.cli", *args], capture_output=True, text=True, cwd=ROOT)


def binary(name: str) -> str:
    return str(manifest().bin_dir / name)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def serve_one_completion(argv: list[str], log: Path, env: dict | None = None) -> dict:
    """Start llama-server with `argv`, wait for its health check, ask for one token, stop it; its answer."""
    port = _port()
    with open(log, "w") as out:
        server = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], stdout=out,
                                  stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"llama-server exited ({server.returncode}): {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "llama-server was not healthy within 300 s"
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        return _post(f"http://127.0.0.1:{port}/completion", {"prompt": "Hello", "n_predict": 1})
    finally:
        server.terminate()
        server.wait(timeout=60)


def planned(model: Path, *args: str) -> tuple[dict, str]:
    """recommend's plan (JSON) and the lines it prints for the same arguments."""
    out = moeplace("recommend", str(model), *RECOMMEND, *args, "--json")
    assert out.returncode == 0, out.stderr
    (plan,) = json.loads(out.stdout)
    assert plan["compute_source"] == "llama.cpp"
    return plan, moeplace("recommend", str(model), *RECOMMEND, *args).stdout


def check_log(log: str, meta: dict, plan: dict, pins: list[str], server: bool) -> None:
    """Every expert tensor where the plan puts it, and the device's buffers equal to the plan's: weights and KV
    exactly; compute exactly for llama-bench (the plan's is llama.cpp's own reserve, --reserve), and for
    llama-server at most the plan's (the reserve is for a whole batch of logits, the server's for one token per
    slot) and within our estimate's tolerance of the server's own estimate."""
    report = read_log(log)
    host = read_pins(meta, pins).host_set(meta, plan["n_cpu_moe"])
    experts = {t for layer in meta.layers for t in layer.expert_tensors}
    on_host = {t for t, buffer in report.overridden.items() if is_host(buffer) and t in experts}
    assert on_host == host, (sorted(on_host ^ host), plan["n_cpu_moe"])
    contexts = [b for load in report.loads for b in load.each_context() if b.n_ctx == plan["cells"]]
    assert contexts, f"no context of {plan['cells']} cells in the log"
    ((name, device),) = contexts[-1].devices.items()  # one device: the emulated card
    assert device["weights"] / MiB == pytest.approx(plan["weights_bytes"] / MiB, abs=PRINTED), name
    assert device["kv"] / MiB == pytest.approx(plan["kv_bytes"] / MiB, abs=PRINTED), name
    if not server:
        assert device["compute"] / MiB == pytest.approx(plan["compute_bytes"] / MiB, abs=PRINTED), (device, plan)
    else:
        assert device["compute"] <= plan["compute_bytes"] + PRINTED * MiB, (device, plan)
        ours = estimate_compute(meta, Workload(CTX, outputs=SERVER), plan["n_cpu_moe"])
        print(f"{meta.name}: llama-server compute {device['compute'] / MiB:.2f} MiB, ours {ours / MiB:.2f} MiB")
    assert report.status == "ok"


def expert_layers(meta: dict) -> list[int]:
    return [layer.index for layer in meta.layers if layer.expert_tensors]


def last_layer_pin(meta: dict) -> str:
    """The up experts of the last layer with experts: -ncmoe would not take them."""
    return rf"blk\.{expert_layers(meta)[-1]}\.ffn_(up|gate_up)_exps=CPU"


def a_plan_between(model: Path, meta: dict, pins: list[str], folder: Path) -> int:
    """A card that holds the weights with about half the expert layers' experts on the host (and the pins), with
    llama.cpp's own compute reserve for that placement: the plan has a trade-off to make."""
    layers = expert_layers(meta)
    half = layers[(len(layers) - 1) // 2] + 1
    with rpc_device(manifest(), 2**40, (0,), folder / "reserve-rpc.log") as rpc:
        args = Workload(CTX).llama_args()
        compute = reserve(manifest(), str(model), args, half, rpc, folder / "reserve.log", ",".join(pins))
    need = device_need(
        meta, Workload(CTX), half, lambda _: compute.only_device()["compute"], pins=read_pins(meta, pins)
    )
    return need.total + MiB


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("twins")
    return {spec.stem: write_twin(load_spec(spec), folder / f"{spec.stem}.gguf", "random") for spec in TINY}


@pytest.mark.parametrize("spec", TINY, ids=lambda p: p.stem)
def test_the_server_line_loads_serves_and_places_as_planned(spec, twins, tmp_path):
    model = twins[spec.stem]
    meta = inspect_model(model)
    pins = [last_layer_pin(meta)]
    cap = a_plan_between(model, meta, pins, tmp_path)
    plan, text = planned(model, "--vram", f"{cap}B", "--ctx", str(CTX), "-ot", pins[0])
    assert 0 < plan["n_cpu_moe"] < meta.n_layer, plan
    line = next(s.strip() for s in text.splitlines() if s.strip().startswith("llama-server "))
    assert f"-ot '{pins[0]}'" in line
    with rpc_device(manifest(), cap, (0,), tmp_path / "rpc.log") as rpc:
        argv = [binary("llama-server"), *shlex.split(line)[1:], "--rpc", rpc, "-v", "-t", "1"]
        answer = serve_one_completion(argv, tmp_path / "server.log")
    assert answer["content"] is not None and answer["tokens_predicted"] == 1
    check_log((tmp_path / "server.log").read_text(), meta, plan, pins, server=True)


@pytest.mark.parametrize("spec", TINY, ids=lambda p: p.stem)
def test_the_bench_line_measures_what_the_server_line_runs(spec, twins, tmp_path):
    model = twins[spec.stem]
    meta = inspect_model(model)
    pins = [last_layer_pin(meta)]
    cap = a_plan_between(model, meta, pins, tmp_path)
    plan, _ = planned(model, "--vram", f"{cap}B", "--ctx", str(CTX), "-ot", pins[0])
    bench = moeplace("recommend", str(model), *RECOMMEND, "--vram", f"{cap}B", "--ctx", str(CTX), "-ot", pins[0],
                     "--emit", "bench")  # fmt: skip
    (line,) = bench.stdout.splitlines()
    assert f"-ot '{pins[0]}'" in line and f"-ncmoe {plan['n_cpu_moe']}" in line
    with rpc_device(manifest(), cap, (0,), tmp_path / "rpc.log") as rpc:
        argv = [binary("llama-bench"), "--rpc", rpc, *shlex.split(line)[1:], "-r", "1", "-t", "1", "-o", "jsonl", "-v"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, "\n".join(s for s in done.stderr.splitlines() if "input tensor" not in s)[-3000:]
    records = bench_records(done.stdout)
    assert len(records) == 2 and all(r["avg_ts"] > 0 for r in records)
    check_log(done.stderr, meta, plan, pins, server=False)


def test_the_ollama_route_places_the_experts_in_the_llama_server_ollama_runs(twins, tmp_path):
    """The Modelfile's advice (LLAMA_ARG_N_CPU_MOE and LLAMA_ARG_OVERRIDE_TENSOR in the environment of the server
    Ollama 0.30+ starts, which passes no -ngl) in the pinned llama-server: the experts go where the plan says."""
    model = twins["tiny-qwen3moe"]
    meta = inspect_model(model)
    pin = r"blk\.7\.ffn_up_exps=CPU"
    cap = a_plan_between(model, meta, [pin], tmp_path)
    plan, _ = planned(model, "--vram", f"{cap}B", "--ctx", str(CTX), "-ot", pin)
    modelfile = moeplace("recommend", str(model), *RECOMMEND, "--vram", f"{cap}B", "--ctx", str(CTX), "-ot", pin,
                         "--emit", "ollama").stdout  # fmt: skip
    serve = next(line for line in modelfile.splitlines() if line.endswith(" ollama serve"))
    env = dict(part.split("=", 1) for part in shlex.split(serve.lstrip("# "))[:-2])
    assert env == {"LLAMA_ARG_OVERRIDE_TENSOR": pin, "LLAMA_ARG_N_CPU_MOE": str(plan["n_cpu_moe"])}
    assert "num_gpu" not in modelfile and f"PARAMETER num_ctx {CTX}" in modelfile
    with rpc_device(manifest(), cap, (0,), tmp_path / "rpc.log") as rpc:
        argv = [binary("llama-server"), "-m", str(model), "-c", str(CTX), "-np", "1", "--rpc", rpc, "-v", "-t", "1"]
        serve_one_completion(argv, tmp_path / "server.log", env={**os.environ, **env})
    check_log((tmp_path / "server.log").read_text(), meta, plan, [pin], server=True)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layers=st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True),
    kinds=st.sampled_from(["up", "down", "gate", "(up|down)", ".*"]),
    ctx=st.sampled_from([512, 2048, 8192]),
    separate=st.booleans(),
)
def test_llama_fit_params_takes_every_emitted_argument(twins, tmp_path, layers, kinds, ctx, separate):
    """A cheap check over many pins: the pinned llama-fit-params parses the server line's arguments (it reads the
    header and reserves; no weights are read)."""
    rules = [rf"blk\.{il}\.ffn_{kinds}_exps=CPU" for il in layers]
    pin_args = [a for rule in rules for a in ("-ot", rule)] if separate else ["-ot", ",".join(rules)]
    out = moeplace("recommend", str(twins["tiny-qwen3moe"]), "--vram", "1GiB", "--backend", "rpc", "--ctx", str(ctx),
                   *pin_args)  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = next(s.strip() for s in out.stdout.splitlines() if s.strip().startswith("llama-server "))
    done = subprocess.run([binary("llama-fit-params"), *shlex.split(line)[1:], "-fitp", "on"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, (line, done.stderr[-2000:])


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.sampled_from(TINY),
    kv=st.sampled_from([("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "f16")]),
    flash=st.sampled_from(["auto", "on", "off"]),
    ubatch=st.sampled_from([128, 512]),
    parallel=st.integers(1, 2),
    pinned=st.booleans(),
)
def test_generated_requests_load_as_planned(twins, tmp_path_factory, spec, kv, flash, ubatch, parallel, pinned):
    """A sample of the request space loaded for real: the server line of a generated request, on a card of the size
    that leaves about half the experts on the host, loads and serves, each expert where the plan put it and the
    device's weights and KV those the plan counted."""
    if flash == "off" and kv[1] != "f16":
        flash = "on"  # llama.cpp refuses a quantized V cache without flash attention; the request checks say so
    folder = tmp_path_factory.mktemp("request")
    model = twins[spec.stem]
    meta = inspect_model(model)
    pins = [last_layer_pin(meta)] if pinned else []
    cap = a_plan_between(model, meta, pins, folder) + 2 * MiB * parallel  # room for the slots' larger KV
    args = ["--vram", f"{cap}B", "--ctx", str(CTX), "-ctk", kv[0], "-ctv", kv[1], "--flash-attn", flash,
            "--ubatch", str(ubatch), "--parallel", str(parallel), *(["-ot", pins[0]] if pins else [])]  # fmt: skip
    plan, text = planned(model, *args)
    line = next(s.strip() for s in text.splitlines() if s.strip().startswith("llama-server "))
    with rpc_device(manifest(), cap, (0,), folder / "rpc.log") as rpc:
        argv = [binary("llama-server"), *shlex.split(line)[1:], "--rpc", rpc, "-v", "-t", "1"]
        answer = serve_one_completion(argv, folder / "server.log")
    assert answer["tokens_predicted"] == 1
    check_log((folder / "server.log").read_text(), meta, plan, pins, server=True)
