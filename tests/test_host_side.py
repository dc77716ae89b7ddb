"""The emulated device's slow host side: its CPUs made slower (a real-time thread holds each for most of every
millisecond) only while a run is timed (llama-bench's --progress lines say when), and a label that says so or
says why not."""

from __future__ import annotations

import sys

import pytest

from moeplace.core.config import DeviceTarget
from moeplace.runtime import device
from moeplace.runtime.cpus import realtime_refusal
from moeplace.runtime.device import DeviceSetup, device_setup, host_side
from moeplace.runtime.process import run

REALTIME = realtime_refusal()
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


@pytest.mark.skipif(REALTIME is not None, reason=f"the host side cannot be slowed here: {REALTIME}")
def test_the_host_side_is_slowed_while_timed_and_free_for_the_depth_fill(tmp_path):
    setup = DeviceSetup("emulated", "test", 2**30, host_slowdown=SLOWDOWN)
    with host_side(setup, (0,), tmp_path / "log") as host:
        result = run([sys.executable, "-c", PHASES], before_exec=host.enter, on_stderr_line=host.on_line)
    assert result.ok, result.stderr
    fill, prompt, generation = (int(c) for c in result.stdout.split())
    # 1/8 of the core while timed: far fewer loops than in the free fill (a loaded CI host blurs the 8x)
    assert fill / prompt > SLOWDOWN / 2 and fill / generation > SLOWDOWN / 2, (fill, prompt, generation)
    assert "depth run" in result.stderr  # the lines still reach the log


# Work in short bursts between waits, as a host waits on its device: a fixed count of loops (about 0.5 ms on
# this VM), then 2 ms asleep.
BURSTS = """
import sys, time
def bursts():
    worked = 0.0
    for _ in range(100):
        t = time.perf_counter()
        for _ in range(20000):
            pass
        worked += time.perf_counter() - t
        time.sleep(0.002)
    return worked
for phase in ("depth run 1/1", "generation run 1/1"):
    print(f"llama-bench: benchmark 1/1: {phase}", file=sys.stderr, flush=True)
    print(bursts())
"""


@pytest.mark.skipif(REALTIME is not None, reason=f"the host side cannot be slowed here: {REALTIME}")
def test_short_bursts_of_host_work_are_slowed_too(tmp_path):
    """A host that waits on its device between short bursts of work uses far less than 1/8 of its core; a CPU
    quota (what slowed it before) never throttled such a host, so at 32K, where the device's attention takes
    most of a token, experts on the host cost almost nothing. Here each burst itself takes several times longer
    (not 8x: a burst that starts in the core's free part of a millisecond gets that part whole)."""
    setup = DeviceSetup("emulated", "test", 2**30, host_slowdown=SLOWDOWN)
    with host_side(setup, (0,), tmp_path / "log") as host:
        result = run([sys.executable, "-c", BURSTS], before_exec=host.enter, on_stderr_line=host.on_line)
    assert result.ok, result.stderr
    free, slowed = (float(c) for c in result.stdout.split())
    assert slowed / free > SLOWDOWN / 2, (free, slowed)


def test_the_label_says_the_host_is_slowed_or_why_not(monkeypatch):
    target = DeviceTarget("emulated", "", 135 * 2**20, host_slowdown=SLOWDOWN)
    monkeypatch.setattr(device, "realtime_refusal", lambda: "real-time scheduling refused: a test")
    setup = device_setup(target, {})
    assert setup.host_slowdown == 1
    assert setup.label.endswith("host side not slowed (real-time scheduling refused: a test)")
    monkeypatch.setattr(device, "realtime_refusal", lambda: None)
    setup = device_setup(target, {})
    assert setup.host_slowdown == SLOWDOWN and setup.label.endswith("host side 8x slower while timed")
    assert device_setup(DeviceTarget("emulated", "", 2**27), {}).host_slowdown == 1  # not asked for


def test_a_line_handler_that_fails_never_stalls_the_child():
    """A line handler that fails mid-run (the slowing thread gone): the run goes on (its stderr, more than a pipe
    holds, still read whole)."""

    def refuse(line: str) -> None:
        raise ProcessLookupError(3, "No such process")

    loud = "import sys\nfor i in range(4000): print('llama-bench: benchmark 1/1: prompt run', i, file=sys.stderr)"
    result = run([sys.executable, "-c", loud], on_stderr_line=refuse, timeout_s=60)
    assert result.ok and not result.timed_out
    assert result.stderr.count("prompt run") == 4000
    assert result.stderr.count("moeplace: stopped following this output: [Errno 3] No such process") == 1


@pytest.mark.skipif(REALTIME is not None, reason=f"the host side cannot be slowed here: {REALTIME}")
def test_each_timed_run_gets_what_the_kernel_saw_of_it(tmp_path):
    """runtime/noise.py, on a stand-in the kernel names llama-bench: per timed run (prompt, generation; not the
    depth fill) the slowed core's real-time thread held the CPU about 7/8 of the time and the stand-in ran about
    1/8 of it, waiting the rest: the kernel's own accounting (schedstat) of what the slowing is meant to do."""
    stand_in = tmp_path / "llama-bench"
    stand_in.symlink_to(sys.executable)
    setup = DeviceSetup("emulated", "test", 2**30, host_slowdown=SLOWDOWN)
    with host_side(setup, (0,), tmp_path / "log") as host:
        result = run([str(stand_in), "-c", PHASES], before_exec=host.enter, on_stderr_line=host.on_line)
        reps = host.noise.take()
    assert result.ok, result.stderr
    (_, prompt), (_, generation) = reps  # of benchmark 1; the depth fill is not timed
    for seen in (prompt, generation):
        assert 500 < seen["wall_ms"] < 2000 and seen["steal_host_ms"] >= 0, seen
        assert 0.6 < seen["spinner_cpu_ms"] / seen["wall_ms"] < 0.95, seen
    assert prompt["host_cpu_ms"] < 0.3 * prompt["wall_ms"] < prompt["host_waiting_ms"], prompt
    assert prompt["host_switches_per_s"] > 300, prompt  # preempted by the real-time thread each millisecond
    assert "host_cpu_ms" not in generation  # the stand-in ended before the run was read again
