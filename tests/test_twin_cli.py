"""`moeplace twin` on an output path it cannot write: one line naming the path and what to do, exit code 2, no
traceback and nothing left behind."""

from __future__ import annotations

import pytest
from conftest import ROOT

from moeplace.cli import main

SPEC = str(ROOT / "config/models/tiny-qwen3moe.yaml")


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("slash", ["", "/"])
def test_a_folder_as_the_output_is_refused_in_one_line(tmp_path, capsys, slash):
    folder = tmp_path / "twins"
    folder.mkdir()
    line = refused(capsys, ["twin", SPEC, f"{folder}{slash}", "--weights", "none"])
    assert line.startswith("moeplace: ") and str(folder) in line and "twin.gguf" in line, line
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["twins"]


def test_an_output_in_a_folder_that_does_not_exist_is_refused_and_no_folder_is_made(tmp_path, capsys):
    missing = tmp_path / "no" / "such"
    line = refused(capsys, ["twin", SPEC, str(missing / "x.gguf"), "--weights", "none"])
    assert line.startswith("moeplace: ") and str(missing) in line and "mkdir -p" in line, line
    assert list(tmp_path.iterdir()) == []


def test_an_output_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "a.gguf").write_text("not a folder")
    line = refused(capsys, ["twin", SPEC, str(tmp_path / "a.gguf" / "x.gguf"), "--weights", "none"])
    assert str(tmp_path / "a.gguf") in line
    assert [p.name for p in tmp_path.iterdir()] == ["a.gguf"] and (tmp_path / "a.gguf").read_text() == "not a folder"


def test_a_writable_output_is_still_written(tmp_path, capsys):
    assert main(["twin", SPEC, str(tmp_path / "t.gguf"), "--weights", "none"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 't.gguf'}"
    assert [p.name for p in tmp_path.iterdir()] == ["t.gguf"]
