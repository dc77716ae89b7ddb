"""A GGUF header over HTTP: range requests for the first bytes only, growing until the tensor table is read.

The weights are never fetched: a 300 GB model costs its header (metadata, tokenizer, tensor table), a few MiB.
Every request has a timeout; a server that ignores Range is refused rather than downloaded from.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from ..core.errors import MoeplaceError
from ..core.records import JsonObject

FIRST_BYTES = 512 * 2**10
MAX_HEADER_BYTES = 64 * 2**20  # real headers (a 256K-token vocabulary included) stay far below
TIMEOUT_S = 30
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_SPLIT_URL = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf(?P<query>\?.*)?$")

bytes_read = 0  # over this process's life: what tests and `inspect` report

T = TypeVar("T")


def get_range(url: str, start: int, end: int) -> tuple[bytes, int]:
    """Bytes start..end (inclusive) of `url` and the file's total size."""
    global bytes_read
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}", "User-Agent": "moeplace"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            m = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if response.status != 206 or not m:
                raise MoeplaceError(
                    f"{url}: the server does not answer range requests, so its header cannot be read alone; "
                    "download the file and pass its path."
                )
            data = response.read(end - start + 1)
    except urllib.error.HTTPError as e:
        if e.code == 416:  # asked past the end of a small file
            total = int(e.headers.get("Content-Range", "*/0").rsplit("/", 1)[-1] or 0)
            return b"", total
        raise MoeplaceError(f"{url}: HTTP {e.code} {e.reason}; check the address (and that the file exists).") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise MoeplaceError(
            f"{url}: cannot reach it ({reason}); are you offline? A local file works offline."
        ) from None
    bytes_read += len(data)
    return data, int(m[3])


def get_json(url: str) -> JsonObject:
    """A small JSON document (the Hub's file list of a repository), open as the server wrote it: a caller reads the
    few fields it needs."""
    request = urllib.request.Request(url, headers={"User-Agent": "moeplace"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            document: JsonObject = json.loads(response.read(4 * 2**20))
            return document
    except urllib.error.HTTPError as e:
        raise MoeplaceError(f"{url}: HTTP {e.code} {e.reason}; check the repository name.") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise MoeplaceError(f"{url}: cannot reach it ({getattr(e, 'reason', e)}); are you offline?") from None
    except ValueError:
        raise MoeplaceError(f"{url}: the answer is not JSON.") from None


class NeedMore(Exception):
    """The header runs past the bytes read so far (a remote file is read a prefix at a time)."""

    def __init__(self, end: int):
        super().__init__(end)
        self.end = end


def read_remote(url: str, parse: Callable[[str, bytes, int], T]) -> T:
    """`parse`'s result (a GGUF header parser: url, the bytes read so far, the file's size) for a remote file,
    reading as little of it as the header needs: `parse` raises NeedMore for more."""
    buf, size = get_range(url, 0, FIRST_BYTES - 1)
    while True:
        try:
            return parse(url, buf, size)
        except NeedMore as more:
            want = min(max(more.end, 2 * len(buf)), size)
            if want > MAX_HEADER_BYTES:
                raise MoeplaceError(
                    f"{url}: its header claims more than {MAX_HEADER_BYTES // 2**20} MiB; that is no real model."
                ) from None
            data, _ = get_range(url, len(buf), want - 1)
            if not data:
                raise MoeplaceError(f"{url}: the server sent no more bytes; the file is truncated.") from None
            buf += data


def shard_urls(url: str) -> list[str]:
    """Every shard's URL of a split model given any one of them."""
    m = _SPLIT_URL.match(url)
    if not m:
        return [url]
    count, query = int(m["count"]), m["query"] or ""
    return [f"{m['stem']}-{i:05d}-of-{count:05d}.gguf{query}" for i in range(1, count + 1)]
