"""benchmarks/headline.py's run_measured, which every picture benchmark times processes with: the
peak RSS it reports is the child's own, also when the benchmark process itself is large (Linux
carries a parent's high-water mark into a spawned child's ru_maxrss at exec)."""

from __future__ import annotations

import resource
import sys

import numpy as np
import pytest

from benchmarks.headline import run_measured

CHILD_MB = 120
PARENT_EXTRA_MB = 600


def test_a_child_of_a_large_process_reports_its_own_peak():
    ballast = np.ones(PARENT_EXTRA_MB * 2**20, np.uint8)  # touched: resident in this process
    own_peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = (f"import time, numpy as np; a = np.ones({CHILD_MB} * 2**20, np.uint8); "
             "time.sleep(0.5); print(int(a.sum() > 0))")
    measured = run_measured([sys.executable, "-c", child], timeout=60)
    assert measured["stdout"].strip() == "1"
    assert own_peak_mib > CHILD_MB + PARENT_EXTRA_MB
    # the child's own pages (numpy's import and its array), not this process's
    assert CHILD_MB <= measured["peak_rss_mib"] < CHILD_MB + 200
    assert measured["wall_s"] >= 0.5
    del ballast


def test_a_failing_child_raises_with_its_stderr():
    with pytest.raises(RuntimeError, match="(?s)exited 1.*no model here"):
        run_measured([sys.executable, "-c", "import sys; sys.exit('no model here')"], timeout=60)
