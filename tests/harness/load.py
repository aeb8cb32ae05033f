"""How busy this machine is right now, for tests whose schedule runs on the wall clock.

A continuous deployment starts each epoch at a fixed time; on a machine whose cores are shared with
other work, a period sized for an idle machine is overrun and epochs are skipped. Such tests stretch
their periods by :func:`contention`, measured in the test's own process: the wall time a busy loop
takes over the CPU time it got (1.0 idle; 1.5 with two busy loops beside one process on two cores).
"""

from __future__ import annotations

import time

__all__ = ["contention", "stretched"]

MAX_STRETCH = 4.0  # beyond this the machine is too busy for any schedule: the test will say so


def contention(sample: float = 0.3) -> float:
    """Wall seconds per CPU second of a single-threaded busy loop run for about ``sample`` s (>= 1)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < sample:
        sum(range(10_000))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return max(1.0, wall / max(cpu, 1e-6))


def stretched(seconds: float, factor: float | None = None) -> float:
    """``seconds`` times the machine's contention now (or ``factor``), at most :data:`MAX_STRETCH` times."""
    return seconds * min(MAX_STRETCH, contention() if factor is None else factor)
