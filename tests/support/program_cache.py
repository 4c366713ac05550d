"""The OpenCL program cache's files as tests/test_hostile_program_cache.py forges them, and a
child process watched for time and memory.

An entry (custom_ops/delegate/opencl/cache_entry.h): magic, key length, key text, binary length,
binary, then a tag over all that precedes it; lengths and tag little-endian uint64. The tag of
format 2 (`DLCLBIN2`) is SipHash-2-4 under the folder's 16-byte secret (its file `key`); format 1
(`DLCLBIN1`, before issue 35) carried FNV-1a 64, which anyone can recompute.

`siphash24` is written here from the specification (Aumasson and Bernstein, "SipHash: a fast
short-input PRF", INDOCRYPT 2012, section 2), apart from the library's C++, so that a test that
forges a correctly keyed entry checks the library's tag against an independent one."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MASK = 2**64 - 1
MAGIC_KEYED, MAGIC_UNKEYED = b"DLCLBIN2", b"DLCLBIN1"
SECRET_NAME = "key"
# SipHash-2-4 with key 00 01 .. 0f over the message 00 01 .. 0e (the paper's appendix A).
PAPER_VECTOR = (bytes(range(16)), bytes(range(15)), 0xA129CA6149BE45E5)


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & MASK


def _sip_round(v: list[int]) -> None:
    v[0] = (v[0] + v[1]) & MASK; v[1] = _rotl(v[1], 13) ^ v[0]; v[0] = _rotl(v[0], 32)
    v[2] = (v[2] + v[3]) & MASK; v[3] = _rotl(v[3], 16) ^ v[2]
    v[0] = (v[0] + v[3]) & MASK; v[3] = _rotl(v[3], 21) ^ v[0]
    v[2] = (v[2] + v[1]) & MASK; v[1] = _rotl(v[1], 17) ^ v[2]; v[2] = _rotl(v[2], 32)


def siphash24(secret: bytes, data: bytes) -> int:
    k0, k1 = struct.unpack("<QQ", secret)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    whole = len(data) - len(data) % 8
    words = list(struct.unpack(f"<{whole // 8}Q", data[:whole]))
    words.append(int.from_bytes(data[whole:], "little") | (len(data) & 0xFF) << 56)
    for m in words:
        v[3] ^= m
        _sip_round(v)
        _sip_round(v)
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        _sip_round(v)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


@dataclass
class Entry:
    magic: bytes
    key: bytes
    binary: bytes
    tag: int

    def body(self) -> bytes:
        return (self.magic + struct.pack("<Q", len(self.key)) + self.key + struct.pack("<Q", len(self.binary))
                + self.binary)


def read_entry(path: Path) -> Entry:
    data = path.read_bytes()
    (key_len,) = struct.unpack_from("<Q", data, 8)
    key = data[16:16 + key_len]
    (bin_len,) = struct.unpack_from("<Q", data, 16 + key_len)
    binary = data[24 + key_len:24 + key_len + bin_len]
    (tag,) = struct.unpack_from("<Q", data, len(data) - 8)
    return Entry(data[:8], key, binary, tag)


def keyed_entry(key: bytes, binary: bytes, secret: bytes) -> bytes:
    body = Entry(MAGIC_KEYED, key, binary, 0).body()
    return body + struct.pack("<Q", siphash24(secret, body))


def unkeyed_entry(key: bytes, binary: bytes) -> bytes:
    """The format before issue 35: a checksum anyone can compute."""
    body = Entry(MAGIC_UNKEYED, key, binary, 0).body()
    return body + struct.pack("<Q", fnv1a64(body))


def damaged(binary: bytes, flips: int = 50, seed: int = 4) -> bytes:
    """`binary` with `flips` seeded bit flips after its first 64 bytes (the driver's own header
    stays, so the damage reaches the driver's loader)."""
    import random

    r, out = random.Random(seed), bytearray(binary)
    for _ in range(flips):
        out[r.randrange(64, len(out))] ^= 1 << r.randrange(8)
    return bytes(out)


# --------------------------------------------------------------------------------------------
# A watched child


@dataclass
class Watched:
    returncode: int | None  # None: killed by the watch
    stdout: str
    stderr: str
    peak_rss_mb: float
    seconds: float
    killed_for: str  # "" or why the watch killed it


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_watched(args: list[str], seconds: float, max_rss_mb: float, env: dict | None = None) -> Watched:
    """Runs `args`, sampling its resident set every 10 ms; kills it (SIGKILL) when it grows past
    `max_rss_mb` or runs past `seconds` (a read without end fills memory fast, a FIFO hangs)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        child = subprocess.Popen(args, stdout=out, stderr=err, text=True, env=env)
        peak, killed_for = 0.0, ""
        while child.poll() is None:
            peak = max(peak, _rss_mb(child.pid))
            elapsed = time.monotonic() - start
            if peak > max_rss_mb or elapsed > seconds:
                killed_for = (f"resident set past {max_rss_mb:.0f} MiB" if peak > max_rss_mb
                              else f"still running after {seconds:.0f} s")
                child.send_signal(signal.SIGKILL)
                child.wait()
                break
            time.sleep(0.01)
        elapsed = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return Watched(None if killed_for else child.returncode, out.read(), err.read(), peak, elapsed, killed_for)

