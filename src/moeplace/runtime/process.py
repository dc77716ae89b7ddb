"""The one way moeplace runs a program: supervised, recorded, and classified when it fails.

Every child gets its own process group (so a timeout kills it whole, helpers included) and
SIGKILL when the job that started it dies (PR_SET_PDEATHSIG), so nothing outlives its job.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import MoeplaceError

MAX_POLL_S = 0.05  # the longest a run's end (or its timeout, or stop_when) waits to be seen
_OOM = re.compile(
    r"out of device memory|failed to allocate|unable to allocate|cudaMalloc failed|out of memory"
    r"|ErrorOutOfDeviceMemory|hipMalloc failed",
    re.IGNORECASE,
)


@dataclass
class Finished:
    """What one run left: exit status, wall time, major faults, the sampled anonymous-memory peak, output."""

    program: str  # the executable's file name, for messages
    returncode: int | None
    timed_out: bool
    wall_s: float
    majflt: int | None
    anon_peak_bytes: int
    stdout: str
    stderr: str
    start_error: str = ""
    stopped: bool = False  # ended by its caller's stop_when, having printed what the caller wanted

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 or self.stopped) and not self.timed_out and not self.start_error


def die_with_parent() -> None:
    """In a child: its own process group, and SIGKILL when the job that started it dies."""
    os.setsid()
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM (how Snakemake stops a job) unwinds like an exception, so readahead and cgroups are restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _child(before_exec: Callable[[], None] | None) -> Callable[[], None]:
    """What a child runs before exec: die_with_parent, then `before_exec` (join a cgroup, pin CPUs)."""

    def setup() -> None:
        die_with_parent()
        if before_exec:
            before_exec()

    return setup


def kill_group(pid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# A frame of glibc's backtrace, which ggml prints after the cause when it aborts:
# "/path/bin/llama-bench(+0x2028a8)[0x55f3005da8a8]", "/lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x8b)[0x...]".
_FRAME = re.compile(r"^\S+\([^)]*\)\s*\[0x[0-9a-f]+\]$")


def tail(text: str, lines: int = 12) -> str:
    """The last lines of a run's output, a backtrace's frames left out: the cause is printed above them."""
    kept = [line for line in text.strip().splitlines() if not _FRAME.match(line.strip())]
    return "\n".join(kept[-lines:])


def _rss_anon(pid: int) -> int | None:
    """RssAnon of a live process in bytes."""
    try:
        m = re.search(r"^RssAnon:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m[1]) * 1024 if m else None


@dataclass
class _Watch:
    """A running child's supervision, one poll at a time: its anonymous-memory peak; a timeout (SIGTERM, then
    SIGKILL 5 s later, to its whole group); and `stop_when`, shown the captured stdout each time it grows, which
    ends the run the same way as a success."""

    pid: int
    t0: float
    timeout_s: float
    stop_when: Callable[[str], bool] | None
    out: Any  # the captured stdout's file
    anon: int = 0
    timed_out: bool = False
    stopped: bool = False
    kill_at: float = math.inf
    seen: int = 0

    def tick(self) -> float:
        self.anon = max(self.anon, _rss_anon(self.pid) or 0)
        now = time.monotonic()
        if self.stop_when and not (self.stopped or self.timed_out):
            size = os.fstat(self.out.fileno()).st_size
            if size > self.seen:  # pread: the child shares this file's offset, reading must not move it
                self.seen = size
                self.stopped = self.stop_when(os.pread(self.out.fileno(), size, 0).decode(errors="replace"))
                if self.stopped:
                    self._end(signal.SIGTERM, now + 5)
        if now - self.t0 > self.timeout_s and not (self.timed_out or self.stopped):
            self.timed_out = True
            self._end(signal.SIGTERM, now + 5)
        elif now > self.kill_at:
            kill_group(self.pid, signal.SIGKILL)
        return now

    def _end(self, sig: signal.Signals, kill_at: float) -> None:
        kill_group(self.pid, sig)
        self.kill_at = kill_at


# What a person watching a long run should see as it goes (the pipeline's stages show it on the terminal).
progress = logging.getLogger("moeplace.progress")
_STEP = re.compile(rb"\[\s*(\d+)%\]|\[(\d+)/(\d+)\]")  # make's "[ 42%]", ninja's "[120/480]"


@contextmanager
def build_progress(log_path: Path, what: str, every_s: float = 5.0) -> Iterator[None]:
    """While a build streams into `log_path`, say how far it is (make's or ninja's step count) each time it
    passes another tenth, with the time so far."""
    stop, t0 = threading.Event(), time.monotonic()

    def watch() -> None:
        said = 0
        while not stop.wait(every_s):
            with open(log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                steps = _STEP.findall(f.read())
            if not steps:
                continue
            pct, done, total = steps[-1]
            percent = int(pct) if pct else 100 * int(done) // max(1, int(total))
            if percent >= said + 10:
                said = percent - percent % 10
                progress.info("%s: %d%% after %.0f min %.0f s", what, percent, *divmod(time.monotonic() - t0, 60))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def run(
    cmd: list[str],
    *,
    timeout_s: float = math.inf,
    env: dict[str, str] | None = None,
    log_path: str | Path | None = None,
    stream_to_log: bool = False,
    before_exec: Callable[[], None] | None = None,
    stop_when: Callable[[str], bool] | None = None,
    on_stderr_line: Callable[[str], None] | None = None,
) -> Finished:
    """Run `cmd` to its end or to `timeout_s` (then SIGTERM, and SIGKILL 5 s later, to its whole group).

    Output is captured (temp files, no pipe to fill), or with `stream_to_log` written straight into
    `log_path` as it comes (long builds). With a log and captured output, the command line and its
    stderr are appended to the log afterwards. `before_exec` runs in the child (e.g. join a cgroup).
    `stop_when` sees the captured stdout so far each time it grows; when it says so, the run is ended the
    same way and counts as a success (`stopped`). `on_stderr_line` is called with each line of stderr as the
    child prints it (from a thread reading a pipe: within a fraction of a millisecond).
    """
    log = _log_command(log_path, cmd)
    with (
        log.open("a") if stream_to_log and log else tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out if stream_to_log else subprocess.PIPE if on_stderr_line else err,
                env=env,
                preexec_fn=_child(before_exec),
            )
        except (OSError, subprocess.SubprocessError) as e:
            err.seek(0)
            return Finished(Path(cmd[0]).name, None, False, 0.0, None, 0, "", err.read(), start_error=str(e))
        reader = _read_lines(proc.stderr, err, on_stderr_line) if proc.stderr and on_stderr_line else None
        watch = _Watch(proc.pid, t0, timeout_s, stop_when if not stream_to_log else None, out)
        rusage = _wait(proc, watch, reader)
        wall = time.monotonic() - t0
        stdout, stderr = ("", "") if stream_to_log else _captured(out, err)
    if log and not stream_to_log:
        with log.open("a") as f:
            f.write(stderr)
    return Finished(
        Path(cmd[0]).name,
        proc.returncode,
        watch.timed_out,
        wall,
        rusage.ru_majflt,
        watch.anon,
        stdout,
        stderr,
        stopped=watch.stopped,
    )


def _log_command(log_path: str | Path | None, cmd: list[str]) -> Path | None:
    """The log (None: no log), with the command line appended to it."""
    log = Path(log_path) if log_path else None
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
    return log


def _captured(out: Any, err: Any) -> tuple[str, str]:
    out.seek(0)
    err.seek(0)
    return out.read(), err.read()


def _wait(proc: subprocess.Popen[bytes], watch: _Watch, reader: threading.Thread | None) -> Any:
    """The child's resource usage once it has ended, watched meanwhile (its memory, its time, `stop_when`)."""
    status, rusage = 0, None
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rusage = usage
                break
            now = watch.tick()
            # Often at first (a tiny model decodes in milliseconds), then at most every MAX_POLL_S.
            time.sleep(min(MAX_POLL_S, max(0.002, (now - watch.t0) / 50)))
    finally:
        if rusage is None:  # interrupted (SIGTERM of the job): leave nothing running
            kill_group(proc.pid, signal.SIGKILL)
            _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if reader:
            reader.join(timeout=5)  # EOF once the child's group has let go of the pipe
    return rusage


def _ignore(line: str) -> None:
    pass


def _read_lines(pipe: Any, into: Any, on_line: Callable[[str], None]) -> threading.Thread:
    """A thread copying the child's stderr into `into`, calling `on_line` with each line as it comes."""

    def pump() -> None:
        call = on_line
        with pipe:
            for raw in pipe:
                line = raw.decode(errors="replace")
                into.write(line)
                try:
                    call(line)
                except OSError as e:  # keep draining the pipe (a full one would stall the child); say it once
                    into.write(f"moeplace: stopped following this output: {e}\n")
                    call = _ignore

    reader = threading.Thread(target=pump, name="stderr-lines", daemon=True)
    reader.start()
    return reader


def spawn(
    cmd: list[str], *, env: dict[str, str] | None, log_path: str | Path, before_exec: Callable[[], None] | None = None
) -> subprocess.Popen[bytes]:
    """A service that runs beside a job (the emulated device's server), its output in `log_path`; see stop()."""

    with Path(log_path).open("a") as out:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_child(before_exec)
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a spawned service and everything it started: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid, signal.SIGKILL)
            proc.wait()


def run_checked(cmd: list[str], what: str, log_path: str | Path, **kwargs: Any) -> Finished:
    """`run`, for steps that must succeed: a failure or timeout ends the stage with one line naming `what`."""
    result = run(cmd, log_path=log_path, **kwargs)
    if result.ok:
        return result
    status, reason = classify(result)
    text = result.stderr if result.stderr.strip() else Path(log_path).read_text(errors="replace")
    detail = " | ".join(line.strip() for line in text.splitlines()[-15:] if line.strip())[-600:]
    raise MoeplaceError(f"{what} failed ({reason}); see {log_path}" + (f": {detail}" if detail else "."))


def classify(result: Finished, oom_kills: int = 0, capped: bool = False) -> tuple[str, str]:
    """('ok', '') or (oom/crash/timeout/error, why) for one llama.cpp run."""
    if result.start_error:
        return "error", f"could not start: {result.start_error}"
    if result.timed_out:
        return "timeout", "no result before the timeout"
    if oom_kills:
        return "oom", f"killed by the memory cgroup's OOM killer ({oom_kills} kill(s))" + (
            "" if capped else " without a cap: the machine itself is out of memory"
        )
    if result.stopped:
        return "ok", ""
    if result.returncode is not None and result.returncode < 0:
        # ggml aborts when the CUDA runtime cannot allocate (its cuBLAS handles, graphs, pools): out of memory too
        if -result.returncode == signal.SIGABRT and _OOM.search(result.stderr):
            return "oom", "allocation failed on the device (llama.cpp aborted)"
        return "crash", f"killed by {signal.Signals(-result.returncode).name}"
    if result.returncode == 0:
        return "ok", ""
    if _OOM.search(result.stderr):
        return "oom", "allocation failed on the device"
    if "Remote RPC server crashed" in result.stderr or "Failed to connect" in result.stderr:
        return "crash", "the RPC device went away"
    return "error", f"{result.program} exited with code {result.returncode}"
