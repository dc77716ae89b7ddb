"""The README's first-run block (figure, caption, recorded runs) is written by docs/first_run.py from the runs it
recorded (docs/runs/*.json), never typed by hand: the README holds what the records give, every record names a
commit of this repository, and the figure the caption speaks of is the one shown."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import first_run  # noqa: E402


def test_the_readme_says_what_the_recorded_runs_measured():
    check = subprocess.run([sys.executable, "docs/first_run.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    runs, (shown, image) = first_run.load_runs()
    assert (ROOT / image).is_file() and f"]({image})" in (ROOT / "README.md").read_text()
    assert any(not run["bare"] for run in runs)


def test_every_record_is_a_run_of_a_commit_of_this_repository():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the records' commits cannot be looked up")
    for path in sorted(first_run.RUNS.glob("*.json")):
        run = json.loads(path.read_text())
        known = subprocess.run(["git", "cat-file", "-e", f"{run['commit']}^{{commit}}"], cwd=ROOT)
        assert known.returncode == 0, f"{path.name}: commit {run['commit']} is not in this repository"
        assert run["cpu"] and run["seconds"]["total"] > 0 and (run.get("medians") or run.get("passed")), path.name


def test_snakemakes_job_lines_give_each_rules_time():
    output = """[Sun Dec  6 22:10:01 2026]
localrule bench:
    input: x
[Sun Dec  6 22:10:03 2026]
localrule bench:
[Sun Dec  6 22:11:01 2026]
Finished jobid: 3 (Rule: bench)
[Sun Dec  6 22:12:13 2026]
Finished jobid: 4 (Rule: bench)
[Sun Dec  6 22:12:14 2026]
rule figure_ncmoe:
[Sun Dec  6 22:12:19 2026]
Finished jobid: 0 (Rule: figure_ncmoe)
"""
    assert first_run._jobs(output) == {"bench": 60 + 130, "figure_ncmoe": 5}
