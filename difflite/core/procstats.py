"""This process's memory high-water mark, readable and resettable per stage (Linux)."""

from __future__ import annotations

import resource


def reset_peak_rss() -> None:
    """Linux lets a process reset its own high-water mark (VmHWM), which gives per-stage peaks.
    Note that this also resets what ru_maxrss reports for the process afterwards."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
