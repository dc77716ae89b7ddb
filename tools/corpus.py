"""The corpus of real llama.cpp output (tests/data/llamacpp/): each file's header, with the values a person typed
by hand from the text, and the text itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).resolve().parents[1] / "tests/data/llamacpp"


@dataclass
class Sample:
    path: Path
    header: dict[str, Any]
    text: str

    @property
    def expect(self) -> dict[str, Any]:
        return self.header.get("expect") or {}

    @property
    def format(self) -> str:
        return self.header["format"]


def load(path: Path) -> Sample:
    _, header, text = path.read_text().split("---\n", 2)
    try:
        return Sample(path, yaml.safe_load(header), text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path.name}: its header is not YAML: {e}") from None


def samples(*formats: str) -> list[Sample]:
    """Every corpus file (of these formats)."""
    found = [load(p) for p in sorted(CORPUS.glob("*.txt"))]
    return [s for s in found if not formats or s.format in formats]


def ids(found: list[Sample]) -> list[str]:
    return [s.path.stem for s in found]
