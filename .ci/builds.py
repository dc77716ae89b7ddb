"""CI: make the pinned llama.cpp builds that `pytest -m 'llamacpp or long or vulkan'` uses, exactly as its tests
provision them (the CPU build of tests/llamacpp_helpers.py; the lavapipe one of tests/test_vulkan.py where Mesa's
lavapipe is installed), so that .ci/run can build them while the plain suite runs. A cached build returns at once.
Each build's progress is in its own log (/tmp/moeplace-test-llamacpp.log, /tmp/moeplace-test-lavapipe.log)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import llamacpp_helpers  # noqa: E402
import test_vulkan  # noqa: E402


def main() -> int:
    started = time.monotonic()
    print(f"llama.cpp, CPU build: {llamacpp_helpers.manifest().bin_dir} ({time.monotonic() - started:.0f} s)")
    if missing := test_vulkan._missing():
        print(f"llama.cpp, Vulkan build: not made ({missing}); the vulkan tests will say so")
        return 0
    started = time.monotonic()
    print(f"llama.cpp, Vulkan build: {test_vulkan.manifest().bin_dir} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
