"""What the OpenMP tests' child interpreters read: this process's OS threads (an OpenMP team's workers among them)."""
from __future__ import annotations

import os
import time


def threads() -> int:
    """OS threads of this process now."""
    return len(os.listdir("/proc/self/task"))


def settle(at_most: int, seconds: float = 5.0) -> int:
    """The thread count once it is back to ``at_most`` or ``seconds`` have passed: a finished thread's team leaves a
    moment after the thread."""
    deadline = time.monotonic() + seconds
    while threads() > at_most and time.monotonic() < deadline:
        time.sleep(0.1)
    return threads()
