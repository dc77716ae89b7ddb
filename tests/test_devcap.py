"""Issue #15: the devcap shim's table and alignments, unreadable OOM counts, and --config lists of numbers."""

from __future__ import annotations

import copy
import errno
import os
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT
from workflow_helpers import snakemake, workflow_copy

from moeplace.core.config import validate_config
from moeplace.core.errors import MoeplaceError
from moeplace.runtime.cgroup import MemoryCgroup
from moeplace.runtime.native import build_native

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
SEED = yaml.safe_load((ROOT / "config/examples/seed-qwen3-coder-30b-a3b.yaml").read_text())
PAGE = os.sysconf("SC_PAGE_SIZE")

# --- devcap: every aligned allocation is counted, and a full table never hangs ----------------------

ALLOCATOR = r"""
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MANY 70000 /* more than the old table's 65,536 slots */

static long avail(void) { return sysconf(_SC_AVPHYS_PAGES) * sysconf(_SC_PAGESIZE); }

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "many")) {
        static void *p[MANY];
        for (int i = 0; i < MANY; i++) {
            int rc = posix_memalign(&p[i], 64, 16);
            if (rc) { printf("refused=%d rc=%d\n", i, rc); return 1; }
        }
        printf("live=%ld\n", avail());
        for (int i = 0; i < MANY; i++) free(p[i]);
        printf("freed=%ld\n", avail());
        return 0;
    }
    void *a = NULL, *b = NULL;
    printf("pm128=%d\n", posix_memalign(&a, 128, 768 << 10));
    printf("pm4096=%d\n", posix_memalign(&b, 4096, 512 << 10));
    printf("aligned_alloc=%d\n", aligned_alloc(4096, 512 << 10) != NULL);
    printf("memalign=%d\n", memalign(256, 512 << 10) != NULL);
    free(a);
    printf("after_free=%d\n", posix_memalign(&b, 4096, 512 << 10));
    printf("avail=%ld\n", avail());
    return 0;
}
"""


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """Run the test allocator under the devcap shim with a cap: its key=value lines as a dict."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the devcap shim and its test program")
    work = tmp_path_factory.mktemp("devcap")
    shim = build_native("devcap", work / "build.log", shared=True)
    (work / "allocator.c").write_text(ALLOCATOR)
    subprocess.run(["cc", "-O0", "-o", work / "allocator", work / "allocator.c"], check=True, timeout=120)

    def run(cap_bytes: int, *args: str) -> dict[str, int]:
        env = {**os.environ, "LD_PRELOAD": str(shim), "MOEPLACE_DEVICE_CAP_BYTES": str(cap_bytes)}
        try:
            done = subprocess.run(
                [work / "allocator", *args], env=env, capture_output=True, text=True, timeout=30, check=False
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"the allocator hung under devcap ({' '.join(args) or 'aligned'})")
        assert done.returncode == 0, done.stdout + done.stderr
        return {k: int(v) for k, v in (line.split("=") for line in done.stdout.split())}

    return run


def test_devcap_tracks_more_allocations_than_its_first_table_without_hanging(capped):
    cap = 2**30
    out = capped(cap, "many")
    assert out["live"] == (cap - 70000 * 16) // PAGE * PAGE  # every live allocation counted, exactly
    assert out["freed"] == cap  # and every one released


def test_devcap_counts_every_alignment_and_refuses_what_would_not_fit(capped):
    out = capped(2**20)
    assert out["pm128"] == 0  # 768 KiB of the 1 MiB cap
    assert out["pm4096"] == errno.ENOMEM  # 512 KiB more would not fit, whatever the alignment
    assert out["aligned_alloc"] == 0 and out["memalign"] == 0
    assert out["after_free"] == 0 and out["avail"] == 512 << 10  # freed memory is given back to the cap


# --- cgroup: an unreadable OOM count is not a count of 0 ---------------------------------------------


def test_an_unreadable_oom_count_is_an_error_not_zero(tmp_path):
    (tmp_path / "memory.events").mkdir()  # reading it fails (a directory), even as root
    with pytest.raises(MoeplaceError) as err:
        MemoryCgroup(tmp_path, 2).oom_kills()
    assert "memory.events" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(MoeplaceError, match="memory.oom_control"):
        MemoryCgroup(tmp_path, 1).oom_kills()


def test_the_oom_count_falls_back_to_memory_events_local(tmp_path):
    (tmp_path / "memory.events").mkdir()
    (tmp_path / "memory.events.local").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert MemoryCgroup(tmp_path, 2).oom_kills() == 1


def test_readable_oom_counts_are_read(tmp_path):
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    assert MemoryCgroup(tmp_path, 2).oom_kills() == 0
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert MemoryCgroup(tmp_path, 1).oom_kills() == 2


# --- config: Snakemake's --config gives list items as strings -----------------------------------------


def test_numeric_strings_become_the_numbers_the_schema_wants():
    cfg = copy.deepcopy(SEED)
    cfg["contexts"] = [8192, "32768"]
    cfg["device"].update(bw_vram_gbps="640.5", name="16")
    cfg["bench"] = {"repetitions": "3", "n_cpu_moe": ["0", "8"]}
    cfg["ram_tier"] = {"caps_pct": ["50"], "enabled": "false", "readahead_kb": "null"}
    validate_config(cfg, SCHEMA)
    assert cfg["contexts"] == [8192, 32768] and all(type(c) is int for c in cfg["contexts"])
    assert cfg["device"]["bw_vram_gbps"] == 640.5 and cfg["device"]["name"] == "16"  # a string field stays one
    assert cfg["bench"]["repetitions"] == 3 and cfg["bench"]["n_cpu_moe"] == [0, 8]
    assert cfg["ram_tier"]["caps_pct"] == [50] and cfg["ram_tier"]["enabled"] is False
    assert cfg["ram_tier"]["readahead_kb"] is None


@pytest.mark.parametrize("value", ["abc", "8k", "1.5"])
def test_a_string_that_is_not_the_number_wanted_still_names_the_field(value):
    cfg = copy.deepcopy(SEED)
    cfg["contexts"] = [8192, value]
    with pytest.raises(MoeplaceError) as err:
        validate_config(cfg, SCHEMA)
    assert str(err.value) == f"config: contexts.1: {value!r} is not of type 'integer'."


TARGET = "results/tables/budget/qwen3-coder-30b-a3b.csv"


def test_a_list_of_numbers_given_with_snakemake_config_is_accepted(tmp_path):
    wd = workflow_copy(tmp_path, SEED)
    run = snakemake(wd, "-n", TARGET, "--config", "contexts=[8192,32768]", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    bad = snakemake(wd, "-n", TARGET, "--config", "contexts=[8192,abc]", timeout=300)
    assert bad.returncode != 0
    lines = [line for line in bad.stderr.splitlines() if line.startswith("moeplace:")]
    assert lines == ["moeplace: config: contexts.1: 'abc' is not of type 'integer'."], bad.stderr[-3000:]


def test_flash_attention_is_asked_for_alike_everywhere(tmp_path):
    """The CLI's llama-server line, its llama-bench line and the pipeline's llama-bench command all turn flash
    attention on exactly when llama.cpp needs it: a quantized V cache (a quantized K cache runs without)."""
    from moeplace.core.config import BenchSettings
    from moeplace.plan import commands
    from moeplace.runtime.llamacpp import bench_command

    (tmp_path / "llama-bench").touch()  # bench_command only names the binary
    manifest = {"bin_dir": str(tmp_path)}
    for type_k, type_v, fa in (
        ("f16", "f16", False),
        ("q8_0", "f16", False),
        ("f16", "q8_0", True),
        ("q8_0", "q4_0", True),
    ):
        server = commands.llama_server("m.gguf", 4096, 3, type_k, type_v)
        bench_line = commands.llama_bench("m.gguf", 4096, 3, type_k, type_v)
        settings = BenchSettings(16, 4, 1, 2, 60, type_k=type_k, type_v=type_v)
        pipeline = " ".join(bench_command(manifest, "m.gguf", 4096, 3, settings, None))
        assert [("-fa on" in cmd) for cmd in (server, bench_line, pipeline)] == [fa] * 3, (type_k, type_v)
