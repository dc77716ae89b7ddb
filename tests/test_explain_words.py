"""What `moeplace explain` adds to the buffers, checked on the corpus's real logs (tests/data/llamacpp/): every live
part of a run counted once, llama.cpp's own memory table beside the buffer lines, and the words for each kind of
setup (the tool that printed the log, unified memory, flash attention turned off, several GPUs)."""

from __future__ import annotations

import pytest
from corpus import samples

from moeplace.report.explain import explain
from moeplace.report.explain_text import render
from moeplace.runtime.llama_log import read_log

LOGS = {s.path.stem: s for s in samples("log")}
TABLES = [stem for stem, s in LOGS.items() if "memory_breakdown_print: |   - " in s.text]


def test_the_corpus_logs_with_a_memory_table_are_the_six_known():
    assert sorted(TABLES) == [
        "cuda-mtp-projector-fit-table-qwen36-27b-5090",
        "cuda-single-qwen-moe-fit-partial-experts-4090-2026",
        "fit-deepseek-v4-4090-48g-pro6000-fill",
        "fit-server-5090-3090-memory-breakdown",
        "fit-server-8x3090-memory-breakdown-timestamped",
        "fit-server-qwen3-30b-4090-readme-no-change",
    ]


@pytest.mark.parametrize("stem", TABLES)
def test_every_table_is_matched_where_the_log_holds_the_main_contexts_buffer_lines(stem):
    """Where the log holds the main model's and context's buffer lines whole (its header types `breakdown`), they
    add up to llama.cpp's own table on every device, to the MiB; a cut paste is said to be cut; a table alone is
    never checked against nothing."""
    sample = LOGS[stem]
    found = explain(sample.text)
    checks = found["breakdown_check"] or {}
    for device, want in sample.expect.get("breakdown", {}).items():
        assert checks[device]["table"] == want and checks[device]["matches"], device
    for device, check in checks.items():
        assert device in found["devices"]  # never a check against a device the buffer lines do not name
        if device not in sample.expect.get("breakdown", {}):
            assert not check["matches"] and "lines are missing from the paste" in render(found)
    if not found["devices"]:
        assert not checks


@pytest.mark.parametrize("stem", [stem for stem, s in LOGS.items() if "parts" in s.expect])
def test_every_live_part_is_counted_once_and_shown(stem):
    sample = LOGS[stem]
    found = explain(sample.text)
    parts = {role: {d: mib["total"] for d, mib in rows.items() if d != "host"} for role, rows in found["parts"].items()}
    assert parts == {role: pytest.approx(devices, abs=0.02) for role, devices in sample.expect["parts"].items()}


def test_an_mtp_run_is_the_model_plus_its_head_plus_its_projector_and_the_table_counts_the_model_only():
    """RTX 5090, Qwen3.6-27B with --spec-type mtp and its projector: the card holds 23,735.53 MiB; llama.cpp's table
    (21,832 = 16,386 + 4,950 + 495) counts the main model and context, which the buffer lines give to the MiB."""
    found = explain(LOGS["cuda-mtp-projector-fit-table-qwen36-27b-5090"].text)
    assert found["devices"]["CUDA0"]["total"] == pytest.approx(23735.53, abs=0.02)
    assert found["breakdown_check"]["CUDA0"]["matches"]
    out = render(found)
    assert "the buffer lines add up to this table on CUDA0 (to the MiB)" in out
    assert (
        "the MTP head's context (--spec-type mtp): CUDA0 767.0" in out and "projector (--mmproj): CUDA0 1,136.1" in out
    )
    assert "table counts the main model and its context only" in out
    assert "run with -v" not in out  # n_expert = 0: a dense model has no experts to place


def test_a_table_is_matched_column_by_column_and_a_cut_paste_is_said_to_be_cut():
    """The 4090 excerpt keeps the model buffer (19,201.62 MiB; the table: 19,201) and the KV (2,560.00) but is cut
    before the recurrent state and the compute buffers, which the table counts (context 2,622, compute 630)."""
    found = explain(LOGS["cuda-single-qwen-moe-fit-partial-experts-4090-2026"].text)
    check = found["breakdown_check"]["CUDA0"]
    assert check["buffers"]["model"] == 19201.62 and check["table"]["model"] == 19201
    assert check["buffers"]["context"] == 2560.0 and check["table"]["context"] == 2622 and not check["matches"]
    assert "lines are missing from the paste" in render(found)


def test_an_mtp_head_reloaded_from_the_same_file_is_counted_once():
    """The MTP pull request's branch re-loads the head from the main GGUF and prints the same mapped buffers again
    (644.14 MiB CPU_Mapped, 14,803.73 MiB MTL0_Mapped): one model's weights, not two."""
    found = explain(LOGS["metal-mtl0-m2pro-mtp-two-loads-runtime-oom"].text)
    assert found["devices"]["MTL0"]["total"] == 14803.73 and found["host"]["total"] == 644.14
    report = read_log(LOGS["metal-mtl0-m2pro-mtp-two-loads-runtime-oom"].text)
    assert [load.role for load in report.loads] == ["main", "mtp"]  # the second load is the head's, by its words


@pytest.mark.parametrize(
    "stem",
    [
        "cuda-oom-compute-old-style-kv-on-host-ollama",
        "cuda-oom-weights-ollama-docker-deepseek-panic",
        "cuda-oom-compute-ollama-2026-3gpu-kvsize-262144",
    ],
)
def test_an_ollama_failure_gets_ollamas_settings_and_is_called_partial(stem):
    """Ollama's runner ran out of memory (ollama#4225 on Windows, #8447 in docker, #15284 with its own engine in
    2026): its fix is in Ollama's terms, and no paste shows the model's load, so each is called partial."""
    found = explain(LOGS[stem].text)
    todo = found["oom"]["todo"]
    assert found["tool"] == "ollama"
    for setting in ("num_gpu", "num_ctx", "OLLAMA_FLASH_ATTENTION=1", "OLLAMA_KV_CACHE_TYPE=q8_0", "paste is partial"):
        assert setting in todo
    assert found["fix"].startswith("moeplace recommend ollama:MODEL ")


def test_the_context_ollama_gave_its_runner_is_said_and_planned():
    found = explain(LOGS["cuda-oom-compute-ollama-2026-3gpu-kvsize-262144"].text)  # "KvSize:262144"
    assert "num_ctx (this runner was given 262,144 tokens)" in found["oom"]["todo"]
    assert " --ctx 262144 " in found["fix"] and "--vram EACH_CARD," in found["fix"]  # devices 1 and 2 failed


def test_a_llama_server_failure_gets_its_flags_not_ollamas():
    llama = explain(LOGS["rocm-kv-oom-qwen35-27b-rx9060xt"].text)
    assert llama["tool"] == "llama.cpp" and "num_gpu" not in (llama["oom"]["todo"] or "")
    # llama.cpp's own program run on a model in LM Studio's folder is llama.cpp, not LM Studio
    strix = explain(LOGS["vulkan-strix-halo-compute-oom-qwen3-30b-a3b"].text)
    assert ".lmstudio/models" in LOGS["vulkan-strix-halo-compute-oom-qwen3-30b-a3b"].text
    assert strix["tool"] == "llama.cpp" and "GPU Offload" not in strix["fix"]


def test_lm_studios_developer_log_is_read_as_lm_studios():
    """LM Studio 0.3.31's developer log (lmstudio-bug-tracker#1216): a date and level on one line, llama.cpp's on
    the next; both cards' free memory at load are read and shown."""
    from moeplace.report.explain_advice import tool_todo
    from moeplace.runtime.llama_log import read_log

    log = LOGS["vulkan-lm-studio-two-gpus-free-at-load-arc-b60-a2000"]
    found = explain(log.text)
    assert found["tool"] == "lm-studio" and found["free_at_load"] == log.expect["free_at_load"]
    assert "free at load (MiB): Vulkan0 23,607, Vulkan1 19,491" in render(found)
    words = tool_todo("lm-studio", "compute", read_log(log.text))
    assert "'GPU Offload'" in words and "'Context Length'" in words and "Force Model Expert Weights onto CPU" in words


def test_n_cpu_moe_on_two_gpus_is_said_to_overfill_the_last_card():
    """ik_llama.cpp before PR #1464: --n-cpu-moe 24 on 2x RTX 3090 asked 35,378.09 MiB of CUDA1 (the last card)."""
    found = explain(LOGS["cuda-oom-weights-ik-ncmoe-last-card-2x3090"].text)
    assert found["oom"]["stage"] == "weights" and found["oom"]["device"] == "CUDA1"
    todo = found["oom"]["todo"]
    assert "the split put too much on CUDA1" in todo and "--n-cpu-moe 24 keeps the experts of the first 24" in todo
    assert "-ts" in todo and "dry run" not in render(found) and "--vram EACH_CARD," in found["fix"]


def test_a_quantized_v_cache_without_flash_attention_is_an_error_with_its_way_out():
    """Ollama 0.17.7 turned flash attention off for Grok, then refused the q8_0 V cache (ollama#15043)."""
    log = LOGS["cuda-error-ollama-flash-attn-forced-off-v-cache-grok"]
    found = explain(log.text)
    assert found["status"] == "error" and found["error"]["line"] == log.expect["error"]
    assert "-ctv f16" in found["error"]["todo"] and "OLLAMA_KV_CACHE_TYPE" in found["error"]["todo"]
    assert "flash_attn is not compatible with Grok" in found["flash_attention"] and found["tool"] == "ollama"


def test_unified_memory_is_said_to_be_the_systems_ram():
    apu = explain(LOGS["vulkan-strix-halo-radv-init-free"].text)["unified"]  # Vulkan's "uma: 1" on a Strix Halo
    assert "system's RAM" in apu and "'free' figure is the system's free RAM" in apu and "GTT" in apu
    mac = explain(LOGS["metal-mtl0-m2pro-mtp-two-loads-runtime-oom"].text)["unified"]
    assert "recommendedMaxWorkingSetSize" in mac and "iogpu.wired_limit_mb" in mac
    # the M4 CI runner prints "recommendedMaxWorkingSetSize  = 11453.25 MB" (10^6 bytes): 10,923 MiB
    m4 = explain(LOGS["metal-ci-m4-pythia-q4k-metal-mapped"].text)["unified"]
    assert "recommendedMaxWorkingSetSize (10,923 MiB here)" in m4
    assert explain(LOGS["rocm-kv-oom-qwen35-27b-rx9060xt"].text)["unified"] is None  # an RX 9060 XT has its own


def test_expert_logging_is_asked_for_only_where_it_would_show_experts():
    assert not explain(LOGS["cpu-ci-x86-pythia-q4_0-cpu-aarch64-repack"].text)["expert_logging"]  # n_expert = 0
    moe = LOGS["cuda-single-qwen-moe-fit-partial-experts-4090-2026"].text
    assert explain(moe)["expert_logging"]
    # a verbose log already shows every override: the line llama-server prints at -v (ggml-org/llama.cpp#23269)
    verbose = "0.00.073.306 I log_info: verbosity = 2147483647 (adjust with the `-lv N` CLI arg)\n"
    assert not explain(verbose + moe)["expert_logging"]
    assert "run with -v" not in render(explain(verbose + moe))


def test_flash_attention_turned_off_by_llama_cpp_is_explained_with_its_cause():
    """llama-bench on ROCm0 with -ctk q8_0 -ctv q5_1 (ggml-org/llama.cpp#25007): the layer on ROCm0, its
    flash-attention step on the CPU, and the mixed cache types asked."""
    log = LOGS["rocm-bench-flash-attention-auto-off-q5-1-v-cache"]
    said = explain(log.text)["flash_attention"]
    want = log.expect["flash_attention"]
    assert f"layer {want['layer']} runs on {want['device']}, but its flash-attention step would run on CPU" in said
    assert "-ctk q8_0 -ctv q5_1 are asked here" in said and "quantized V cache is refused" in said
    assert explain(LOGS["vulkan-ok-f16-kv-60-layers"].text)["flash_attention"] is None


def test_a_feature_tables_flag_column_is_no_gpu():
    """ggml-sycl prints an optimisation-feature table after its device table (ipex-llm's quickstart output on an
    Arc A770); its Y/N column names no card, and a dense model gets no advice to log its experts."""
    found = explain(LOGS["sycl-a770-ipex-llm-feature-table-mistral-7b"].text)
    assert found["gpus"] == ["Intel Arc A770 Graphics"]
    assert not found["expert_logging"] and "run with -v" not in render(found)


def test_several_gpus_get_the_split_fix_in_numbers_not_a_one_card_plan():
    """The KV failure on CUDA3 after CUDA0-CUDA2 took 3,840 MiB each (gpustack#1269), with each card's free memory
    at load given as llama.cpp prints it: the split put too much on CUDA3."""
    using = "".join(
        f"llama_model_load_from_file_impl: using device CUDA{i} (NVIDIA GeForce RTX 4090) - {free} MiB free\n"
        for i, free in enumerate((23000, 23000, 23000, 4000))
    )
    found = explain(using + LOGS["cuda-oom-kv-deepseek-r1-timestamped-4090s"].text)
    todo = found["oom"]["todo"]
    assert "the split put too much on CUDA3" in todo and "-ts 10,10,10,2" in todo
    assert "--n-cpu-moe" in todo and "--fit on" in todo and "dry run" not in render(found)
    assert "--vram 23000MiB,23000MiB,23000MiB,4000MiB " in found["fix"]
