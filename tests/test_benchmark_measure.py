"""How the benchmarks and tests time and size a process (difflite.core.childmem, and
benchmarks/headline.py's run_measured over it): the peak RSS is the command's own, also when the
measuring process is large (Linux carries a parent's high-water mark into a spawned child's
ru_maxrss at exec); nvidia-smi is polled for the command's pid, not the launcher's; a timeout kills
the command itself."""

from __future__ import annotations

import os
import resource
import sys
import textwrap
import time

import numpy as np
import pytest

from benchmarks.headline import run_measured
from difflite.core.childmem import measure_command
from difflite.core.procmem import process_running

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
    assert 0.5 <= measured["wall_s"] < 30
    del ballast


def test_a_failing_child_raises_with_its_stderr():
    with pytest.raises(RuntimeError, match="(?s)exited 1.*no model here"):
        run_measured([sys.executable, "-c", "import sys; sys.exit('no model here')"], timeout=60)


# nvidia-smi's query as a script: every process whose command line holds MARKER "uses" GPU memory,
# 777 MB where MARKER opens its `-c` program (the measured command) and 999 where it comes later
# (the launcher, whose arguments hold the command).
FAKE_NVIDIA_SMI = textwrap.dedent("""\
    #!{python}
    import os
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{{pid}}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if any(b"{marker}" in a for a in args):
            print(f"{{pid}}, {{777 if args[2:3] and args[2].startswith(b'{marker}') else 999}}")
    """)


MARKER = "#gpu-poll-marker"


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch) -> None:
    """FAKE_NVIDIA_SMI first on PATH."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable, marker=MARKER))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_gpu_is_polled_for_the_command_not_its_launcher(fake_nvidia_smi):
    run = measure_command([sys.executable, "-c", f"{MARKER}\nimport time; time.sleep(2)"])
    assert run.returncode == 0, run.stderr
    assert run.gpu_peak_mb == 777


def test_host_and_gpu_are_read_at_the_same_poll(fake_nvidia_smi):
    """The combined peak is the resident set beside the GPU's figure of the same poll: above the GPU
    figure by the ~300 MB the command holds while it sleeps, not above the two peaks' sum."""
    program = f"{MARKER}\nimport time; held = bytearray(300 * 2**20); held[::4096] = b'x' * len(held[::4096]); time.sleep(3)"
    run = measure_command([sys.executable, "-c", program])
    assert run.returncode == 0, run.stderr
    assert run.gpu_peak_mb == 777
    # VmRSS and ru_maxrss count a few hundred kB differently (seen: 313.42 against 313.34 MB)
    assert 777 + 300 <= run.combined_peak_mb <= 777 + run.peak_rss_mb + 1
    # that poll's parts: the 300 MB bytearray is the process's own (anonymous) memory
    parts = run.combined_peak_parts
    assert parts["gpu"] == 777 and parts["VmRSS"] == pytest.approx(run.combined_peak_mb - 777), parts
    assert parts["RssAnon"] >= 300 and parts["RssAnon"] + parts["RssFile"] + parts["RssShmem"] == pytest.approx(
        parts["VmRSS"], abs=0.01), parts


def status_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return ""


def test_a_timeout_kills_the_command(tmp_path):
    pid_file = tmp_path / "pid"
    program = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    start = time.perf_counter()
    run = measure_command([sys.executable, "-c", program], timeout=2)
    assert run.timed_out and run.returncode is None
    assert time.perf_counter() - start < 30
    pid = int(pid_file.read_text())
    for _ in range(50):  # killed with its group; reaped by its launcher's end or by init
        if not process_running(pid) or "zombie" in status_of(pid):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the command (pid {pid}) still runs after the timeout")


def test_a_command_that_cannot_start_reports_the_launchers_failure(tmp_path):
    run = measure_command([str(tmp_path / "no-such-program")])
    assert run.returncode not in (0, None) and not run.timed_out
    assert "no-such-program" in run.stderr
