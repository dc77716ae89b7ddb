"""What a user passes to `moeplace explain`: the log file (or stdin) read safely, a folder, a GGUF model, a
binary file or one too large refused in one line; the llama.cpp command line the paste shows, with its flags as
typed; and whether lines were cut from it.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import BinaryIO, TypedDict, cast

from ..core.errors import MoeplaceError
from ..runtime.llama_names import MiB

# The command a paste often starts with (llama-server ..., ./llama-cli \\ on several lines, ollama's runner), and the
# flags of it that the plan and the words use.
_PROGRAM = re.compile(
    r"(?:^|[\s/\\$>=\"'])(?:llama-server|llama-cli|llama-bench|llama-fit-params|llama-completion|llama-mtmd-cli|"
    r"llama-sweep-bench|ollama_llama_server|ollama runner|server|main)(?:\.exe)?\s+(-.*)$"
)
# llama-server's router prints the arguments it starts a model with one to a line: "srv          load:   --model".
_ARG_LINE = re.compile(r"\bsrv\s+load:\s+(\S.*?)\s*$")
_OPTIONS = {
    "-c": "ctx",
    "--ctx-size": "ctx",
    "-ngl": "ngl",
    "--n-gpu-layers": "ngl",
    "--gpu-layers": "ngl",
    "-ot": "ot",
    "--override-tensor": "ot",
    "-ub": "ubatch",
    "--ubatch-size": "ubatch",
    "-ncmoe": "n_cpu_moe",
    "--n-cpu-moe": "n_cpu_moe",
    "-np": "parallel",
    "--parallel": "parallel",
    "-m": "model",
    "--model": "model",
    "-sm": "split_mode",
    "--split-mode": "split_mode",
    "-fa": "flash_attn",
    "--flash-attn": "flash_attn",
    "-ctk": "type_k",
    "--cache-type-k": "type_k",
    "-ctv": "type_v",
    "--cache-type-v": "type_v",
}
# A paste with lines cut out of it: a line that is only an ellipsis or a snip mark, or one that says lines were cut.
_CUT = re.compile(
    r"^\s*(?:\.{1,3}|…|\[\.\.\.\]|\[…\]|\(\.\.\.\)|<snip>|\[snip\])\s*$|"
    r"\b(?:truncated|snipped|omitted|removed|cut|skipped|repeated)\b.*\b(?:lines?|times)\b|"
    r"\blines?\b.*\b(?:truncated|snipped|omitted|removed|cut|skipped)\b",
    re.I | re.M,
)


class CommandArgs(TypedDict, total=False):
    """The flags of a pasted llama.cpp command line that explain reads, as typed (text)."""

    ctx: str
    ngl: str
    ubatch: str
    n_cpu_moe: str
    parallel: str
    model: str
    split_mode: str
    flash_attn: str
    type_k: str
    type_v: str
    ot: list[str]  # the -ot rules, in order


def command_args(text: str) -> CommandArgs:
    """The flags of the first llama.cpp command line the text shows, or of the router's argument lines ({} where
    it shows neither): ctx, ngl, ubatch, n_cpu_moe, parallel, model, split_mode, flash_attn, type_k and type_v as
    typed, ot as the list of -ot rules."""
    lines = re.sub(r"\\[ \t]*\r?\n", " ", text).splitlines()
    commands = [m[1] for line in lines if (m := _PROGRAM.search(line))]
    arg_lines = [m[1] for line in lines if (m := _ARG_LINE.search(line))]
    for command in commands[:1] or ([shlex.join(arg_lines)] if arg_lines else []):
        try:
            tokens = shlex.split(command)
        except ValueError:
            tokens = command.split()
        args: dict[str, str | list[str]] = {}
        for i, token in enumerate(tokens):
            flag, _, value = token.partition("=") if token.startswith("--") else (token, "", "")
            key = _OPTIONS.get(flag)
            if key is None:
                continue
            following = tokens[i + 1] if i + 1 < len(tokens) else ""
            value = value or (following if following and not re.match(r"-[^\d]", following) else "")
            if key == "flash_attn" and not value:  # builds of 2024/25: a bare -fa
                value = "on"
            if key == "ot" and value:
                rules = args.setdefault("ot", [])
                assert isinstance(rules, list)
                rules.extend(value.split(","))
            elif value:
                args[key] = value
        return cast(CommandArgs, args)  # keys from _OPTIONS, each with its flag's text (ot: the rules)
    return {}


def looks_cut(text: str) -> bool:
    """Lines were cut from the paste: a snip mark, or it begins with an override line (the ones before it,
    which llama.cpp prints all of, were left out)."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    return bool(_CUT.search(text)) or "buffer type overrid" in first


_READ_LIMIT = 256 * MiB  # far more than any log; a model file passed by mistake is refused before it is read whole


def read_text(path: str) -> str:
    """The text of a log file (or stdin for -), UTF-8 or a Windows UTF-16 one; a one-line error for a folder, a
    GGUF model, a binary file or one too large to be a log."""
    name = "stdin" if path == "-" else path
    if path == "-":
        data = _read_checked(sys.stdin.buffer, name)
    elif Path(path).is_dir():
        raise MoeplaceError(f"{path} is a folder, not a log: pass the log file llama.cpp's output was saved to.")
    else:
        try:
            with open(path, "rb") as f:
                data = _read_checked(f, name)
        except OSError as e:
            raise MoeplaceError(f"{path}: cannot read it ({e.strerror}).") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # PowerShell's Tee-Object and > write UTF-16
        return data.decode("utf-16", errors="replace")
    if len(data) > _READ_LIMIT or b"\0" in data[: 1 << 16]:
        too = "too large to be a log" if len(data) > _READ_LIMIT else "a binary file, not a log"
        raise MoeplaceError(f"{name} is {too}: pass the text llama.cpp printed, from the load to where it stopped.")
    return data.decode("utf-8", errors="replace")


def _read_checked(stream: BinaryIO, name: str) -> bytes:
    """The stream's bytes (at most one past the limit), refusing a GGUF model from its first four."""
    head = stream.read(4)
    if head == b"GGUF":
        raise MoeplaceError(
            f"{name} is a GGUF model, not a log: run llama.cpp on it and save what it prints "
            "(e.g. llama-server -m MODEL.gguf ... 2>&1 | tee server.log), then explain server.log."
        )
    return head + stream.read(_READ_LIMIT + 1 - len(head))
