"""Where '-ngl 99' puts the model: a real GPU, lavapipe (Mesa's CPU Vulkan, a real Vulkan device with no GPU
under it, shown as a card of the configured size by the vkcap shim), or the emulated device (a capped RPC server
on 127.0.0.1).

On a machine without a GPU the "device" is llama.cpp's RPC backend, CPU-backed, whose memory is capped
by the devcap shim: placement and out-of-memory are real while speed is a CPU's. So that it has a real
card's shape, where experts kept in host RAM cost more per token than those on the device, its host side
(the llama.cpp process measured) runs slowed by a declared factor while a run is timed: a real-time thread
holds its core for all but 1/host_slowdown of every millisecond, while the RPC server runs free on its own.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..core.backends import built_as
from ..core.config import Device, DeviceTarget
from ..core.errors import MoeplaceError
from .build import Build
from .cpus import CpuSplit, pin, realtime_refusal, slowed
from .llamacpp import free_device_bytes, require_binary
from .native import build_native
from .noise import RepetitionNoise
from .process import run_checked, spawn, stop
from .vulkan import LABEL, lavapipe_env

log = logging.getLogger("moeplace")


@dataclass(frozen=True)
class DeviceSetup:
    kind: str  # "gpu" or "emulated"
    label: str
    cap_bytes: int
    hold: bool = False  # a GPU capped to cap_bytes: the rest of its free memory is held while a job runs
    host_slowdown: float = 1.0  # emulated: the host side runs this many times slower while timed
    other_caps: tuple[int, ...] = ()  # several devices: the caps of the ones after the first, in llama.cpp's order
    reported_bytes: int | None = None  # lavapipe: the heap Mesa reports (not enforced; the cap is, by vkcap)

    @property
    def caps(self) -> tuple[int, ...]:
        return (self.cap_bytes, *self.other_caps)


def _mib(caps: tuple[int, ...]) -> str:
    return " and ".join(f"{c / 2**20:.0f} MiB" for c in caps)


def planned_backend(setup: DeviceSetup, manifest: Build) -> str:
    """The backend a plan on this device counts by (core/backends.py): the emulated device is rpc, else the
    build's; a user's build that does not say its backend is taken for CUDA's."""
    return "rpc" if setup.kind == "emulated" else built_as(manifest.backend or "cuda").name


def margin_on(setup: DeviceSetup, manifest: Build, memory: Device) -> int:
    """The bytes a stage keeps free on this device: the config's device.margin, or where it is auto its backend's
    default (the emulated device and lavapipe are capped exactly: 0), against its free memory where device.vram is
    auto."""
    backend = planned_backend(setup, manifest)
    return memory.for_backend(backend, against_free=memory.vram_bytes is None).kept_free


def device_setup(target: DeviceTarget, manifest: Build) -> DeviceSetup:
    kind, name, vram_bytes = target.kind, target.name, target.vram_bytes
    if kind == "auto":
        kind = "gpu" if manifest.gpu_devices else "emulated"
    if kind == "gpu" and manifest.software_device:
        return _lavapipe_setup(target, manifest)
    if kind == "gpu":
        if not manifest.gpu_devices:
            raise MoeplaceError(
                "device.kind is gpu, but this llama.cpp build sees no GPU; set llamacpp.bin_dir to a "
                "CUDA/HIP/Vulkan build, or device.kind to emulated."
            )
        others = target.other_vram_bytes
        if others:
            gpus = manifest.gpu_devices
            if len(gpus) <= len(others):
                raise MoeplaceError(
                    f"device.vram names {len(others) + 1} devices, but this llama.cpp build sees "
                    f"{len(gpus)} GPU(s) ({', '.join(gpus)}); give one size per GPU."
                )
            assert vram_bytes is not None  # the schema's lists hold sizes only, no auto
            capped = ", ".join(f"{g} capped to {c / 2**30:.2f} GiB" for g, c in zip(gpus, (vram_bytes, *others)))
            return DeviceSetup("gpu", name or capped, vram_bytes, hold=True, other_caps=others)
        label = name or manifest.gpu_devices[0]
        if vram_bytes is None:
            return DeviceSetup("gpu", label, free_device_bytes(manifest))
        return DeviceSetup("gpu", f"{label}, capped to {vram_bytes / 2**30:.2f} GiB", vram_bytes, hold=True)
    if vram_bytes is None:
        raise MoeplaceError(
            "device.vram is auto, but there is no GPU to ask: give the emulated device a size, e.g. vram: 100MB."
        )
    caps = (vram_bytes, *target.other_vram_bytes)
    if len(caps) > 1:
        label = f"{len(caps)} emulated devices: CPU-backed RPC servers on one core, {_mib(caps)}"
    else:
        label = f"emulated device: a CPU core behind RPC, {vram_bytes / 2**20:.0f} MiB"
    slowdown, why_not = target.host_slowdown, None
    if slowdown > 1 and (refusal := realtime_refusal()):
        slowdown, why_not = 1.0, refusal
    if slowdown > 1:
        label += f"; host side {slowdown:g}x slower while timed"
    elif why_not:
        label += f"; host side not slowed ({why_not})"
    return DeviceSetup("emulated", label, vram_bytes, host_slowdown=slowdown, other_caps=target.other_vram_bytes)


def _lavapipe_setup(target: DeviceTarget, manifest: Build) -> DeviceSetup:
    """lavapipe as Vulkan0, its size the config's (auto: the heap it reports), enforced while a job runs."""
    if target.other_vram_bytes:
        raise MoeplaceError("device.vram names several devices, but lavapipe is one Vulkan device; give one size.")
    reported = free_device_bytes(manifest)
    cap = target.vram_bytes or reported
    if cap > reported:
        raise MoeplaceError(
            f"device.vram is {cap / 2**20:.0f} MiB, more than the {reported / 2**20:.0f} MiB lavapipe "
            "reports; give at most that."
        )
    gpu = manifest.gpu_devices[0]
    mesa = f", {manifest.mesa}" if manifest.mesa else ""
    label = f"{target.name or gpu}: {LABEL}{mesa}, shown as a {cap / 2**20:.0f} MiB card (Mesa: {reported / 2**20:.0f})"
    return DeviceSetup("gpu", label, cap, reported_bytes=reported)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def rpc_device(manifest: Build, cap_bytes: int, cpus: tuple[int, ...], log_path: Path) -> Iterator[str]:
    """A capped RPC server on 127.0.0.1, pinned to `cpus` with a thread each, for the duration of one job;
    always stopped afterwards."""
    server = require_binary(manifest, "ggml-rpc-server")
    port = _free_port()
    if manifest.devcap is None:
        raise MoeplaceError(
            f"the llama.cpp build in {manifest.bin_dir} names no devcap shim, which the emulated device needs; "
            "delete resources/llamacpp/ and run the pipeline again."
        )
    env = {**os.environ, "LD_PRELOAD": str(manifest.devcap), "MOEPLACE_DEVICE_CAP_BYTES": str(cap_bytes)}
    cmd = [str(server), "-H", "127.0.0.1", "-p", str(port), "-t", str(len(cpus))]
    proc = spawn(cmd, env=env, log_path=log_path, before_exec=lambda: pin(cpus))
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise MoeplaceError(f"the RPC server exited at start (code {proc.returncode}); see {log_path}.")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise MoeplaceError(f"the RPC server did not listen on 127.0.0.1:{port} within 30 s; see {log_path}.")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


@contextmanager
def gpu_held(keep_free_bytes: int, log_path: Path, index: int = 0) -> Iterator[None]:
    """GPU `index` capped to `keep_free_bytes` of free memory for the duration of one job: a holder process takes
    the rest with plain device allocations, and gives it back when the job ends or dies (native/gpuhold.c)."""
    holder = build_native("gpuhold", log_path, shared=False)
    start = log_path.stat().st_size if log_path.exists() else 0
    proc = spawn([str(holder), str(index), str(keep_free_bytes)], env=None, log_path=log_path)
    try:
        deadline = time.monotonic() + 120
        while not re.search(r"^held \d+ free \d+", log_path.read_text(errors="replace")[start:], re.MULTILINE):
            if proc.poll() is not None:
                raise MoeplaceError(f"the GPU memory holder exited (code {proc.returncode}); see {log_path}.")
            if time.monotonic() > deadline:
                raise MoeplaceError(f"the GPU memory holder did not report within 120 s; see {log_path}.")
            time.sleep(0.1)
        yield None
    finally:
        stop(proc)


LINK_FACTS = {  # gpulink's names: (the ceilings table's name, unit)
    "device_copy_gbps": ("device_copy", "GB/s"),
    "host_to_device_pinned_gbps": ("host_to_device_pinned", "GB/s"),
    "host_to_device_pageable_gbps": ("host_to_device_pageable", "GB/s"),
    "device_to_host_pinned_gbps": ("device_to_host_pinned", "GB/s"),
    "round_trip_us": ("hop_round_trip", "us"),
}


LINK_PROBE_BYTES = 256 * 2**20  # each copy: far above any cache, a few milliseconds on a PCIe link


def link_facts(log_path: Path, nbytes: int = LINK_PROBE_BYTES, trials: int = 5, index: int = 0) -> dict[str, float]:
    """A CUDA card's memory bandwidth (a device-to-device copy), its host link both ways (pinned and pageable
    host memory) and the round trip of one hop's activations, best of `trials` (native/gpulink.c)."""
    probe = build_native("gpulink", log_path, shared=False)
    out = run_checked([str(probe), str(index), str(nbytes), str(trials)], "measuring the GPU's links", log_path).stdout
    facts = {}
    for line in out.splitlines():
        name, _, value = line.partition(" ")
        if name in LINK_FACTS:
            facts[name] = float(value)
    if set(facts) != set(LINK_FACTS):
        raise MoeplaceError(f"the GPU link probe printed {sorted(facts)}, not {sorted(LINK_FACTS)}; see {log_path}.")
    return facts


@dataclass(frozen=True)
class HostSide:
    """How a measured llama.cpp process runs: `enter` before exec (pinned to its CPUs), and `on_line` for each
    line of its stderr: with a slowed host, llama-bench's --progress lines slow its CPUs while a prompt or
    generation run is timed and leave them free for the rest (the depth fill, the warmups), which, slowed, would
    cost minutes and measure nothing; and `noise` reads what the machine did to each timed run (noise.py)."""

    enter: Callable[[], None]
    on_line: Callable[[str], None]
    noise: RepetitionNoise


PROGRESS = re.compile(r"llama-bench: benchmark \d+/\d+: (.*)")  # --progress: what it starts next


@contextmanager
def host_side(device: DeviceSetup, cpus: tuple[int, ...], log_path: Path) -> Iterator[HostSide]:
    """The measured process's side of `device`: pinned to `cpus` and, on an emulated device with a slowed host,
    those CPUs host_slowdown times slower while timed (runtime.cpus.slowed)."""
    noise = RepetitionNoise(cpus, tuple(sorted(os.sched_getaffinity(0))))
    if device.host_slowdown <= 1:
        yield HostSide(lambda: pin(cpus), noise.on_line, noise)
        return
    ever_timed = False
    with slowed(cpus, device.host_slowdown, log_path) as slow:

        def on_line(line: str) -> None:
            nonlocal ever_timed
            if m := PROGRESS.match(line):
                timed = m[1].startswith(("prompt run", "generation run"))
                ever_timed |= timed
                slow(timed)
            noise.on_line(line)

        yield HostSide(lambda: pin(cpus), on_line, noise)
    if not ever_timed:
        log.warning("the host side was never slowed: llama-bench printed no timed run (no --progress lines?)")


@contextmanager
def attached(device: DeviceSetup, manifest: Build, cpus: CpuSplit, log_path: Path) -> Iterator[str | None]:
    """The context a llama.cpp run needs for `device`: the RPC servers' addresses, comma-separated as --rpc takes
    them (emulated, on their own CPUs where there are two or more), or None (GPUs, each capped by a memory holder
    when asked to be smaller)."""
    with ExitStack() as stack:
        if device.kind == "emulated":
            yield ",".join(
                stack.enter_context(rpc_device(manifest, cap, cpus.device or cpus.bench, log_path))
                for cap in device.caps
            )
            return
        if device.hold:
            for index, cap in enumerate(device.caps):
                stack.enter_context(gpu_held(cap, log_path, index))
        if device.reported_bytes is not None:
            vkcap = build_native("vkcap", log_path, shared=True)
            stack.enter_context(_environment(lavapipe_env(str(vkcap), device.cap_bytes)))
        yield None


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """`env` set for this process and the programs it starts, restored afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield None
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_RPC_BUFFER = re.compile(r"(RPC\d*)\[([^\]]+)\]")


def portable_rules(overrides: str | None, rpc: str | None) -> str | None:
    """-ot rules that name RPC servers by their place in `rpc` (RPC0[#1]: the second) rather than by their address:
    each job starts its servers on new ports, so a placement found on one start is kept in this form."""
    if not overrides or not rpc:
        return overrides
    endpoints = rpc.split(",")
    return _RPC_BUFFER.sub(lambda m: f"{m[1]}[#{endpoints.index(m[2])}]" if m[2] in endpoints else m[0], overrides)


def bound_rules(overrides: str | None, rpc: str | None) -> str | None:
    """portable_rules' -ot rules with each server's place replaced by its address in `rpc`, as llama.cpp takes them."""
    if not overrides or not rpc:
        return overrides
    endpoints = rpc.split(",")
    return re.sub(r"\[#(\d+)\]", lambda m: f"[{endpoints[int(m[1])]}]", overrides)
