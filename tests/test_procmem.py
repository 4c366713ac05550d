"""difflite/core/procmem.py: this process's memory from /proc (resident sets by kind, the sampler
that keeps a transient peak, the high-water mark and its reset), and nvidia-smi's per-process
memory. `bench` reports these numbers (tests/test_bench.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from difflite.core import procmem

MIB = 1 << 20


def hold_the_gil(seconds: float) -> None:
    """Busy-wait in Python with a switch interval longer than the wait: no other thread of this
    process runs meanwhile, so only a sampler outside the process can see what happens."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
    finally:
        sys.setswitchinterval(interval)


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding path (the longest mount point above it in /proc/self/mounts)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount, fs = fields[1], fields[2]
        if (str(path) + "/").startswith(mount.rstrip("/") + "/") and len(mount) >= len(best):
            best, kind = mount, fs
    return kind


def test_sampler_keeps_a_transient_anonymous_peak():
    """200 MB allocated, touched and freed inside the block, while the GIL is held: the peak stays.
    The pages come from an anonymous mapping of their own (not the heap, where memory earlier tests
    freed may already be resident) and go back with it."""
    import mmap

    import numpy as np

    with procmem.MemorySampler() as sampler:
        block = mmap.mmap(-1, 200 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        np.frombuffer(block, dtype=np.uint8)[::4096] = 1  # touch every page
        hold_the_gil(0.3)
        block.close()
        after_free = sampler.mark("after_free")
    assert sampler.peaks["anon"] - sampler.start["anon"] >= 180, (sampler.start, sampler.peaks)
    assert after_free["anon"] < sampler.peaks["anon"] - 150, "freeing it must lower the resident set"
    assert sampler.samples >= 10


def test_sampler_sees_file_backed_pages(tmp_path):
    """A 100 MB file mapped and read inside the block counts as file-backed (shared memory where
    the temporary folder is a tmpfs), not as anonymous memory."""
    import mmap

    import numpy as np

    path = tmp_path / "blob.bin"
    with open(path, "wb") as f:
        for _ in range(100):
            f.write(os.urandom(MIB))
    kind = "shmem" if filesystem_type(tmp_path) == "tmpfs" else "file"
    with procmem.MemorySampler() as sampler:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            pages = np.frombuffer(mapped, dtype=np.uint8)
            assert int(pages[::4096].astype(np.int64).sum()) >= 0  # one read per page
            hold_the_gil(0.2)
            del pages
    assert sampler.peaks[kind] - sampler.start[kind] >= 90, (kind, sampler.start, sampler.peaks)
    assert sampler.peaks["anon"] - sampler.start["anon"] < 50, (sampler.start, sampler.peaks)


def test_high_water_mark_reset_and_a_refused_reset(monkeypatch):
    import numpy as np

    block = np.ones(200 * MIB // 8)
    del block
    assert procmem.high_water_mark_mb() - procmem.resident_mb()["rss"] >= 180
    assert procmem.reset_high_water_mark() is True
    assert procmem.high_water_mark_mb() <= procmem.resident_mb()["rss"] + 8
    monkeypatch.setattr(procmem, "CLEAR_REFS", "/proc/self/no_such_file")
    with procmem.MeasuredMemory() as memory:
        memory.mark("after_load")
    report = memory.report()
    assert report["peak_reset"] is False and report["peak_rss_mb"] >= report["baseline_rss_mb"] > 0
    assert report["after_load_rss_mb"] > 0


def test_nvidia_smi_memory_of_this_process(tmp_path, monkeypatch):
    """nvidia-smi's compute-apps listing: this process's rows summed; absent from PATH: None."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "{procmem.NVIDIA_SMI_QUERY[0]}" ] || exit 9\n'
                    'echo "1, 999"\necho "$PPID, 321"\necho "$PPID, 79"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert procmem.nvidia_smi_mb() == 400
    assert procmem.nvidia_smi_mb(pid=1) == 999 and procmem.nvidia_smi_mb(pid=2) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert procmem.nvidia_smi_mb() is None


FREED_HEAP_CHILD = """
import ctypes, ctypes.util, json
from difflite.core import procmem
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
# 64 KiB chunks (below mmap's threshold: heap), each followed by a live 1 KiB one, so that the freed
# ones cannot merge with each other or with the heap's top, which free() would give back itself
chunks, pins = [], []
for _ in range(1024):
    chunks.append(libc.malloc(64 << 10))
    pins.append(libc.malloc(1 << 10))
for chunk in chunks:
    ctypes.memset(chunk, 1, 64 << 10)
for chunk in chunks:
    libc.free(chunk)
freed = procmem.resident_mb()["anon"]
given = procmem.return_freed_heap()
print(json.dumps({"freed": freed, "given_back": procmem.resident_mb()["anon"], "trimmed": given}))
"""


def test_freed_heap_memory_goes_back_to_the_system():
    """64 MiB of freed heap chunks between live ones stay resident until return_freed_heap (which
    the runtime calls after set_loras and after a model's first call)."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-c", FREED_HEAP_CHILD], capture_output=True, text=True, check=True)
    row = json.loads(done.stdout)
    assert row["trimmed"], "glibc has malloc_trim"
    assert row["freed"] - row["given_back"] >= 48, row
