"""Every subcommand, given nonsense, answers with one line that names what is wrong and exits 2: no traceback, no
silently replaced value, nothing built or written first."""

from __future__ import annotations

import time

import pytest
from conftest import ROOT

from moeplace.cli import main

SEED = ["--vram-gb", "16", "--non-expert-gb", "0.89", "--expert-gb", "17.41", "--layers", "48",
        "--kv-bytes-per-token", "98304"]  # fmt: skip


def cases(model: str, binary: str, folder: str) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, a word the one line must hold)."""
    rec = ["recommend", model, "--ctx", "4096"]
    return {
        "constants --layers 0": (
            ["recommend", *SEED[:-4], "--layers", "0", SEED[-2], SEED[-1], "--ctx", "4096"],
            "--layers",
        ),  # fmt: skip
        "constants negative --vram-gb": (["recommend", "--vram-gb", "-16", *SEED[2:], "--ctx", "4096"], "--vram-gb"),
        "constants nan --expert-gb": (
            ["recommend", *SEED[:4], "--expert-gb", "nan", *SEED[6:], "--ctx", "4096"],
            "--expert-gb",
        ),  # fmt: skip
        "--vram with --vram-gb": ([*rec, "--vram", "16GB", "--vram-gb", "16"], "--vram-gb"),
        "-ot to a second device": ([*rec, "--vram", "16GiB", "-ot", "exps=CUDA1"], "CUDA1"),
        "--ubatch huge": ([*rec, "--vram", "16GiB", "--ubatch", "99999999"], "--ubatch"),
        "--vram 0": ([*rec, "--vram", "0GB"], "--vram"),
        "--card unknown": ([*rec, "--card", "RTX 9999"], "--card"),
        "--card and --vram": ([*rec, "--card", "RTX 4090", "--vram", "16GiB"], "--card"),
        "no card at all": (rec, "--vram"),
        "--mmproj not a projector": ([*rec, "--vram", "16GiB", "--mmproj", model], "--mmproj"),
        "--ram 0": ([*rec, "--vram", "16GiB", "--ram", "0GB"], "--ram"),
        "--bw-ddr inf": ([*rec, "--vram", "16GiB", "--bw-ddr", "inf"], "--bw-ddr"),
        "--ctx max in constants": (["recommend", *SEED, "--ctx", "max"], "--ctx max"),
        "--ctx nonsense": ([*rec[:2], "--ctx", "lots", "--vram", "16GiB"], "--ctx"),
        "--margin beyond the card": ([*rec, "--vram", "16GiB", "--margin", "99999999"], "--margin"),
        "--backend the card cannot run": ([*rec, "--card", "RTX 4090", "--backend", "metal"], "--backend"),
        "tune --threads 0": (["tune", model, "--ctx", "4096", "--vram", "16GB", "--threads", "0"], "--threads"),
        "--parallel 0": ([*rec, "--vram", "16GiB", "--parallel", "0"], "--parallel"),
        "predict --ubatch 0": (["predict", model, "--ubatch", "0"], "--ubatch"),
        "predict --bw-vram 0": (["predict", model, "--bw-vram", "0"], "--bw-vram"),
        "predict --card-tflops 0": (["predict", model, "--card-tflops", "0"], "--card-tflops"),
        "predict --bw-ddr -5": (["predict", model, "--bw-ddr", "-5"], "--bw-ddr"),
        "predict --depth -1": (["predict", model, "--depth", "-1"], "--depth"),
        "predict --n-cpu-moe 99": (["predict", model, "--n-cpu-moe", "99"], "--n-cpu-moe"),
        "predict --card unknown": (["predict", model, "--card", "Voodoo 5"], "--card"),
        "calibrate a binary file": (["calibrate", model, binary], binary),
        "calibrate a missing file": (["calibrate", model, folder + "/none.jsonl"], "none.jsonl"),
        "tune --vram 16XB": (["tune", model, "--ctx", "4096", "--vram", "16XB"], "--vram"),
        "tune --ctx 0": (["tune", model, "--ctx", "0", "--vram", "16GB"], "--ctx"),
        "tune --ubatch 0": (["tune", model, "--ctx", "4096", "--vram", "16GB", "--ubatch", "0"], "--ubatch"),
        "inspect a directory": (["inspect", folder], folder),
        "inspect a text file": (["inspect", str(ROOT / "README.md")], "README.md"),
        "verify a missing folder": (["verify", folder + "/none"], "none"),
    }


def test_every_subcommand_refuses_nonsense_in_one_line(small_moe, tmp_path, capsys):
    binary = tmp_path / "runs.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    started = time.perf_counter()
    for name, (argv, word) in cases(str(small_moe), str(binary), str(tmp_path)).items():
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own refusals: exit 2 with one line
            code = e.code
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert code == 2, (name, code, out.out, out.err)
        assert len(lines) == 1 and word in lines[0] and out.out == "", (name, out.err)
    # tune --vram 16XB refused before llama.cpp is built (5-15 min): the whole list takes seconds
    assert time.perf_counter() - started < 60


@pytest.mark.parametrize("flags", [["--vram", "16GB"], ["--vram", "16GiB"], ["--card", "4080"]])
def test_the_card_is_said_on_the_answers_first_lines(small_moe, capsys, flags):
    assert main(["recommend", str(small_moe), "--ctx", "4096", *flags]) == 0
    out = capsys.readouterr().out.splitlines()
    if flags[1] == "16GB":
        assert out[0].startswith("note: --vram 16GB is planned as 14.90 GiB")
    card = next(line for line in out if line.startswith("  card: "))
    assert ("17.18 GB" in card) == (flags[1] != "16GB") and ("RTX 4080" in card) == (flags[0] == "--card")
