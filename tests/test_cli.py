"""The `moeplace` command as a user types it (in the test's process, but where the process itself is the point)."""

from __future__ import annotations

import json
import re
import shlex
import time

import yaml
from cli_helpers import moeplace, moeplace_process
from conftest import ROOT

from moeplace.model.meta import from_json

SEED_ARGS = [
    "--vram-gb",
    "16",
    "--non-expert-gb",
    "0.89",
    "--expert-gb",
    "17.41",
    "--layers",
    "48",
    "--overhead-gb",
    "1.0",
    "--kv-bytes-per-token",
    "98304",
]


def test_recommend_constants_mode_is_the_seed_script():
    out = moeplace_process("recommend", *SEED_ARGS, "--ctx", "8192,32768,65536")  # as typed: a new process
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    for line, n in zip(lines, (12, 18, 27)):
        assert line.endswith(f"--n-cpu-moe {n}")


def test_recommend_context_that_cannot_fit_exits_nonzero_with_advice():
    out = moeplace("recommend", *SEED_ARGS, "--ctx", "200000")
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1
    assert "reduce the context or quantize the KV cache" in out.stderr
    assert "Traceback" not in out.stderr


def test_recommend_gguf_mode_json_and_server_command(small_moe):
    out = moeplace("recommend", str(small_moe), "--vram", "32MiB", "--ctx", "4096", "--margin", "0", "--json")
    assert out.returncode == 0, out.stderr
    (plan,) = json.loads(out.stdout)
    assert {"ctx", "kv_bytes", "budget_bytes", "resident_layers", "n_cpu_moe"} <= set(plan)
    assert plan["kv_bytes"] == 2 * 4096 * 2 * 64 * 2  # 2 layers, K+V, 1 KV head x 64, f16
    text = moeplace(
        "recommend",
        str(small_moe),
        "--vram",
        "32MiB",
        "--ctx",
        "4096",
        "--margin",
        "0",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
    )
    assert "llama-server -m" in text.stdout and "--cache-type-v q8_0" in text.stdout and "-fa on" in text.stdout


def test_inspect_json_has_the_documented_keys(small_moe):
    out = moeplace("inspect", str(small_moe), "--json")
    stored = json.loads(out.stdout)
    for key in ("architecture", "n_layer", "n_expert", "n_expert_used", "expert_bytes", "non_expert_bytes", "layers"):
        assert key in stored
    assert "expert_bytes" in stored["layers"][0]


def test_bad_inputs_give_one_line_not_a_traceback(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOTAGGUF" + bytes(100))
    for run, args in (
        (moeplace_process, ["inspect", str(junk)]),  # a new process: no traceback reaches the terminal
        (moeplace, ["inspect", str(tmp_path / "missing.gguf")]),  # in this one, an escaped exception fails the test
        (moeplace, ["recommend", str(junk), "--vram", "16", "--ctx", "1"]),
        (moeplace, ["recommend", "--ctx", "abc"]),
    ):
        out = run(*args)
        assert out.returncode != 0
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_twin_command_writes_a_sparse_header_faithful_file(tmp_path):
    out = moeplace(
        "twin", str(ROOT / "config/models/tiny-qwen3moe.yaml"), str(tmp_path / "t.gguf"), "--weights", "none"
    )
    assert out.returncode == 0, out.stderr
    meta = from_json(json.loads(moeplace("inspect", str(tmp_path / "t.gguf"), "--json").stdout))
    # attn_output rows are 2 heads x 64 = 128 long, not a whole Q4_K block: llama.cpp falls back to Q5_0.
    assert meta.n_layer == 8 and meta.quant_types.keys() == {"F32", "Q4_K", "Q5_0", "Q6_K"}


def test_inspect_reads_a_split_400_gb_deepseek_v3_header_twin_from_any_shard(tmp_path):
    """DeepSeek-V3 at Q4_K_M (~404 GB) as nine sparse 50 GB shards: inspect answers from the headers alone (a
    benchmark figure, printed, with the process's start-up; the test checks the answer)."""
    out = moeplace(
        "twin", str(ROOT / "config/models/deepseek-v3.yaml"), str(tmp_path / "ds.gguf"), "--shard-size", "50GB"
    )
    assert out.returncode == 0, out.stderr
    shards = sorted(tmp_path.glob("ds-*-of-00009.gguf"))
    assert len(shards) == 9 and out.stdout.strip() == f"wrote {shards[0]}"
    started = time.perf_counter()
    done = moeplace_process("inspect", str(shards[4]), "--json")
    seconds = time.perf_counter() - started
    meta = from_json(json.loads(done.stdout))  # the JSON reads back as the model it describes
    print(f"moeplace inspect on a {meta.total_bytes / 1e9:.0f} GB split twin: {seconds:.2f} s")
    assert meta.total_bytes > 400e9 and len(meta.files) == 9 and meta.n_layer == 61
    assert meta.attention.mla and meta.n_expert == 256 and meta.n_expert_used == 8
    assert [layer.expert_bytes > 0 for layer in meta.layers] == [False] * 3 + [True] * 58  # 3 dense leads


def _plan(model, *args: str) -> dict:
    """A plan for the emulated device (--backend rpc: capped exactly, no margin unless asked)."""
    out = moeplace("recommend", str(model), "--json", "--backend", "rpc", *args)
    assert out.stdout, out.stderr
    (plan,) = json.loads(out.stdout)
    return plan


def test_recommend_counts_every_device_buffer_and_honours_the_margin_exactly(small_moe, projector):
    from moeplace.model.metadata import inspect_model

    meta = inspect_model(small_moe)
    base = _plan(small_moe, "--vram", "1GiB", "--ctx", "4096")
    # The input embedding stays on the host (llama.cpp's input layer); every other tensor is on the card at n=0.
    assert base["weights_bytes"] == meta.total_bytes - meta.global_bytes["token_embd"]
    need = base["weights_bytes"] + base["kv_bytes"] + base["compute_bytes"]
    # A card of exactly that plus the margin fits n=0; one byte less does not.
    card = need + 2**20
    assert _plan(small_moe, "--vram", f"{card}B", "--ctx", "4096", "--margin", "1")["n_cpu_moe"] == 0
    assert _plan(small_moe, "--vram", f"{card - 1}B", "--ctx", "4096", "--margin", "1")["n_cpu_moe"] > 0
    # Two server slots hold two contexts' KV cache; a projector's bytes come off the card as well.
    assert _plan(small_moe, "--vram", "1GiB", "--ctx", "4096", "--parallel", "2")["kv_bytes"] == 2 * base["kv_bytes"]
    assert _plan(small_moe, "--vram", "1GiB", "--ctx", "4096", "--mmproj", str(projector))["extra_bytes"] == (
        projector.stat().st_size
    )
    # Flash attention off: the score matrix joins the compute buffer.
    assert (
        _plan(small_moe, "--vram", "1GiB", "--ctx", "4096", "--flash-attn", "off")["compute_bytes"]
        > (base["compute_bytes"])
    )


def test_recommend_plans_around_the_users_own_pins(small_moe):
    pin = r"blk\.1\.ffn_.*_exps=CPU"
    free = _plan(small_moe, "--vram", "1GiB", "--ctx", "4096")
    pinned = _plan(small_moe, "--vram", "1GiB", "--ctx", "4096", "-ot", pin)
    assert pinned["n_cpu_moe"] == 0 and pinned["weights_bytes"] < free["weights_bytes"]
    text = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "4096", "--backend", "rpc", "-ot", pin)
    assert f"-ot '{pin}' --n-cpu-moe 0" in text.stdout
    bad = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "4096", "-ot", "nothing=CPU")
    assert bad.returncode == 2 and "decides no routed-expert tensor" in bad.stderr


def test_recommend_lists_fixes_when_nothing_fits(small_moe):
    need_at_1k = _plan(small_moe, "--vram", "1GiB", "--ctx", "1024")
    card = need_at_1k["weights_bytes"] + need_at_1k["kv_bytes"] + need_at_1k["compute_bytes"]
    out = moeplace("recommend", str(small_moe), "--vram", f"{card}B", "--ctx", "4096", "--backend", "rpc")
    assert out.returncode == 1
    (fix,) = [line for line in out.stderr.splitlines() if line.startswith("  fix: a shorter context: -c ")]
    ctx = re.search(r"-c (\d+)", fix)[1]
    assert 1024 <= int(ctx) < 4096
    assert moeplace("recommend", str(small_moe), "--vram", f"{card}B", "--ctx", ctx, "--backend", "rpc").returncode == 0


def test_hostile_inputs_each_get_one_line_naming_the_flag_and_exit_2(small_moe, tmp_path):
    base = ["recommend", str(small_moe), "--vram", "1GiB", "--ctx", "2048"]
    cases = {
        "-ot": ["-ot", "(blk=CPU"],  # not a regex
        "--mmproj": ["--mmproj", str(tmp_path / "missing.gguf")],
        "--objective banana": ["--objective", "banana"],
        "--objective mix:abc": ["--objective", "mix:abc"],
        "--objective mix:2": ["--objective", "mix:2"],
        "--parallel": ["--parallel", "0"],
        "--ubatch": ["--ubatch", "0"],
        "--margin": ["--margin", "-500"],
        "--ctx 40000": ["--ctx", "40000"],  # 9.8x small's trained 4096: beyond what YaRN stretches
        "--ctx 10000001": ["--ctx", "10000001"],
        "-ot 'blk=GPU'": ["-ot", r"blk\.0\.ffn_up_exps=GPU"],  # no such buffer in llama.cpp
        "-ot 'exps'": ["-ot", "exps"],  # no =BUFFER
        "--emit ollama": ["--ctx", "2048,4096", "--emit", "ollama"],
        "--vram": ["--vram", "16 gigs"],
        "--bw-vram": ["--bw-vram", "0"],
        "--cache-type-k": ["--cache-type-k", "f17"],
    }
    for flag, args in cases.items():
        out = moeplace(*base, *args)
        assert out.returncode == 2, (flag, out.stdout, out.stderr)
        assert out.stdout == "" and "Traceback" not in out.stderr, (flag, out.stderr)
        (line,) = out.stderr.strip().splitlines()
        assert flag.split()[0] in line, (flag, line)


def test_pins_reach_every_emitted_form(small_moe):
    pin = r"blk\.1\.ffn_(up|down)_exps=CPU,blk\.0\.ffn_gate_exps=CPU"  # llama.cpp's ',' between rules
    args = ["recommend", str(small_moe), "--vram", "1GiB", "--backend", "rpc", "--ctx", "2048", "-ot", pin]
    server = moeplace(*args).stdout
    assert f"-ot '{pin}' --n-cpu-moe 0" in server
    bench = moeplace(*args, "--emit", "bench").stdout
    assert "-ot " + shlex.quote(pin.replace(",", ";")) in bench  # llama-bench's ',' would sweep
    (swap,) = yaml.safe_load(moeplace(*args, "--emit", "llama-swap").stdout)["models"].values()
    assert f"-ot '{pin}'" in swap["cmd"]
    ollama = moeplace(*args, "--emit", "ollama").stdout
    assert f"LLAMA_ARG_OVERRIDE_TENSOR='{pin}'" in ollama and "LLAMA_ARG_N_CPU_MOE=0" in ollama
    assert "PARAMETER num_cpu_moe" not in ollama  # no released Ollama has it: `ollama create` would refuse it
    optimal = moeplace(*args, "--placement", "optimal").stdout
    assert optimal.strip().splitlines()[-1].split("-ot ", 1)[1].startswith(f"'{pin}")
    # what recommend prints, pasted back, is read the same way
    pasted = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--backend", "rpc", "--ctx", "2048", "-ot",
                      shlex.split(optimal.strip().splitlines()[-1].split("-ot ", 1)[1])[0], "--json")  # fmt: skip
    assert pasted.returncode == 0, pasted.stderr
    plan = json.loads(moeplace(*args, "--json").stdout)[0]
    assert plan["pins"] == pin.split(",") and plan["resident_layers"] == 0  # both layers have an expert pinned


def test_several_contexts_make_one_llama_swap_config(small_moe):
    out = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "1024,4096", "--emit", "llama-swap")
    config = yaml.safe_load(out.stdout)
    assert list(config) == ["models"] and len(config["models"]) == 2
    assert all("--port ${PORT}" in entry["cmd"] for entry in config["models"].values())
    assert {m.rsplit("-", 1)[1] for m in config["models"]} == {"1k", "4k"}


def test_a_split_models_server_line_names_its_first_shard(tmp_path):
    out = moeplace("twin", str(ROOT / "config/models/deepseek-v3.yaml"), str(tmp_path / "ds.gguf"), "--shard-size",
                   "50GB")  # fmt: skip
    assert out.returncode == 0, out.stderr
    third = sorted(tmp_path.glob("ds-*-of-00009.gguf"))[2]
    plan = moeplace("recommend", str(third), "--vram", "80GB", "--ctx", "8192")
    assert plan.returncode == 0, plan.stderr
    assert f"-m {tmp_path}/ds-00001-of-00009.gguf" in plan.stdout and third.name not in plan.stdout


def test_the_answer_says_what_it_assumed(small_moe):
    out = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "2048", "--backend", "vulkan")
    assert "margin: 768 MiB kept free (vulkan's default" in out.stdout
    assert "1.07 GB (--vram 1GiB, as given)" in out.stdout
    assert "640 GB/s and 48.7 TFLOPS card, 57.6 GB/s host, moeplace's defaults" in out.stdout
    assert "host RAM:" in out.stdout
    given = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "2048", "--bw-vram", "448", "--bw-ddr",
                     "89.6", "--card-tflops", "23.7", "--margin", "100")  # fmt: skip
    assert "448 GB/s and 23.7 TFLOPS card, 89.6 GB/s host, --bw-vram/--bw-ddr/--card-tflops as given" in given.stdout
    bandwidths_only = moeplace("recommend", str(small_moe), "--vram", "1GiB", "--ctx", "2048", "--bw-vram", "448")
    assert "448 GB/s and 48.7 TFLOPS card" in bandwidths_only.stdout
    assert "--bw-vram as given; otherwise moeplace's defaults" in bandwidths_only.stdout
    assert "margin: 100 MiB kept free (--margin)" in given.stdout
    assert moeplace("--version").stdout.startswith("moeplace ")


def test_experts_beyond_the_hosts_ram_are_said_to_page_from_disk(tmp_path):
    out = moeplace("twin", str(ROOT / "config/models/deepseek-v3.yaml"), str(tmp_path / "ds.gguf"))
    assert out.returncode == 0, out.stderr
    plan = moeplace("recommend", str(tmp_path / "ds.gguf"), "--vram", "24GB", "--ctx", "8192", "--ram", "64GB")
    assert plan.returncode == 0, plan.stderr
    assert "beyond its 64.0 GB (--ram 64GB)" in plan.stdout and "disk" in plan.stdout
