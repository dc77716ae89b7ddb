"""Tensor tables of the architectures moeplace can twin: one module per llama.cpp architecture family.

Each module defines
  ARCHS        the llama.cpp architecture names it writes (general.architecture), e.g. ("qwen3moe", "qwen3");
  Params       its hyperparameters beyond TwinSpec's common fields, with defaults (a spec may set them): a frozen
               dataclass subclassing _spec.ArchParams (ArchParams itself for a family with none);
  tensors(s)   every tensor llama.cpp's converter writes for spec s: (name, shape), shape in ggml order (row
               length first), in the converter's order;
  metadata(s)  GGUF keys beyond twin.common_metadata(s), or replacing them (None removes one); a value is a
               bool, int (uint32), float (float32), str, list, or (value, gguf.GGUFValueType) for other types;
Building blocks shared by the tables are in _tables.py.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def _registry() -> dict[str, ModuleType]:
    out = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):  # shared helpers (_spec, _tables), not an architecture
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for arch in module.ARCHS:
            out[arch] = module
    return out


MODULES = _registry()
ARCHITECTURES = tuple(sorted(MODULES))
