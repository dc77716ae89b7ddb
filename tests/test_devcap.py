"""The devcap shim that caps an emulated device's memory: it counts every live allocation, past its first table's
65,536 slots, without hanging; every alignment call (posix_memalign, aligned_alloc, memalign) is counted, what
would not fit is refused with ENOMEM, and freed memory is given back to the cap."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from moeplace.runtime.native import build_native

PAGE = os.sysconf("SC_PAGE_SIZE")

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
