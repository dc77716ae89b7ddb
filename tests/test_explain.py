"""`moeplace explain LOG` on every real log of the corpus: per device its weights, KV and compute as the log's lines
say, what stayed on the host, and why it ran out of memory."""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_helpers import moeplace, moeplace_process
from corpus import ids, samples

LOGS = samples("log")
MiB = 2**20


def explain(tmp_path, text: str, *args: str) -> subprocess.CompletedProcess:
    """`moeplace explain` on a pasted log, in this process (the file tests below start the command as a process)."""
    log = tmp_path / "pasted.log"
    log.write_text(text)
    return moeplace("explain", str(log), *args)


def explain_here(tmp_path, capsys, text: str, as_json: bool) -> tuple[int, str]:
    """`moeplace explain` in this process (the command's own function): its exit code and what it printed. The
    corpus is large; one process per log would cost the suite minutes (the tests below run the command itself)."""
    from argparse import Namespace

    from moeplace.cli.tools import cmd_explain

    log = tmp_path / "pasted.log"
    log.write_text(text)
    code = cmd_explain(Namespace(log=str(log), json=as_json))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("sample", LOGS, ids=ids(LOGS))
def test_explain_gives_each_devices_totals_as_the_log_does(sample, tmp_path, capsys):
    code, printed = explain_here(tmp_path, capsys, sample.text, as_json=True)
    expect = sample.expect
    status = expect.get("status", "ok")
    assert code == (1 if status in ("oom", "error") else 0)
    found = json.loads(printed)
    assert found["status"] == status
    if status == "error":
        assert found["error"]["line"] == expect["error"]
    for device, kinds in expect.get("devices", {}).items():
        assert found["devices"][device]["total"] == pytest.approx(sum(kinds.values()), abs=0.02), device
    if "devices" in expect:
        assert set(found["devices"]) == set(expect["devices"])
    if "host" in expect:
        assert found["host"]["total"] == pytest.approx(sum(sum(k.values()) for k in expect["host"].values()), abs=0.02)
    if status == "oom":
        assert found["oom"]["stage"] == expect["oom"]["stage"]
        # a limit on one allocation is not planned with more memory: its fix makes the buffer smaller
        assert found["fix"].startswith("moeplace recommend ") != (found["oom"]["cause"] == "allocation-limit")
    code, text = explain_here(tmp_path, capsys, sample.text, as_json=False)
    assert text.startswith("backend: ")


def test_explain_says_where_the_experts_went_and_why_it_ran_out(tmp_path):
    (cuda,) = [s for s in LOGS if s.path.stem == "cuda-single-ik-deepseek-r1-ot-exps-4090d"]
    out = explain(tmp_path, cuda.text).stdout
    assert "experts in host RAM: at least 6 tensors in 2 layers" in out  # the 6 expert lines the excerpt kept
    assert "CUDA0" in out and "host" in out and "CUDA_Host" in out
    (oom,) = [s for s in LOGS if s.path.stem == "rocm-kv-oom-qwen35-27b-rx9060xt"]
    why = explain(tmp_path, oom.text).stdout
    assert "ROCm0 ran out of memory while allocating the KV cache (2,048.00 MiB asked)" in why
    assert "Qwen3.5-27B-Q4_K_M.gguf" in why and "--backend rocm" in why


@pytest.mark.parametrize("pasted", ["hello world\n", "", "Traceback (most recent call last):\n  File x\n"])
def test_text_that_is_not_a_llamacpp_log_gets_one_line(pasted, tmp_path):
    out = explain(tmp_path, pasted)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "is not a llama.cpp log" in line


def test_explain_reads_llama_bench_tables_too(tmp_path):
    (table,) = [s for s in samples("bench-md") if s.path.stem == "bench-md-qwen3-30b-moe-rtx5070-cuda"]
    out = explain(tmp_path, table.text)
    assert out.returncode == 0 and out.stdout.startswith("llama-bench results: 2 records")


def sample(stem: str):
    (found,) = [s for s in LOGS if s.path.stem == stem]
    return found


def test_a_limit_on_one_allocation_is_not_called_a_lack_of_memory(tmp_path):
    """The driver refused one allocation (Vulkan on an APU): the words say so and say what to change, and no plan
    with the free memory is offered, which would fail the same way."""
    apu = explain(tmp_path, sample("vulkan-weights-oom-890m-igpu").text).stdout
    assert "not a lack of memory" in apu and "out of memory" not in apu
    assert "GTT/TTM" in apu and "-ngl" in apu and "--vram" not in apu and "plan it" not in apu
    card = explain(tmp_path, sample("vulkan-compute-oom-buffer-size-limit-qwen3-30b-a3b").text).stdout
    assert "not a lack of memory" in card and "-ub 256" in card and "GTT" not in card  # no APU named there


def test_room_to_spare_makes_a_failure_a_limit_not_a_lack(tmp_path):
    """The 890M's real failure without the driver's words but with free memory at load to spare reads as a limit;
    with less free than it asked, as a lack of memory."""
    text = sample("vulkan-weights-oom-890m-igpu").text
    text = text.replace("ggml_vulkan: Requested buffer size exceeds device memory allocation limit: ", "ggml_vulkan: ")
    using = "llama_model_load_from_file_impl: using device Vulkan0 (AMD Radeon Graphics) - {} MiB free\n"
    roomy = json.loads(explain(tmp_path, using.format(98148) + text, "--json").stdout)["oom"]
    assert roomy["cause"] == "allocation-limit" and "98,148 MiB free at load" in roomy["why"]
    short = json.loads(explain(tmp_path, using.format(4000) + text, "--json").stdout)["oom"]
    assert short["cause"] == "memory" and short["why"].startswith("Vulkan0 ran out of memory")


def test_pipeline_copies_are_named_as_the_cause_with_the_way_to_turn_them_off(tmp_path):
    for stem in ("cuda-multi-ik-deepseek-v31-11gpu-ts-ncmoe-oom", "cuda-oom-compute-ik-qwen3-235b-pipeline-2x2080ti"):
        out = explain(tmp_path, sample(stem).text).stdout
        assert "Pipeline parallelism caused it" in out and "4 copies" in out, stem
        assert "-DGGML_SCHED_MAX_COPIES=1" in out and "-sm row" in out, stem
    # a 144 MiB buffer on a full small card: the copies add to it, but are not called the cause
    small = explain(tmp_path, sample("cuda-multi-old-2024-5gpu-small-card-compute-oom").text).stdout
    assert "Pipeline parallelism was on" in small and "caused it" not in small
    retried = sample("cuda-pipeline-retry-minimax-m3-3gpu")  # mainline recovered: said, and not an out-of-memory
    found = json.loads(explain(tmp_path, retried.text, "--json").stdout)
    got = {key: found["pipeline_retried"][key] for key in ("device", "requested_mib")}
    assert found["status"] == "ok" and got == retried.expect["pipeline_retried"]
    assert "so llama.cpp retried without it (1 copy)" in explain(tmp_path, retried.text).stdout
    one = sample("cuda-oom-compute-ik-qwen3-235b-pipeline-2x2080ti").text.replace("n_copies=4", "n_copies=1")
    out = explain(tmp_path, one).stdout
    assert "(1 copy of the compute" in out and "1 copies" not in out and "Pipeline parallelism" not in out


@pytest.mark.parametrize(
    ("stem", "todo"),
    [("rocm-error-kernel-image-invalid-gfx1035-apu", "no GPU code for this card"),
     ("rocm-error-invalid-device-function-2024", "no GPU code for this card"),
     ("error-unknown-architecture-pangu-ollama", "update llama.cpp")],
)  # fmt: skip
def test_an_error_that_is_not_about_memory_is_an_error_with_its_line(stem, todo, tmp_path):
    log = sample(stem)
    out = explain(tmp_path, log.text)
    assert out.returncode == 1 and "status: ok" not in out.stdout and "out of memory" not in out.stdout
    assert "not about memory" in out.stdout and f"the line: {log.expect['error']}" in out.stdout
    assert todo in out.stdout


def test_a_fit_dry_run_is_called_one(tmp_path):
    def dry(stem: str) -> dict | None:
        return json.loads(explain(tmp_path, sample(stem).text, "--json").stdout)["dry_run"]

    assert dry("rocm-strix-halo-qwen3-next-zero-size-buffers")["kind"] == "fit-pass"  # 0.00 MiB model buffers
    assert dry("fit-projection-3x3090-3060-asymmetric")["kind"] == "fit-projection"
    assert dry("fit-server-qwen3-30b-4090-readme-no-change") is None  # it fit, then loaded and served
    assert dry("cuda-multi-mainline-qwen3-30b-ot-cpu-4090-5090") is None
    out = explain(tmp_path, sample("rocm-strix-halo-qwen3-next-zero-size-buffers").text).stdout
    assert "dry run" in out and "status: ok" not in out


def test_a_paste_with_cut_override_lines_says_at_least(tmp_path):
    def experts(text: str) -> dict:
        return json.loads(explain(tmp_path, text, "--json").stdout)["experts_on_host"]

    assert experts(sample("cuda-oom-runtime-ik-deepseek-r1-2x4090").text)["at_least"]  # blk.59 shows 1 of 3
    whole = "\n".join(f"Tensor blk.{i}.ffn_{k}_exps.weight buffer type overriden to CPU" for i in (3, 4) for k in
                      ("gate", "down", "up"))  # fmt: skip
    assert not experts("load_tensors: offloaded 62/62 layers to GPU\n" + whole)["at_least"]
    assert experts("load_tensors: offloaded 62/62 layers to GPU\n" + whole.replace("blk.4.", "blk.9."))["at_least"]
    assert experts("load_tensors: offloaded 62/62 layers to GPU\n...\n" + whole)["at_least"]


def test_the_pasted_command_goes_into_the_plan():
    from moeplace.report.explain import _fix, command_args
    from moeplace.runtime.llama_log import read_log

    text = sample("cuda-multi-ik-deepseek-r1-ot-cuda0-cuda1-cpu-2x-a6000").text
    args = command_args(text)
    assert args["ubatch"] == "4096" and args["ngl"] == "99" and args["flash_attn"] == "on"
    assert len(args["ot"]) == 3 and args["ot"][-1] == "exps=CPU"
    fix = _fix(read_log(text), args)
    assert "--ubatch 4096" in fix and "--flash-attn on" in fix and "--ctx 16384" in fix
    assert fix.count(" -ot ") == 2 and "exps=CPU" not in fix  # the experts are what recommend plans
    several = command_args(sample("cuda-multi-mainline-qwen3-30b-ot-cpu-4090-5090").text)  # ./llama-cli \ lines
    assert several["ctx"] == "16384" and several["ngl"] == "99" and several["ot"] == [".ffn_.*_exps.=CPU"]
    assert command_args("main: build = 3871\nllama_context: n_ctx = 4096\n") == {}


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"GGUF\x03\x00\x00\x00" + bytes(64), "is a GGUF model, not a log"), (bytes(range(256)) * 8, "is a binary file"),
     (None, "is a folder, not a log")],
)  # fmt: skip
def test_a_file_that_is_not_a_log_gets_one_line(content, says, tmp_path):
    path = tmp_path / "pasted"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    out = moeplace_process("explain", str(path))
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert says in line and str(path) in line


def test_a_windows_utf16_log_is_read(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(sample("rocm-kv-oom-qwen35-27b-rx9060xt").text.encode("utf-16"))
    out = moeplace_process("explain", str(log))
    assert out.returncode == 1 and "ROCm0 ran out of memory while allocating the KV cache" in out.stdout


def test_device_info_lines_give_the_free_memory_at_load():
    """2026 builds list each device with its total and free memory (device_info) before loading; --list-devices
    prints the same figures. Lines from ggml-org/llama.cpp#23934 (an RX 7900 XTX) and #19764 (a Strix Halo)."""
    from moeplace.runtime.llama_log import read_log

    report = read_log(
        "0.00.042.175 I device_info:\n"
        "0.00.042.225 I   - ROCm0   : AMD Radeon RX 7900 XTX (24560 MiB, 24510 MiB free)\n"
        "0.00.042.231 I   - CPU     : AMD Ryzen 5 5600X 6-Core Processor (31991 MiB, 31991 MiB free)\n"
    )
    assert report.free_at_load == {"ROCm0": 24510 * MiB} and report.card_memory == {"ROCm0": 24560 * MiB}
    listed = read_log("Available devices:\n  ROCm0: AMD Radeon(TM) Graphics (110511 MiB, 110357 MiB free)\n")
    assert listed.free_at_load == {"ROCm0": 110357 * MiB}


def test_a_fit_pass_cut_before_its_weights_is_still_a_dry_run(tmp_path):
    """The real --fit pass excerpt with its two model-buffer lines swapped for the pass's KV line (0.00 MiB, as
    the pass prints it): a dry run by its KV buffers alone; with a real KV size it is not."""
    text = sample("rocm-strix-halo-qwen3-next-zero-size-buffers").text
    kv = "llama_kv_cache:      ROCm0 KV buffer size =     {} MiB\n"
    cut = "".join(line for line in text.splitlines(keepends=True) if "model buffer size" not in line)
    assert json.loads(explain(tmp_path, cut + kv.format("0.00"), "--json").stdout)["dry_run"]["kind"] == "fit-pass"
    assert json.loads(explain(tmp_path, cut + kv.format("6144.00"), "--json").stdout)["dry_run"] is None


def test_the_routers_argument_lines_are_a_command_too():
    """llama-server's router logs a model's arguments one to a line (the arguments of ggml-org/llama.cpp#23858; its
    timestamps simplified)."""
    from moeplace.report.explain import command_args

    lines = ["--flash-attn", "1", "--log-verbosity", "4", "--model",
             "/home/kusa/llama-server/models/Qwen3.5-397B-A17B-UD-IQ4_XS/Qwen3.5-397B-A17B-UD-IQ4_XS-00001-of-00005.gguf",
             "--n-gpu-layers", "all", "--parallel", "1", "--ubatch-size", "512"]  # fmt: skip
    text = "".join(f"0.11.036.25{i % 10} I srv          load:   {arg}\n" for i, arg in enumerate(lines))
    args = command_args(text)
    assert args["ngl"] == "all" and args["ubatch"] == "512" and args["parallel"] == "1" and args["flash_attn"] == "1"
    assert args["model"].endswith("Qwen3.5-397B-A17B-UD-IQ4_XS-00001-of-00005.gguf")


def test_on_an_apu_one_buffer_under_the_free_memory_is_a_limit(tmp_path):
    """The Strix Halo compute failure (6,564 MiB of KV already there, 4,536.75 MiB asked) without the driver's
    words and with 8,000 MiB free at load: a lack of memory on a card, a limit on an APU, whose free memory is the
    host's."""
    text = sample("vulkan-strix-halo-compute-oom-qwen3-30b-a3b").text
    text = text.replace("ggml_vulkan: Requested buffer size exceeds device memory allocation limit: ", "ggml_vulkan: ")
    using = "llama_model_load_from_file_impl: using device Vulkan0 (AMD Radeon Graphics) - 8000 MiB free\n"
    card = json.loads(explain(tmp_path, using + text, "--json").stdout)["oom"]
    assert card["cause"] == "memory"
    apu = "ggml_vulkan: 0 = Radeon 8060S Graphics (RADV GFX1151) (radv) | uma: 1 | fp16: 1 | warp size: 64\n"
    assert json.loads(explain(tmp_path, apu + using + text, "--json").stdout)["oom"]["cause"] == "allocation-limit"
