"""The emulated device's slow host side: a cpu cgroup that holds llama-bench to its share only while a run is
timed (its --progress lines say when), and a label that says so or says why not."""

from __future__ import annotations

import sys

import pytest

from moeplace.core.config import DeviceTarget
from moeplace.runtime import device
from moeplace.runtime.cgroup import CPU_PERIOD_US, cgroup_support, cpu_limits
from moeplace.runtime.device import DeviceSetup, device_setup, host_side
from moeplace.runtime.process import run

CPU_CGROUPS = cgroup_support("cpu")
SLOWDOWN = 8

# A llama-bench stand-in: spins for 0.6 s in each phase llama-bench announces, then prints how far it got.
PHASES = """
import sys, time
def spin(seconds):
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        count += 1
    return count
counts = []
for phase in ("depth run 1/1", "prompt run 1/1", "generation run 1/1"):
    print(f"llama-bench: benchmark 1/1: {phase}", file=sys.stderr, flush=True)
    counts.append(spin(0.6))
print(*counts)
"""


def test_cpu_limits_hold_a_share_of_a_core_or_nothing():
    assert cpu_limits(1, 1 / SLOWDOWN) == {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": "2000"}
    assert cpu_limits(1, None)["cpu.cfs_quota_us"] == "-1"
    assert cpu_limits(2, 1 / SLOWDOWN) == {"cpu.max": f"2000 {CPU_PERIOD_US}"}
    assert cpu_limits(2, None) == {"cpu.max": f"max {CPU_PERIOD_US}"}
    assert cpu_limits(2, 0.001) == {"cpu.max": f"1000 {CPU_PERIOD_US}"}  # the kernel's smallest quota


@pytest.mark.skipif(CPU_CGROUPS is not None, reason=f"no usable cpu cgroup: {CPU_CGROUPS}")
def test_the_host_side_is_slowed_while_timed_and_free_for_the_depth_fill():
    setup = DeviceSetup("emulated", "test", 2**30, host_slowdown=SLOWDOWN)
    with host_side(setup, (0,)) as host:
        result = run([sys.executable, "-c", PHASES], before_exec=host.enter, on_stderr_line=host.on_line)
    assert result.ok, result.stderr
    fill, prompt, generation = (int(c) for c in result.stdout.split())
    # 1/8 of the core while timed: far fewer loops than in the free fill (a loaded CI host blurs the 8x)
    assert fill / prompt > SLOWDOWN / 2 and fill / generation > SLOWDOWN / 2, (fill, prompt, generation)
    assert "depth run" in result.stderr  # the lines still reach the log


def test_the_label_says_the_host_is_slowed_or_why_not(monkeypatch):
    target = DeviceTarget("emulated", "", 135 * 2**20, host_slowdown=SLOWDOWN)
    monkeypatch.setattr(device, "cgroup_site", lambda controller: "no cpu cgroup: a test")
    setup = device_setup(target, {})
    assert setup.host_slowdown == 1 and setup.label.endswith("host side not slowed (no cpu cgroup: a test)")
    monkeypatch.setattr(device, "cgroup_site", lambda controller: object())
    setup = device_setup(target, {})
    assert setup.host_slowdown == SLOWDOWN and "host side held to 1/8 of its CPU time while timed" in setup.label
    assert device_setup(DeviceTarget("emulated", "", 2**27), {}).host_slowdown == 1  # not asked for


def test_a_line_handler_that_fails_never_stalls_the_child():
    """A cgroup write refused mid-run: the run goes on (its stderr, more than a pipe holds, still read whole)."""

    def refuse(line: str) -> None:
        raise PermissionError(13, "Permission denied", "cpu.cfs_quota_us")

    loud = "import sys\nfor i in range(4000): print('llama-bench: benchmark 1/1: prompt run', i, file=sys.stderr)"
    result = run([sys.executable, "-c", loud], on_stderr_line=refuse, timeout_s=60)
    assert result.ok and not result.timed_out
    assert result.stderr.count("prompt run") == 4000
    assert result.stderr.count("moeplace: stopped following this output: [Errno 13] Permission denied") == 1
