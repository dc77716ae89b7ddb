"""One record per backend (core/backends.py): every list of backends in the package is read from it. A module that
keeps a list of its own, or a setting whose choices drift from the registry, fails here."""

from __future__ import annotations

import ast

from conftest import ROOT

from moeplace.cli import build_parser
from moeplace.core import backends
from moeplace.core.config_schema import schema
from moeplace.runtime.llama_names import backend_of, device_name

PACKAGE = ROOT / "src" / "moeplace"
NAMES = {"cuda", "rocm", "hip", "vulkan", "metal", "sycl", "rpc", "lavapipe"}


def _literal_lists(path) -> list[tuple[int, set[str]]]:
    """Statements of a module that name three or more backends in their literals: a list, a table of pairs, a
    mapping, however nested (a comparison with two names, `b == "cuda" or b == "rocm"`, is not a list)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
            continue
        named = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in NAMES}
        if len(named) >= 3:
            found.append((node.lineno, named))
    return found


def test_no_module_keeps_its_own_list_of_backends():
    lists = {
        str(path.relative_to(PACKAGE)): found
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "core" / "backends.py" and (found := _literal_lists(path))
    }
    assert lists == {}


def test_the_check_sees_a_list_where_there_is_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('MARGINS = {"cuda": 768, "rocm": 768, "metal": 1024}\n')
    assert _literal_lists(module) == [(1, {"cuda", "rocm", "metal"})]
    module.write_text(
        'INIT = ((re.compile("CUDA"), "cuda"), (re.compile("ROCm"), "rocm"), (re.compile("MTL"), "metal"))\n'
    )
    assert _literal_lists(module) == [(1, {"cuda", "rocm", "metal"})]


def _choices(command: str, flag: str) -> tuple[str, ...]:
    sub = next(a for a in build_parser()._actions if a.dest == "command" or getattr(a, "choices", None))
    action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
    return tuple(action.choices)


def test_every_consumer_reads_the_registry():
    assert _choices("recommend", "--backend") == ("auto", *backends.NAMES)
    assert _choices("doctor", "--backend") == backends.BUILDS
    assert set(_choices("predict", "--backend")) == set(backends.PRIOR_NAMES.values())
    build_enum = schema()["properties"]["llamacpp"]["properties"]["backend"]["enum"]
    assert set(build_enum) == set(backends.BUILDS)
    for b in backends.BACKENDS:  # llama.cpp's names for each backend's devices read back to it
        assert device_name(b.name, 0) == f"{b.device_prefix}0"
        assert all(backend_of(f"{prefix}0") in (b.name, "vulkan") for prefix in b.log_prefixes)
        assert backends.margin_bytes(b.name) == b.margin_mib * 2**20
    assert backends.margin_bytes("sycl", against_free=True) == 448 * 2**20  # Arc B580's boundaries, read free
