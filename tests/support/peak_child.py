"""The difflite command line in a process of its own that, at exit, writes its peak resident set
(VmHWM, MB) as JSON to the file named first. Measured from inside: a parent's ru_maxrss of a
child counts the memory the parent had when it forked.

usage: peak_child.py REPORT_JSON DIFFLITE_ARGS..."""
from __future__ import annotations

import atexit
import json
import sys

from difflite.core.procmem import read_status


def write_peak(report: str) -> None:
    with open(report, "w") as f:
        json.dump(read_status()["VmHWM"], f)


if __name__ == "__main__":
    atexit.register(write_peak, sys.argv.pop(1))
    from difflite.cli import run

    run()
