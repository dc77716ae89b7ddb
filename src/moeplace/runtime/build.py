"""A llama.cpp build: where its binaries are and what it is (its source, backend, options and version), as the
'llamacpp' stage writes it to resources/llamacpp/*.json and every later stage reads it back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import MoeplaceError
from ..core.records import JsonObject


@dataclass(frozen=True)
class Version:
    """What a build's llama-bench says of itself: --version's version, build number and commit (None or
    "unknown" where it does not print them), and the GPUs --list-devices shows ("CUDA0: NVIDIA ...")."""

    version: str = "unknown"
    build_number: int | None = None
    build_commit: str = "unknown"
    gpu_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Build:
    """A llama.cpp build: where its binaries are and what it is. The pinned build has its source, backend, sha256
    and CMake options (a Vulkan one its patches and the environment its tools run with; on lavapipe the Mesa it
    runs on); a user's build (llamacpp.bin_dir) has only its source, "user build", and its version."""

    bin_dir: Path
    source: str = "user build"
    backend: str | None = None
    sha256: str | None = None
    cmake_options: tuple[str, ...] | None = None
    patches: tuple[str, ...] | None = None
    env: Mapping[str, str] | None = None  # set for each of its tools (lavapipe: visible as Vulkan0)
    version: str = "unknown"
    build_number: int | None = None
    build_commit: str = "unknown"
    gpu_devices: tuple[str, ...] = ()
    software_device: bool = False  # lavapipe: its one device is Mesa's CPU Vulkan, not a GPU
    mesa: str | None = None  # lavapipe: the Mesa version it runs on, read at each provision
    devcap: Path | None = None  # the emulated device's preload shim (native/devcap.c)

    def to_json(self) -> JsonObject:
        """The manifest's JSON object, written as is (Build is its type): the keys it has always had, in their order;
        what a build lacks is left out."""
        given = {
            "source": self.source,
            "backend": self.backend,
            "sha256": self.sha256,
            "cmake_options": None if self.cmake_options is None else list(self.cmake_options),
            "patches": None if self.patches is None else list(self.patches),
            "env": None if self.env is None else dict(self.env),
        }
        out: JsonObject = {key: value for key, value in given.items() if value is not None}
        out |= {"version": self.version, "build_number": self.build_number, "build_commit": self.build_commit}
        out["gpu_devices"] = list(self.gpu_devices)
        if self.software_device:
            out |= {"software_device": True, "mesa": self.mesa}
        out["bin_dir"] = str(self.bin_dir)
        if self.devcap is not None:
            out["devcap"] = str(self.devcap)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "the llama.cpp build's manifest") -> Build:
        """The build a manifest (to_json's keys, as any version of moeplace wrote them) describes; keys it does not
        know are ignored. Without bin_dir it is one line naming `where`."""
        if not isinstance(data, Mapping) or not data.get("bin_dir"):
            raise MoeplaceError(
                f"{where} names no bin_dir (the folder of llama.cpp's binaries); delete it and run the pipeline again."
            )

        def listed(key: str) -> tuple[str, ...] | None:
            return None if data.get(key) is None else tuple(data[key])

        return cls(
            bin_dir=Path(data["bin_dir"]),
            source=data.get("source", "user build"),
            backend=data.get("backend"),
            sha256=data.get("sha256"),
            cmake_options=listed("cmake_options"),
            patches=listed("patches"),
            env=None if data.get("env") is None else dict(data["env"]),
            version=data.get("version", "unknown"),
            build_number=data.get("build_number"),
            build_commit=data.get("build_commit", "unknown"),
            gpu_devices=tuple(data.get("gpu_devices") or ()),
            software_device=bool(data.get("software_device")),
            mesa=data.get("mesa"),
            devcap=Path(data["devcap"]) if data.get("devcap") else None,
        )

    @classmethod
    def read(cls, path: str | Path) -> Build:
        """The build the manifest file at `path` describes (the 'llamacpp' stage's output)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise MoeplaceError(
                f"cannot read the llama.cpp build's manifest {path} ({e}); run the pipeline again."
            ) from None
        return cls.from_json(data, str(path))
