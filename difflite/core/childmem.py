"""A command's wall time, its own peak resident set and its peak GPU memory, measured from outside
(the benchmarks' and tests' one way to time and size a process).

Why a launcher: Linux carries the high-water mark of the address space exec replaces into the new
image's ru_maxrss, so a command spawned straight from a large process (a benchmark that built a
model) reports at least that process's peak. Here a small Python launcher spawns the command and
reports, through a pipe of its own: the command's pid (at once, so that nvidia-smi is polled for
the command itself), then its wall time, exit status and ru_maxrss (RUSAGE_CHILDREN of a process
with one child: that child's own peak, never below the launcher's few MB).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

GPU_POLL_S = 0.5
PEAK_PARTS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")

# argv: the report pipe's fd, then the command. Reports "pid N", then "wall_s X", "returncode N"
# and "maxrss_kb N", one a line.
LAUNCHER = """
import os, resource, subprocess, sys, time
fd = int(sys.argv[1])
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
os.write(fd, b"pid %d\\n" % child.pid)
returncode = child.wait()
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
os.write(fd, b"wall_s %r\\nreturncode %d\\nmaxrss_kb %d\\n" % (wall, returncode, peak))
"""


@dataclass
class CommandRun:
    returncode: int | None  # None: killed at the timeout
    wall_s: float | None
    stdout: str
    stderr: str
    peak_rss_mb: float | None  # the command's own VmHWM at its peak (ru_maxrss), MB of 2**20 bytes
    gpu_peak_mb: float | None  # the largest GPU memory nvidia-smi listed for it; None without
    timed_out: bool = False
    # The largest resident set + GPU memory read at the same poll: what a unified-memory device would
    # hold at once, where the two peaks' sum (above) is an upper bound. None without nvidia-smi.
    combined_peak_mb: float | None = None
    # At that poll: "gpu" and the status' VmRSS, RssAnon (heap, stacks: the process's own),
    # RssFile (mapped files' pages: libraries, a model's file) and RssShmem, MB. None without it.
    combined_peak_parts: dict | None = None


class _Reports:
    """Reads the launcher's report pipe; polls nvidia-smi for the command once its pid is known."""

    def __init__(self, fd: int):
        self.values: dict[str, str] = {}
        self.gpu_peak_mb: float | None = None
        self.combined_peak_mb: float | None = None
        self.combined_peak_parts: dict | None = None
        self._fd = fd
        self._done = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True)]
        self._threads[0].start()

    def _read(self) -> None:
        with os.fdopen(self._fd) as pipe:
            for line in pipe:
                key, _, value = line.strip().partition(" ")
                self.values[key] = value
                if key == "pid":
                    poller = threading.Thread(target=self._poll_gpu, args=(int(value),), daemon=True)
                    self._threads.append(poller)
                    poller.start()

    def _poll_gpu(self, pid: int) -> None:
        from difflite.core.procmem import nvidia_smi_mb, read_status

        while not self._done.wait(GPU_POLL_S):
            used = nvidia_smi_mb(pid)
            if used is None:
                continue
            self.gpu_peak_mb = max(self.gpu_peak_mb or 0.0, used)
            status = read_status(f"/proc/{pid}/status")
            resident = status.get("VmRSS")
            if resident is not None and used + resident > (self.combined_peak_mb or 0.0):
                self.combined_peak_mb = used + resident
                self.combined_peak_parts = {"gpu": used, **{key: status.get(key) for key in PEAK_PARTS}}

    def finish(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join()


def measure_command(command: list[str], env: dict | None = None, cwd=None,
                    timeout: float | None = None) -> CommandRun:
    """Runs `command` (stdout and stderr captured as text) and measures it; killed, with its
    process group, after `timeout` seconds."""
    read_fd, write_fd = os.pipe()
    try:
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(write_fd), *command], env=env, cwd=cwd,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    pass_fds=(write_fd,), start_new_session=True)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    reports = _Reports(read_fd)
    timed_out = False
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(launcher.pid, signal.SIGKILL)
        stdout, stderr = launcher.communicate()
    reports.finish()
    values = reports.values
    peak_kb = values.get("maxrss_kb")
    return CommandRun(
        returncode=None if timed_out else int(values.get("returncode", launcher.returncode)),
        wall_s=float(values["wall_s"]) if "wall_s" in values else None,
        stdout=stdout, stderr=stderr,
        peak_rss_mb=int(peak_kb) / 1024 if peak_kb else None,
        gpu_peak_mb=reports.gpu_peak_mb, timed_out=timed_out, combined_peak_mb=reports.combined_peak_mb,
        combined_peak_parts=reports.combined_peak_parts)
