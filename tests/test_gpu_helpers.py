"""Our CUDA helpers against a stand-in driver (host memory behind the driver API): the memory holder leaves
exactly the cap free and never outlives the job that started it (stopped when the job ends, killed with it when
the job dies); the link probe's facts reach the speed model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKE_DRIVER = r"""
#include <stdlib.h>
#include <string.h>
static unsigned long long total, free_bytes;
int cuInit(unsigned f) {
    if (total) return 0;
    total = strtoull(getenv("FAKE_TOTAL"), 0, 10);
    free_bytes = strtoull(getenv("FAKE_FREE"), 0, 10);
    return 0;
}
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
static unsigned long long context(void) { return strtoull(getenv("FAKE_CONTEXT"), 0, 10); }
int cuCtxCreate_v2(void **c, unsigned f, int d) { free_bytes -= context(); *c = (void *)1; return 0; }
int cuCtxDestroy_v2(void *c) { free_bytes += context(); return 0; }
int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = free_bytes; *t = total; return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
    if (n > free_bytes) return 2;
    free_bytes -= n;
    *p = (unsigned long long)malloc(n); /* untouched: the holder's gigabytes stay virtual */
    return 0;
}
int cuMemAllocHost_v2(void **p, size_t n) { *p = malloc(n); return 0; }
int cuMemcpyDtoD_v2(unsigned long long d, unsigned long long s, size_t n) { memcpy((void *)d, (void *)s, n); return 0; }
int cuMemcpyHtoD_v2(unsigned long long d, const void *s, size_t n) { memcpy((void *)d, s, n); return 0; }
int cuMemcpyDtoH_v2(void *d, unsigned long long s, size_t n) { memcpy(d, (void *)s, n); return 0; }
int cuCtxSynchronize(void) { return 0; }
"""
GiB = 2**30
CONTEXT = 300 * 2**20  # what one CUDA context takes of the card


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    source = tmp_path / "fakecuda.c"
    source.write_text(FAKE_DRIVER)
    lib = tmp_path / "libfakecuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    monkeypatch.setenv("MOEPLACE_CUDA_DRIVER", str(lib))
    monkeypatch.setenv("FAKE_TOTAL", str(24 * GiB))
    monkeypatch.setenv("FAKE_FREE", str(23 * GiB))
    monkeypatch.setenv("FAKE_CONTEXT", str(CONTEXT))
    return tmp_path


def holders() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "moeplace-gpuhold-"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_the_holder_leaves_the_cap_and_a_context_free_and_stops_with_the_job(fake_gpu):
    from moeplace.runtime.device import gpu_held

    log = fake_gpu / "job.log"
    with gpu_held(8 * GiB, log):
        (line,) = re.findall(r"held (\d+) free (\d+) total (\d+) context (\d+)", log.read_text())
        held, free, total, context = map(int, line)
        assert context == CONTEXT  # the job's process will make one: the cap is what its buffers get
        assert 8 * GiB + CONTEXT <= free < 8 * GiB + CONTEXT + 2 * 2**20
        assert held + free == 23 * GiB - CONTEXT and total == 24 * GiB
        assert len(holders()) == 1
    assert holders() == []


def test_the_holder_dies_with_a_killed_job(fake_gpu):
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom moeplace.runtime.device import gpu_held\n"
        f"with gpu_held({8 * GiB}, Path(sys.argv[1])):\n    print('ready', flush=True)\n    time.sleep(120)"
    )
    job = subprocess.Popen([sys.executable, "-c", code, str(fake_gpu / "job.log")], stdout=subprocess.PIPE, text=True,
                           env=os.environ)  # fmt: skip
    assert job.stdout.readline().strip() == "ready"
    assert len(holders()) == 1
    job.send_signal(signal.SIGKILL)  # no cleanup runs: only the kernel's parent-death signal is left
    job.wait()
    deadline = time.monotonic() + 10
    while holders() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert holders() == []


def test_a_missing_driver_is_one_clear_line(tmp_path, monkeypatch):
    from moeplace.core.errors import MoeplaceError
    from moeplace.runtime.device import gpu_held

    monkeypatch.setenv("MOEPLACE_CUDA_DRIVER", str(Path(tmp_path) / "nope.so"))
    with pytest.raises(MoeplaceError, match="the GPU memory holder exited"), gpu_held(GiB, tmp_path / "job.log"):
        pass
    assert "cannot load the CUDA driver" in (tmp_path / "job.log").read_text()


def test_the_link_probe_measures_every_fact_and_the_prior_takes_the_card_and_the_hop(fake_gpu):
    import pandas as pd

    from moeplace.core.config import Bandwidths
    from moeplace.plan.measured_prior import measured_bandwidths
    from moeplace.plan.speed import prior
    from moeplace.runtime.device import LINK_FACTS, link_facts

    facts = link_facts(fake_gpu / "job.log", nbytes=8 * 2**20, trials=2)
    assert set(facts) == set(LINK_FACTS) and all(v > 0 for v in facts.values())
    rows = [{"ceiling": LINK_FACTS[k][0], "value": v} for k, v in facts.items()]
    rows += [{"ceiling": "ram_read", "threads": 2, "value": 9.0}, {"ceiling": "device_decode", "value": 50.0}]
    measured = measured_bandwidths(pd.DataFrame(rows))
    assert measured["bw_vram_gbps"] == facts["device_copy_gbps"] and measured["bw_ddr_gbps"] == 9.0
    assert measured["hop_s"] == pytest.approx(facts["round_trip_us"] * 1e-6 / 2)
    bw = Bandwidths(900, 60, measured_vram_gbps=measured["bw_vram_gbps"], measured_hop_s=measured["hop_s"])
    tg = prior(bw).tests["tg"]
    assert tg.coef["hops"] == measured["hop_s"] and tg.source["hops"] == "ceilings"
    assert tg.coef["device_gb"] == 1 / facts["device_copy_gbps"] and tg.source["device_gb"] == "ceilings"
    assert prior(Bandwidths(900, 60)).tests["tg"].coef["hops"] == 0  # no card measured: hops cost nothing


def test_a_missing_driver_stops_the_link_probe_with_one_line(tmp_path, monkeypatch):
    from moeplace.core.errors import MoeplaceError
    from moeplace.runtime.device import link_facts

    monkeypatch.setenv("MOEPLACE_CUDA_DRIVER", str(tmp_path / "nope.so"))
    with pytest.raises(MoeplaceError, match="measuring the GPU's links failed.*cannot load the CUDA driver"):
        link_facts(tmp_path / "job.log")
