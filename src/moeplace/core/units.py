"""Sizes and context lengths as people write them: GB is 10^9 (as the seed and card vendors use), GiB 2^30;
a 32768-token context is "32k"."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import MoeplaceError

GB = 1_000_000_000
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]+)\s*$")


def parse_size(text: str | int | float, what: str = "size") -> int:
    """'16GB' -> 16_000_000_000, '1.5GiB' -> 1610612736. A bare number is refused: say the unit."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise MoeplaceError(f"{what}: {text!r} has no unit; write it like 16GB, 16GiB, 512MB or 512MiB.")
    m = _SIZE.match(text)
    unit = m["unit"].upper() if m else ""
    if not m or unit not in _UNITS:
        raise MoeplaceError(f"{what}: cannot read {text!r} as a size; write it like 16GB, 16GiB, 512MB or 512MiB.")
    return round(float(m["num"]) * _UNITS[unit])


def gb(n_bytes: float) -> float:
    return n_bytes / GB


@dataclass(frozen=True, order=True)
class Context:
    """A context length in tokens, and its one label for paths, tables and titles: 32768 -> '32k';
    a length that is not a whole number of KiB tokens keeps its number ('1000')."""

    tokens: int

    @property
    def label(self) -> str:
        return f"{self.tokens // 1024}k" if self.tokens % 1024 == 0 else str(self.tokens)

    @classmethod
    def parse(cls, label: str) -> Context:
        """The inverse of label: '32k' -> Context(32768), '1000' -> Context(1000)."""
        return cls(int(label[:-1]) * 1024 if label.endswith("k") else int(label))

    def __str__(self) -> str:
        return self.label
