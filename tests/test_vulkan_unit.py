"""Issue #56, the parts that need no Vulkan build: reading vulkaninfo, the pinned patch, the lavapipe build's own
cache key, lavapipe never chosen by auto, and the lavapipe device's label, size and environment (the vkcap shim).
(tests/test_vulkan.py runs the build on lavapipe.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ROOT

from moeplace.core.config import DeviceTarget
from moeplace.core.errors import MoeplaceError
from moeplace.runtime import backend, device, vulkan
from moeplace.runtime.build import Build
from moeplace.runtime.llamacpp import build_key

VULKANINFO = ROOT / "tests/data/vulkan/vulkaninfo-lavapipe-mesa-22.3.6-debian12.txt"
LLVMPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"


def test_vulkaninfo_on_lavapipe_reads_one_software_device_with_its_reported_heap():
    found = vulkan.vulkaninfo_devices(VULKANINFO.read_text())
    assert found == [{"name": LLVMPIPE, "software": True, "total_bytes": 2**31, "free_bytes": 2**31,
                      "driver": "Mesa 22.3.6 (LLVM 15.0.6)"}]  # fmt: skip


def test_software_devices_are_used_only_where_ggml_vk_visible_devices_names_them():
    found = vulkan.vulkaninfo_devices(VULKANINFO.read_text())
    assert vulkan.visible_devices(found, None) == []  # llama.cpp skips CPU-type devices unless named
    assert [d["name"] for d in vulkan.visible_devices(found, "0")] == [LLVMPIPE]
    with pytest.raises(MoeplaceError) as err:
        vulkan.visible_devices(found, "0,1")
    assert "GGML_VK_VISIBLE_DEVICES=0,1" in str(err.value) and "\n" not in str(err.value)


def test_vram_auto_reads_lavapipe_only_when_named(monkeypatch):
    monkeypatch.setattr(backend, "_tool", lambda name, *extra: f"/usr/bin/{name}")
    monkeypatch.setattr(backend, "nvidia_devices", lambda: [])

    class Done:
        ok, stdout = True, VULKANINFO.read_text()

    monkeypatch.setattr(backend, "run", lambda cmd, timeout_s: Done())
    monkeypatch.delenv("GGML_VK_VISIBLE_DEVICES", raising=False)
    with pytest.raises(MoeplaceError):
        backend.gpu_free_memory("vulkan")
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    assert backend.gpu_free_memory("vulkan") == ([(2**31, f"{LLVMPIPE} (software: not a GPU)")], "vulkaninfo")


def test_auto_never_picks_lavapipe(monkeypatch):
    summary = f"GPU0:\n\tdeviceType = PHYSICAL_DEVICE_TYPE_CPU\n\tdeviceName = {LLVMPIPE}\n"
    monkeypatch.setattr(backend, "_tool", lambda name, *extra: f"/usr/bin/{name}")
    monkeypatch.setattr(backend, "_lines", lambda cmd: [line.strip() for line in summary.splitlines()])
    monkeypatch.setattr(backend, "nvidia_devices", lambda: [])
    monkeypatch.setattr(backend, "amd_devices", lambda: [])
    assert backend.vulkan_devices() == []
    assert backend.detect("auto").name == "cpu"


def test_lavapipe_missing_is_one_line_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(backend, "lavapipe_devices", lambda: [])
    with pytest.raises(MoeplaceError) as err:
        backend.detect("lavapipe")
    assert "apt-get install mesa-vulkan-drivers" in str(err.value) and "\n" not in str(err.value)


def test_the_patch_is_pinned_and_a_changed_one_refused(tmp_path, monkeypatch):
    assert vulkan.patch_file().name == "vulkan-layer-settings.patch"
    text = (vulkan.PATCHES / vulkan.PATCH["file"]).read_text()
    body = text.splitlines()[2:]
    assert "+#ifdef VK_EXT_layer_settings" in body
    assert sum(line.startswith("+") for line in body) == 5 and not any(line.startswith("-") for line in body)
    (tmp_path / vulkan.PATCH["file"]).write_text(text.replace("1.3.239", "1.3.240"))
    monkeypatch.setattr(vulkan, "PATCHES", tmp_path)
    with pytest.raises(MoeplaceError) as err:
        vulkan.patch_file()
    assert "refusing to apply it" in str(err.value)


def test_a_vulkan_build_is_keyed_by_its_patch_headers_and_lavapipe():
    options = ["-DGGML_VULKAN=ON"]
    ident = {"patch": vulkan.PATCH["sha256"], "vulkan_headers": "239", "glslc": "shaderc v2023.2"}
    keys = {
        build_key("1", options),
        build_key("1", options, ident),
        build_key("1", options, {**ident, "vulkan_headers": "290"}),
        build_key("1", options, {**ident, "patch": "0" * 64}),
        build_key("1", options, {**ident, "lavapipe": True}),
    }
    assert len(keys) == 5
    assert build_key("1", ["-DGGML_RPC=ON"]) == build_key("1", ["-DGGML_RPC=ON"], None)  # the CPU build's key kept


MANIFEST = Build(
    Path("/nonexistent/bin"),
    gpu_devices=(f"Vulkan0: {LLVMPIPE}",),
    software_device=True,
    mesa="Mesa 22.3.6 (LLVM 15.0.6)",
    devcap=Path("/nonexistent/libmoeplace-devcap.so"),
    env=vulkan.VISIBLE,
)


def test_a_lavapipe_device_is_labelled_as_software_capped_and_attached_with_its_cap(monkeypatch, tmp_path):
    monkeypatch.setattr(device, "free_device_bytes", lambda manifest: 2**31)
    setup = device.device_setup(DeviceTarget("gpu", "", 42 * 10**6), MANIFEST)
    assert setup.kind == "gpu" and setup.cap_bytes == 42 * 10**6 and setup.reported_bytes == 2**31
    assert setup.label == (f"Vulkan0: {LLVMPIPE}: lavapipe (Mesa's CPU Vulkan), not a GPU, Mesa 22.3.6 "
                           "(LLVM 15.0.6), shown as a 40 MiB card (Mesa: 2048)")  # fmt: skip
    assert device.device_setup(DeviceTarget("auto", "", None), MANIFEST).cap_bytes == 2**31
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(device, "build_native", lambda name, log, shared: Path(f"/cache/libmoeplace-{name}.so"))
    with device.attached(setup, MANIFEST, None, tmp_path / "log") as rpc:
        assert rpc is None
        assert os.environ["MOEPLACE_DEVICE_CAP_BYTES"] == str(42 * 10**6)
        assert os.environ["LD_PRELOAD"] == "/cache/libmoeplace-vkcap.so"
    assert "LD_PRELOAD" not in os.environ and "MOEPLACE_DEVICE_CAP_BYTES" not in os.environ


@pytest.mark.parametrize("vram", [3 * 2**30, [40 * 10**6, 30 * 10**6]])
def test_a_lavapipe_device_past_its_heap_or_several_is_a_clear_error(monkeypatch, vram):
    monkeypatch.setattr(device, "free_device_bytes", lambda manifest: 2**31)
    first, *others = vram if isinstance(vram, list) else [vram]
    with pytest.raises(MoeplaceError) as err:
        device.device_setup(DeviceTarget("gpu", "", first, other_vram_bytes=tuple(others)), MANIFEST)
    assert "lavapipe" in str(err.value) and "\n" not in str(err.value)


def test_the_example_config_is_valid_and_runs_on_lavapipe():
    import yaml

    from moeplace.core.config import validate_config

    cfg = validate_config(yaml.safe_load((ROOT / "config/examples/software-gpu.yaml").read_text()),
                          ROOT / "workflow/schemas/config.schema.yaml")  # fmt: skip
    assert cfg["llamacpp"]["backend"] == "lavapipe" and cfg["flash_attn"] == "off"
    assert Path(ROOT / "src/moeplace/patches/vulkan-layer-settings.patch").exists()
