"""moeplace: where a llama.cpp MoE model's expert weights should live, predicted and measured.

The library's calls (moeplace.api) are re-exported here: `moeplace.recommend(...)`, `moeplace.predict(...)`,
`moeplace.optimal(...)`, `moeplace.explain(...)`, `moeplace.inspect(...)`. They load on first use, so the command
line starts without them."""

from typing import Any

__version__ = "0.1.0"

_API = (
    "recommend",
    "predict",
    "optimal",
    "explain",
    "inspect",
    "Plan",
    "Recommendation",
    "Request",
    "Speeds",
    "DraftRequest",
)


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'moeplace' has no attribute {name!r}")
