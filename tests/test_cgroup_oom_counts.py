"""The memory cgroup's OOM-kill count: read from memory.events (v2) or memory.oom_control (v1), from
memory.events.local where memory.events cannot be read, and an unreadable count is an error, not a count of 0."""

from __future__ import annotations

import pytest

from moeplace.core.errors import MoeplaceError
from moeplace.runtime.cgroup import MemoryCgroup


def test_an_unreadable_oom_count_is_an_error_not_zero(tmp_path):
    (tmp_path / "memory.events").mkdir()  # reading it fails (a directory), even as root
    with pytest.raises(MoeplaceError) as err:
        MemoryCgroup(tmp_path, 2).oom_kills()
    assert "memory.events" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(MoeplaceError, match="memory.oom_control"):
        MemoryCgroup(tmp_path, 1).oom_kills()


def test_the_oom_count_falls_back_to_memory_events_local(tmp_path):
    (tmp_path / "memory.events").mkdir()
    (tmp_path / "memory.events.local").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert MemoryCgroup(tmp_path, 2).oom_kills() == 1


def test_readable_oom_counts_are_read(tmp_path):
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    assert MemoryCgroup(tmp_path, 2).oom_kills() == 0
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert MemoryCgroup(tmp_path, 1).oom_kills() == 2
