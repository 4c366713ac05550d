"""This process's memory, read from /proc (Linux): the resident set split into anonymous,
file-backed and shared-memory pages, its high-water mark (VmHWM) and how to reset it, and a
sampler that keeps the peak of each kind over a block of code.

All sizes are MB of 2**20 bytes (the kernel reports kB of 1024 bytes)."""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import subprocess
import sys

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
RESET_HIGH_WATER_MARK = "5"
KINDS = {"rss": "VmRSS", "anon": "RssAnon", "file": "RssFile", "shmem": "RssShmem"}
HIGH_WATER_MARK = "VmHWM"
SAMPLE_INTERVAL_S = 0.01


def process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def read_status(path: str = STATUS) -> dict[str, float]:
    """Every "Name:  N kB" line of a /proc status file, in MB ({} where it cannot be read)."""
    values = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    values[name] = int(parts[0]) / 1024
    except OSError:
        return {}
    return values


def resident_mb() -> dict[str, float | None]:
    """Resident MB now by kind: rss, anon, file, shmem (None for what the kernel does not report)."""
    status = read_status()
    return {kind: status.get(field) for kind, field in KINDS.items()}


def high_water_mark_mb() -> float | None:
    """VmHWM: the largest resident set since the process started or since reset_high_water_mark()."""
    return read_status().get(HIGH_WATER_MARK)


def peak_rss_mb() -> float:
    """VmHWM, or where /proc has none the largest resident set getrusage saw (which no reset lowers)."""
    import resource

    peak = high_water_mark_mb()
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_high_water_mark() -> bool:
    """Set VmHWM to the current resident set; False where the kernel refuses (then VmHWM keeps
    the peak since the process started)."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write(RESET_HIGH_WATER_MARK)
    except OSError:
        return False
    return True


def return_freed_heap() -> bool:
    """Give the pages of freed heap memory back to the system (glibc's malloc_trim); False where
    the C library has none. Large short-lived arrays freed in the heap otherwise stay resident:
    after set_loras, 60 MiB of a rank-32 SD 1.5 LoRA's float32 read-out stayed (PoCL, anonymous
    memory, fresh processes; docs/lab-notebook.md)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's malloc_trim, looked up once (find_library runs ldconfig); None without one."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def larger(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


class MemorySampler:
    """Samples resident_mb() of this process every `interval_s` from a child process, and keeps
    the peak of each kind. The child reads /proc/PID/status, so it keeps sampling while this
    process holds the GIL (creating an interpreter and allocating its tensors do).

        with MemorySampler() as sampler:
            load()
            sampler.mark("after_load")
            run()
        sampler.peaks, sampler.start, sampler.marks["after_load"], sampler.samples

    Where the child cannot run, peaks and marks hold None."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S):
        self.interval_s = interval_s
        self.peaks: dict[str, float | None] = dict.fromkeys(KINDS)
        self.start: dict[str, float | None] = dict.fromkeys(KINDS)
        self.marks: dict[str, dict[str, float | None]] = {}
        self.samples = 0
        self._child: subprocess.Popen | None = None

    def _ask(self, command: str | None) -> dict:
        """Send a command to the child (None: only read) and return its JSON reply ({} on failure)."""
        if self._child is None:
            return {}
        try:
            if command is not None:
                self._child.stdin.write(command + "\n")
                self._child.stdin.flush()
            return json.loads(self._child.stdout.readline() or "{}")
        except (OSError, ValueError):
            return {}

    def mark(self, label: str) -> dict[str, float | None]:
        self.marks[label] = {**dict.fromkeys(KINDS), **self._ask("mark")}
        return self.marks[label]

    def __enter__(self) -> "MemorySampler":
        command = [sys.executable, "-I", __file__, str(os.getpid()), str(self.interval_s)]
        try:
            self._child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        except OSError:
            self._child = None
        self.start.update(self._ask(None))
        return self

    def __exit__(self, *exc_info) -> None:
        final = self._ask("stop")
        self.peaks.update(final.get("peaks", {}))
        self.samples = final.get("samples", 0)
        self._end_child()

    def _end_child(self) -> None:
        if self._child is None:
            return
        for stream in (self._child.stdin, self._child.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._child.wait()
        self._child = None


def watch(pid: int, interval_s: float, commands=sys.stdin, replies=sys.stdout) -> None:
    """The sampler's child: sample /proc/PID/status every interval_s and keep the peaks. Replies
    one JSON line: the values now when started and on "mark"; the peaks and the number of
    samples on "stop" or at the end of the commands."""
    path = f"/proc/{pid}/status"
    peaks: dict[str, float | None] = dict.fromkeys(KINDS)
    samples = 0

    def sample() -> dict[str, float | None]:
        nonlocal peaks, samples
        status = read_status(path)
        now = {kind: status.get(field) for kind, field in KINDS.items()}
        peaks = {kind: larger(peaks[kind], now[kind]) for kind in KINDS}
        samples += 1
        return now

    def reply(value: dict) -> None:
        replies.write(json.dumps(value) + "\n")
        replies.flush()

    reply(sample())
    while True:
        ready, _, _ = select.select([commands], [], [], interval_s)
        now = sample()
        if not ready:
            continue
        if commands.readline().strip() == "mark":
            reply(now)
        else:
            reply({"peaks": peaks, "samples": samples})
            return


class MeasuredMemory:
    """Resets VmHWM, notes the resident set, then samples until the block ends.

        with MeasuredMemory() as memory:
            load()
            memory.mark("after_load")
            run()
        memory.report()   # peak_rss_mb, baseline_rss_mb, peak_anon_mb, ..., after_load_anon_mb, ...
    """

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S):
        self.sampler = MemorySampler(interval_s)
        self.peak_reset = False
        self.baseline_rss_mb: float | None = None
        self.high_water_mb: float | None = None

    def mark(self, label: str) -> dict[str, float | None]:
        return self.sampler.mark(label)

    def __enter__(self) -> "MeasuredMemory":
        self.peak_reset = reset_high_water_mark()
        self.baseline_rss_mb = resident_mb()["rss"]
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self.sampler.__exit__(*exc_info)
        self.high_water_mb = high_water_mark_mb()

    def report(self) -> dict:
        """Peak resident MB (VmHWM, or the largest sample where that is larger or missing), the
        baseline before the block, the peak of each kind sampled, and each mark's values."""
        peaks = self.sampler.peaks
        report = {"peak_reset": self.peak_reset, "baseline_rss_mb": self.baseline_rss_mb,
                  "peak_rss_mb": larger(self.high_water_mb, peaks["rss"]),
                  "samples": self.sampler.samples}
        report.update({f"peak_{kind}_mb": peaks[kind] for kind in KINDS if kind != "rss"})
        for label, values in self.sampler.marks.items():
            report.update({f"{label}_{kind}_mb": value for kind, value in values.items()})
        return report


NVIDIA_SMI_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def nvidia_smi_mb(pid: int | None = None) -> float | None:
    """GPU memory (MB) that nvidia-smi lists for this process (or `pid`); None where nvidia-smi
    is not on PATH, fails, or does not list the process (as inside a container's PID namespace)."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        process = subprocess.run([executable, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if process.returncode != 0:
        return None
    return used_memory_of(process.stdout, os.getpid() if pid is None else pid)


def used_memory_of(listing: str, pid: int) -> float | None:
    """The sum of used_memory over the "pid, used_memory" rows of `pid` (None where it has none)."""
    used = [float(fields[1]) for fields in (line.split(",") for line in listing.splitlines())
            if len(fields) == 2 and fields[0].strip() == str(pid) and is_number(fields[1])]
    return sum(used) if used else None


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]))
