"""The code's layout holds: docs/architecture.md is current, the package's layers import downwards only and in no
circle, one subprocess runner, no module reaches into another's private names, modules and functions stay
readable, scripts stay thin."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PACKAGE = ROOT / "src" / "moeplace"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def imports(path):
    """(module, names) of each `from . import` in a package file, modules as 'bench' or 'runtime.process'."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(here[: len(here) - node.level])
            yield ".".join(base + ([node.module] if node.module else [])), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names)


LAYERS = ("core", "runtime", "model", "plan", "measure", "report", "api", "cli")  # lowest first


def module_name(path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SOURCES}


def package_imports(path) -> set[str]:
    """The package's modules a file imports, lazy imports inside functions included."""
    name, is_package = module_name(path), path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = name.split(".") if name else []
            base = base if is_package else base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        elif (node.module or "").startswith("moeplace."):
            target = node.module.removeprefix("moeplace.")
        else:
            continue
        for candidate in [target, *(f"{target}.{a.name}".strip(".") for a in node.names)]:
            if candidate in MODULES and candidate != name:
                found.add(candidate)
    return found


GRAPH = {name: package_imports(path) for name, path in MODULES.items()}


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_the_package_is_its_layers():
    tops = {name.split(".")[0] for name in MODULES if name}
    assert tops == set(LAYERS)
    assert len(tops - {"runtime", "api", "cli"}) >= 4


def test_every_import_goes_down_a_layer_or_stays_in_its_own():
    upward = [(m, d) for m, deps in GRAPH.items() if m for d in deps if layer(d) > layer(m)]
    assert upward == []
    runtime = {d for m, deps in GRAPH.items() if m.startswith("runtime") for d in deps}
    assert {d.split(".")[0] for d in runtime} <= {"runtime", "core"}


def test_the_import_graph_has_no_circle():
    done, on_path = set(), []

    def visit(module: str) -> None:
        on_path.append(module)
        for dep in sorted(GRAPH[module]):
            assert dep not in on_path, "import circle: " + " -> ".join(on_path[on_path.index(dep) :] + [dep])
            if dep not in done:
                visit(dep)
        on_path.pop()
        done.add(module)

    for module in sorted(GRAPH):
        if module not in done:
            visit(module)


def test_the_graph_sees_imports_inside_functions():
    """Lazy imports count: assumed imports the speed model only inside its functions."""
    assert "plan.speed" in GRAPH["plan.assumed"]


def outside_packages(path) -> set[str]:
    """The top-level names of the packages outside moeplace a file imports, lazy imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"moeplace"}


def test_no_figure_is_drawn_outside_report():
    """Figures are report/'s job: no module elsewhere imports a plotting library."""
    drawing = sorted(module_name(p) for p in SOURCES if outside_packages(p) & {"matplotlib", "seaborn"})
    assert drawing and all(m.startswith("report.") for m in drawing), drawing


def test_functions_stay_short():
    """No function over 60 lines or 8 parameters, except a port of llama.cpp that says so in its docstring."""
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                params = len(a.posonlyargs + a.args + a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                lines = node.end_lineno - node.lineno + 1
                if (lines > 60 or params > 8) and "port of" not in (ast.get_docstring(node) or ""):
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines} lines, {params} parameters)")
    assert long == []


def test_architecture_doc_is_generated_from_the_current_code():
    check = subprocess.run([sys.executable, "docs/architecture.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_one_subprocess_runner():
    users = [p.relative_to(PACKAGE) for p in SOURCES if any(m == "subprocess" for m, _ in imports(p))]
    assert [str(p) for p in users] == ["runtime/process.py"]


def test_nobody_imports_a_private_name():
    for path in SOURCES:
        for module, names in imports(path):
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{path.relative_to(PACKAGE)} imports private {private} from {module}"


def test_modules_stay_readable_and_scripts_thin():
    sizes = {p.relative_to(PACKAGE): len(p.read_text().splitlines()) for p in SOURCES}
    assert max(sizes.values()) <= 400, max(sizes.items(), key=lambda kv: kv[1])
    for script in (ROOT / "workflow" / "scripts").glob("*.py"):
        assert len(script.read_text().splitlines()) < 60, script.name


def test_config_reference_is_generated_from_the_schema():
    check = subprocess.run([sys.executable, "docs/config_reference.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_readme_seed_table_is_what_the_program_computes():
    check = subprocess.run([sys.executable, "docs/seed_table.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_readme_fault_matrix_is_generated_from_the_fault_tests():
    check = subprocess.run([sys.executable, "docs/fault_matrix.py", "--check"], cwd=ROOT, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_nothing_outside_tests_reaches_into_them():
    """src, docs, tools and the rule scripts read no module of tests/ (the data flows tools -> docs, tests; never
    back): no `sys.path` entry for tests/, no import of a test helper."""
    helpers = {p.stem for p in (ROOT / "tests").glob("*.py")}
    outside = [
        *SOURCES,
        *(ROOT / "docs").glob("*.py"),
        *(ROOT / "tools").glob("*.py"),
        *(ROOT / "workflow").rglob("*.py"),
    ]
    reaching = []
    for path in outside:
        text = path.read_text()
        names = {n.split(".")[0] for n, _ in imports(path)} if path.is_relative_to(PACKAGE) else set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        if names & helpers or '"tests"' in text and "sys.path" in text:
            reaching.append(str(path.relative_to(ROOT)))
    assert not reaching, f"these reach into tests/: {reaching}"


def test_fmt_skip_only_on_aligned_tables():
    """`# fmt: skip` keeps a table's hand alignment (it ends on the table's closing bracket); code is ruff's."""
    marked = [
        f"{path.relative_to(PACKAGE)}:{i}"
        for path in SOURCES
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip") and not line.lstrip().startswith((")", "}", "]"))
    ]
    assert marked == []


def test_the_command_starts_without_pandas():
    """pandas is half a second of every start: `moeplace recommend` and the package's import never load it."""
    code = "import sys, moeplace.cli, moeplace.plan.recommend; print('pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
