"""Every reader of llama.cpp's output on real output from real cards: the corpus in tests/data/llamacpp/, each file
with the values a person typed by hand from its text (its README says how)."""

from __future__ import annotations

import re

import pytest
from corpus import CORPUS, ids, samples

from moeplace.runtime import llama_log, llama_names, tool_output

MiB = 2**20
LOGS = samples("log")
LIST_DEVICES = samples("list-devices")
BENCH = samples("bench-json", "bench-jsonl", "bench-csv", "bench-md")
# What moeplace reads of the GPU tools: nvidia-smi's CSV query (backend.py) and rocm-smi. The corpus keeps plain
# nvidia-smi tables too, as pasted in issues; nothing in moeplace reads them.
SMI = samples("nvidia-smi-csv", "rocm-smi")
# llama-fit-params' arguments and log lines; its --fit-print estimate table is in the corpus, read by nothing here.
FIT = [s for s in samples("fit-params") if "printing estimated memory" not in s.text]


def _mib(kinds: dict[str, int]) -> dict[str, float]:
    return {kind: round(size / MiB, 2) for kind, size in kinds.items()}


def _approx(expected: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        name: {kind: pytest.approx(mib, abs=0.011) for kind, mib in kinds.items()} for name, kinds in expected.items()
    }


def test_the_corpus_covers_every_backend_and_format():
    found = samples()
    assert len(found) >= 40
    backends = {s.header["backend"] for s in found}
    assert {"cuda", "rocm", "vulkan", "metal", "sycl", "cpu"} <= backends
    formats = {s.format for s in found}
    assert {"log", "list-devices", "bench-json", "bench-jsonl", "bench-csv", "bench-md", "fit-params"} <= formats
    assert {"nvidia-smi-csv", "nvidia-smi-table", "rocm-smi"} <= formats
    for sample in found:
        # a URL, or a file of the stored index of public repositories that gives no URL (said in source_note)
        source = sample.header["source"]
        assert source.startswith("https://") or (
            re.fullmatch(r"code-index:\d+", source) and sample.header.get("source_note")
        ), sample.path.name
        assert sample.text.strip(), sample.path.name
    assert (CORPUS / "README.md").exists()


@pytest.mark.parametrize("sample", LOGS, ids=ids(LOGS))
def test_a_log_is_read_as_a_person_reads_it(sample):
    report = llama_log.read_log(sample.text)
    expect = sample.expect
    buffers = report.buffers
    if "devices" in expect:
        assert {name: _mib(kinds) for name, kinds in buffers.devices.items()} == _approx(expect["devices"])
    if "host" in expect:
        host = {name: _mib(kinds) for name, kinds in buffers.sizes.items() if llama_names.is_host(name)}
        assert host == _approx(expect["host"])
    assert report.status == expect.get("status", "ok")
    if "oom" in expect:
        oom = expect["oom"]
        assert report.oom.stage == oom["stage"], report.oom
        if "device" in oom:
            assert report.oom.device == oom["device"], report.oom
        if "requested_mib" in oom:
            assert report.oom.requested_bytes / MiB == pytest.approx(oom["requested_mib"], abs=0.01)
    if "overridden" in expect:
        counts: dict[str, int] = {}
        for target in report.overridden.values():
            counts[target] = counts.get(target, 0) + 1
        assert counts == expect["overridden"]
    if "offloaded" in expect:
        assert list(report.offloaded) == expect["offloaded"]
    if "pipeline_copies" in expect:
        assert report.pipeline_parallel
        assert report.pipeline_copies in (expect["pipeline_copies"], None)
    if "free_at_load" in expect:
        assert {d: free / MiB for d, free in report.free_at_load.items()} == expect["free_at_load"]
    if "gpus" in expect:
        assert report.gpus == expect["gpus"]
    assert report.backend == sample.header["backend"] or not report.loads


@pytest.mark.parametrize("sample", LIST_DEVICES, ids=ids(LIST_DEVICES))
def test_list_devices_gives_each_card_and_its_free_memory(sample):
    found = tool_output.list_devices(sample.text)
    expected = sample.expect["devices"]
    assert [(d.name, d.description, d.total_bytes / MiB, d.free_bytes / MiB) for d in found] == [
        (e["name"], e["description"], e["total_mib"], e["free_mib"]) for e in expected
    ]


@pytest.mark.parametrize("sample", BENCH, ids=ids(BENCH))
def test_llama_bench_records_in_every_format(sample):
    records = tool_output.read_bench(sample.text)
    expected = sample.expect["records"]
    total = sample.expect.get("records_total", len(expected))
    assert len(records) == total
    picked = records if len(expected) == total else records[:3] + records[-(len(expected) - 3) :]
    for record, want in zip(picked, expected, strict=True):
        for key, value in want.items():
            got = record.get(key)
            if isinstance(value, float):
                assert got == pytest.approx(value, rel=1e-6), (key, record)
            else:
                assert got == value or str(got) == str(value), (key, record)


@pytest.mark.parametrize("sample", SMI, ids=ids(SMI))
def test_gpu_tools_give_each_cards_memory(sample):
    if sample.format == "nvidia-smi-csv":
        found = tool_output.nvidia_smi_csv(sample.text, tuple(sample.header["query"].split(",")))
    else:
        found = tool_output.rocm_smi(sample.text)
    expected = sample.expect["gpus"]
    assert len(found) == len(expected)
    for gpu, want in zip(found, expected):
        for key, value in want.items():
            assert gpu.get(key) == value, (key, gpu)


@pytest.mark.parametrize("sample", FIT, ids=ids(FIT))
def test_fit_params_arguments_and_memory(sample):
    expect = sample.expect
    if "args" in expect:
        assert tool_output.fitted_args(sample.text) == expect["args"].split()
    buffers = llama_log.read_log(sample.text).buffers
    if "devices" in expect:
        assert {name: _mib(kinds) for name, kinds in buffers.devices.items()} == _approx(expect["devices"])
    if "host" in expect:
        host = {name: _mib(kinds) for name, kinds in buffers.sizes.items() if llama_names.is_host(name)}
        assert host == _approx(expect["host"])


def test_every_corpus_file_is_read_without_an_exception():
    for sample in samples():
        llama_log.read_log(sample.text)
        tool_output.list_devices(sample.text)
