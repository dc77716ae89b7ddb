"""The code's layout holds: docs/architecture.md is current, one subprocess runner, the runtime layer imports
no stage, no module reaches into another's private names, modules stay readable, scripts stay thin."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "src" / "moeplace"
SOURCES = sorted(PACKAGE.rglob("*.py"))
# A stage's module is named like its rule file.
STAGES = {p.stem for p in (ROOT / "workflow" / "rules").glob("*.smk")} - {"common", "llamacpp"}


def imports(path):
    """(module, names) of each `from . import` in a package file, modules as 'bench' or 'runtime.process'."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(here[: len(here) - node.level])
            yield ".".join(base + ([node.module] if node.module else [])), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names)


def test_architecture_doc_is_generated_from_the_current_code():
    check = subprocess.run([sys.executable, "docs/architecture.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_one_subprocess_runner():
    users = [p.relative_to(PACKAGE) for p in SOURCES if any(m == "subprocess" for m, _ in imports(p))]
    assert [str(p) for p in users] == ["runtime/process.py"]


def test_runtime_imports_no_stage_and_nobody_imports_a_private_name():
    for path in SOURCES:
        for module, names in imports(path):
            if path.parent.name == "runtime":
                assert module not in STAGES, f"{path.name} imports the stage {module}"
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{path.relative_to(PACKAGE)} imports private {private} from {module}"


def test_modules_stay_readable_and_scripts_thin():
    sizes = {p.relative_to(PACKAGE): len(p.read_text().splitlines()) for p in SOURCES}
    assert max(sizes.values()) < 500, max(sizes.items(), key=lambda kv: kv[1])
    for script in (ROOT / "workflow" / "scripts").glob("*.py"):
        assert len(script.read_text().splitlines()) < 60, script.name


def test_readme_fault_matrix_is_generated_from_the_fault_tests():
    check = subprocess.run([sys.executable, "docs/fault_matrix.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
