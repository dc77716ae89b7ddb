"""Speculative decoding's memory (model/draft.py) and unified memory's one pool (plan/unified.py), on header-only
twins: sizes checked against arithmetic from the models' published shapes, refusals as one line."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest
from conftest import ROOT

from moeplace.core.config import Device
from moeplace.core.errors import MoeplaceError
from moeplace.model.draft import draft_need, read_speculative
from moeplace.model.kvcache import pad
from moeplace.model.memory import SERVER, Workload, device_need, state_bytes
from moeplace.model.metadata import inspect_model
from moeplace.model.twin import load_spec, write_twin
from moeplace.plan.budget import DOES_NOT_FIT, FITS, Beside, does_not_fit_message, plan
from moeplace.plan.unified import GiB, pool_for, read_mac, smallest_pool

MODELS = ROOT / "config/models"


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("twins")
    names = ("qwen3-coder-30b-a3b", "qwen3-1.7b", "tiny-qwen35moe", "tiny-qwen3moe", "gpt-oss-120b", "gpt-oss-20b")
    return {n: str(write_twin(load_spec(MODELS / f"{n}.yaml"), folder / f"{n}.gguf")) for n in names}


def test_a_draft_model_holds_the_main_context_in_its_own_kv_types(twins):
    """Qwen3-1.7B (28 layers, 8 KV heads of 128) drafting for Qwen3-Coder-30B-A3B at 32K: its KV cache is the
    main context's length (the pinned llama.cpp has no -cd), in -ctkd/-ctvd's types, not -ctk/-ctv's."""
    meta = inspect_model(twins["qwen3-coder-30b-a3b"])
    spec = read_speculative(None, twins["qwen3-coder-30b-a3b"], twins["qwen3-1.7b"])
    w = Workload(32768, type_k="q8_0", type_v="q8_0", outputs=SERVER)
    need = draft_need(spec, meta, w, 0)
    assert need.kv == 28 * 2 * 8 * 128 * 2 * 32768  # f16 K and V rows at the main's 32768 cells: 3.5 GiB
    q8 = draft_need(replace(spec, type_k="q8_0", type_v="q8_0"), meta, w, 0)
    assert q8.kv == 28 * 2 * 8 * 128 // 32 * 34 * 32768  # q8_0: 34 bytes a block of 32
    assert need.weights == spec.draft.total_bytes - spec.draft.global_bytes["token_embd"]  # the input layer stays
    # the main context reserves logits for 1 + 3 tokens a slot while drafting, one without
    assert spec.main(meta, w).n_outputs == 4 and w.n_outputs == 1
    assert spec.llama_args("d.gguf") == ["-md", "d.gguf", "-ngld", "all", "--spec-type", "draft-simple"]


def test_the_draft_s_buffers_take_experts_off_the_card(twins):
    """The plan counts the draft: the smallest --n-cpu-moe grows by the experts the draft's buffers displace."""
    meta = inspect_model(twins["qwen3-coder-30b-a3b"])
    spec = read_speculative(None, twins["qwen3-coder-30b-a3b"], twins["qwen3-1.7b"])
    card, w = Device(16 * GiB, 768 * 2**20), Workload(32768, outputs=SERVER, op_offload=True)
    alone, drafting = plan(meta, card, w), plan(meta, card, w, beside=Beside(spec))
    assert drafting["n_cpu_moe"] > alone["n_cpu_moe"]
    total = drafting["draft_weights_bytes"] + drafting["draft_kv_bytes"] + drafting["draft_compute_bytes"]
    main = device_need(meta, spec.main(meta, w), drafting["n_cpu_moe"])
    assert main.total + total + card.kept_free <= card.vram_bytes
    assert drafting["spec_type"] == "draft-simple" and "spec_type" not in alone


def test_an_mtp_head_is_its_layer_weights_and_its_kv(twins):
    """tiny-qwen35moe's NextN block (layer 4 of 5, full attention, 1 KV head of 64): loaded for draft-mtp only, its
    KV the MTP context's; the main context's recurrent state keeps 3 rollback snapshots (qwen35moe rolls back)."""
    path = twins["tiny-qwen35moe"]
    meta = inspect_model(path)
    spec = read_speculative("draft-mtp", path, None)
    (head,) = spec.head
    assert head.index == 4 and head.has_kv and sum(head.bytes.values()) == meta.nextn_bytes
    w = Workload(4096, outputs=SERVER)
    need = draft_need(spec, meta, w, 0)
    assert need.weights == meta.nextn_bytes and need.kv == pad(4096) * 2 * 64 * 2
    main = device_need(meta, spec.main(meta, w), 0)
    assert main.kv - device_need(meta, w, 0).kv == 3 * state_bytes(meta)
    # --n-cpu-moe past the head's layer takes its experts too
    assert draft_need(spec, meta, w, 5).weights == meta.nextn_bytes - head.expert_bytes


@pytest.mark.parametrize(
    ("kind", "main", "draft", "says"),
    [
        ("draft-simple", "qwen3-coder-30b-a3b", "tiny-qwen3moe", "vocabulary has 4096 tokens, the model's 151936"),
        ("draft-mtp", "qwen3-coder-30b-a3b", None, "has no MTP/NextN head"),
        ("draft-mtp", "tiny-qwen35moe", "qwen3-1.7b", "the MTP head is the model's own"),
        ("ngram-simple", "tiny-qwen35moe", None, "moeplace plans draft-simple or draft-mtp"),
    ],
)
def test_what_llama_cpp_refuses_is_refused_in_one_line(twins, kind, main, draft, says):
    with pytest.raises(MoeplaceError, match=says) as e:
        read_speculative(kind, twins[main], twins[draft] if draft else None)
    assert "\n" not in str(e.value)


def test_a_mac_s_working_set_cap_is_its_default_share_or_the_limit_set():
    assert pool_for(16 * GiB, "metal").cap_bytes >> 20 == 10922  # llama.cpp logs 11453.25 MB on a 16 GB Mac
    assert pool_for(32 * GiB, "metal").cap_bytes >> 20 == 21845  # 22906.50 MB on a 32 GB one
    assert pool_for(64 * GiB, "metal").cap_bytes >> 20 == 49152
    assert pool_for(128 * GiB, "rocm").cap_bytes == 64 * GiB  # an APU: TTM's half
    assert pool_for(36 * GiB, "metal", 32768).cap_bytes == 32 * GiB
    with pytest.raises(MoeplaceError, match="--wired-limit 40000"):
        pool_for(36 * GiB, "metal", 40000)


def test_vram_auto_reads_a_mac_s_sysctl():
    values = {"hw.memsize": str(48 * GiB), "iogpu.wired_limit_mb": "0"}
    pool = read_mac("metal", lambda name: values[name] + "\n")
    assert pool.ram_bytes == 48 * GiB and pool.cap_bytes == 32 * GiB and "default" in pool.cap_source
    values["iogpu.wired_limit_mb"] = "40960"
    assert read_mac("metal", values.__getitem__).cap_bytes == 40 * GiB
    assert read_mac("metal", lambda name: "") is None  # not a Mac


def test_gpt_oss_120b_does_not_fit_a_36_gb_mac_and_a_larger_one_is_named(twins):
    """The issue's case: 61 GiB of weights on a 36 GiB Mac. Planned as two pools it 'fit' with 28 GB on the host; as
    one pool it does not, whatever --n-cpu-moe, and the smallest Mac that holds it is named."""
    meta = inspect_model(twins["gpt-oss-120b"])
    w = Workload(32768, outputs=SERVER)
    pool = pool_for(36 * GiB, "metal")
    p = plan(meta, Device(pool.cap_bytes, 1024 * 2**20), w, beside=Beside(pool=pool))
    assert p["status"] == DOES_NOT_FIT and p["pool_used_bytes"] > pool.ram_bytes
    assert "experts on the CPU do not help" in does_not_fit_message(p, pool.cap_bytes)

    def fits(bigger):
        return plan(meta, Device(bigger.cap_bytes, 1024 * 2**20), w, beside=Beside(pool=bigger))["status"] == FITS

    assert smallest_pool(fits, "metal").ram_bytes == 96 * GiB
    small = inspect_model(twins["gpt-oss-20b"])
    assert plan(small, Device(pool.cap_bytes, 1024 * 2**20), w, beside=Beside(pool=pool))["status"] == FITS


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from moeplace.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_emitted_form_carries_the_draft(twins, capsys):
    """server, llama-swap, Ollama's environment and JSON carry -md, -ngld all and --spec-type as the pinned
    llama-server spells them; --ctx max counts the draft."""
    main, draft = twins["qwen3-coder-30b-a3b"], twins["qwen3-1.7b"]
    base = [main, "--vram", "24GiB", "--backend", "cuda", "-md", draft, "-ctkd", "q8_0", "-ctvd", "q8_0"]
    base += ["--flash-attn", "on"]
    code, out, err = _cli(capsys, "recommend", *base, "--ctx", "32768", "--json")
    assert code == 0, err
    (p,) = json.loads(out)
    flags = ["-md", draft, "-ngld", "all", "--spec-type", "draft-simple", "-ctkd", "q8_0", "-ctvd", "q8_0"]
    assert shlex.join(flags) in p["command"] and p["draft_kv_bytes"] == 28 * 2 * 8 * 128 // 32 * 34 * 32768
    server = [line.strip() for line in _cli(capsys, "recommend", *base, "--ctx", "32768")[1].splitlines()]
    assert p["command"] in server and any(line.startswith("draft (draft-simple): ") for line in server)
    swap = _cli(capsys, "recommend", *base, "--ctx", "32768", "--emit", "llama-swap")[1]
    assert shlex.join(flags) in swap.replace('\\"', '"')
    ollama = _cli(capsys, "recommend", *base, "--ctx", "32768", "--emit", "ollama")[1]
    assert f"LLAMA_ARG_SPEC_DRAFT_MODEL={draft}" in ollama and "LLAMA_ARG_SPEC_TYPE=draft-simple" in ollama
    assert "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K=q8_0" in ollama
    (longest,) = json.loads(_cli(capsys, "recommend", *base, "--ctx", "max", "--json")[1])
    (alone,) = json.loads(_cli(capsys, "recommend", *base[:5], "--flash-attn", "on", "--ctx", "max", "--json")[1])
    assert longest["ctx"] < alone["ctx"]  # the draft's KV grows with the context too


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-cd", "4096"], "-cd 4096: the pinned llama.cpp (b11434) has no --ctx-size-draft"),
        (["-md", "/nonexistent.gguf", "-ngld", "10"], "-ngld 10: moeplace plans the draft wholly on the card"),
        (["--spec-type", "draft-simple"], "give it with -md DRAFT.gguf"),
        (["--draft-max", "0"], "--draft-max 0: draft 1 to 64 tokens"),
        (["-md", "/nonexistent.gguf"], "-md /nonexistent.gguf: no such file"),
        (["--unified", "--backend", "rpc"], "--unified with --backend rpc"),
        (["--wired-limit", "20000"], "--wired-limit is a unified-memory GPU's cap"),
    ],
)
def test_bad_draft_and_unified_flags_get_one_line(twins, capsys, args, says):
    code, _, err = _cli(capsys, "recommend", twins["tiny-qwen3moe"], "--vram", "8GiB", "--ctx", "4096", *args)
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_a_mac_is_planned_as_one_pool(twins, capsys, monkeypatch):
    """--backend metal: --vram is the Mac's memory, the GPU's cap its default share (or --wired-limit); the plan
    says the pool; --vram auto reads sysctl (a fake one here: this machine is not a Mac)."""
    path = twins["gpt-oss-20b"]
    code, out, err = _cli(capsys, "recommend", path, "--backend", "metal", "--vram", "36GiB", "--ctx", "32768")
    assert code == 0, err
    assert "unified memory: 36.0 GiB shared by the GPU, the CPU and the OS" in out and "24.0 GiB" in out
    (p,) = json.loads(_cli(capsys, "recommend", path, "--backend", "metal", "--vram", "36GiB", "--ctx", "32768",
                           "--wired-limit", "30720", "--json")[1])  # fmt: skip
    assert p["assumptions"]["vram_bytes"] == 30 * GiB and p["pool_ram_bytes"] == 36 * GiB
    values = {"hw.memsize": str(48 * GiB), "iogpu.wired_limit_mb": "0"}
    monkeypatch.setattr("moeplace.plan.unified.read_sysctl", values.__getitem__)
    (p,) = json.loads(_cli(capsys, "recommend", path, "--backend", "metal", "--vram", "auto", "--ctx", "8192",
                           "--json")[1])  # fmt: skip
    assert p["assumptions"]["pool"]["ram_bytes"] == 48 * GiB and p["assumptions"]["vram_bytes"] == 32 * GiB
    code, _, err = _cli(capsys, "recommend", twins["gpt-oss-120b"], "--backend", "metal", "--vram", "36GiB", "--ctx",
                        "32768")  # fmt: skip
    assert code == 1 and "experts on the CPU do not help" in err and "fix: a Mac with 96 GB" in err


def test_the_library_call_takes_a_draft_and_a_mac(twins):
    """moeplace.recommend(..., draft=...) plans the draft and every tool's line carries it; a Mac's pool likewise."""
    import moeplace

    rec = moeplace.recommend(twins["qwen3-coder-30b-a3b"], ctx=32768, vram="24GiB", backend="cuda",
                             draft=twins["qwen3-1.7b"])  # fmt: skip
    (p,) = rec.plans
    assert p["spec_type"] == "draft-simple" and p["draft_kv_bytes"] == 28 * 2 * 8 * 128 * 2 * 32768
    assert all(f"-md {twins['qwen3-1.7b']}" in p["commands"][tool] for tool in ("server", "llama-swap"))
    assert "LLAMA_ARG_SPEC_DRAFT_MODEL" in p["commands"]["ollama"] and "-md" not in p["commands"]["bench"]
    mac = moeplace.recommend(twins["gpt-oss-120b"], ctx=32768, vram="36GiB", backend="metal")
    assert not mac.fits and any("a Mac with 96 GB" in line for line in mac.errors())


def test_a_unified_machine_s_host_side_reads_the_chip_s_memory(twins, capsys):
    """On an M4 Pro (273 GB/s, Apple's figure) experts "on the host" are read from the same unified memory: the
    plan's host figure and the prior's link are the chip's 273 GB/s, not a PC's DDR5 default (57.6)."""
    path = twins["gpt-oss-20b"]
    (p,) = json.loads(_cli(capsys, "recommend", path, "--card", "M4 Pro 48GB", "--ctx", "8192", "--json")[1])
    a = p["assumptions"]
    assert a["bw_vram_gbps"] == a["bw_ddr_gbps"] == 273
    assert "the host side: the same unified memory, 273 GB/s" in a["speed_source"]
    (pc,) = json.loads(_cli(capsys, "recommend", path, "--card", "RTX 4090", "--ctx", "8192", "--json")[1])
    assert pc["assumptions"]["bw_ddr_gbps"] == 57.6
