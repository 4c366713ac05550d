"""Hostile OpenCL program caches (issue 35, items 6 and 7): what a fresh process does with a cache
folder (cache_dir) that someone else could have written, or that holds things no difflite process
wrote. The corpus: a cache a small model filled (one program, on PoCL), then one damage a case:

* an entry replaced by a symlink to /dev/zero, a FIFO, a folder or a 1 GiB sparse file (before:
  read without end, or a hang), owned by another user or writable by others (before: loaded);
* an entry forged with valid framing and the checksum of the old format, or tagged under a key
  that is not the folder's, around a damaged driver binary (before: given to the driver; PoCL
  2.10 here segfaulted inside clCreateProgramWithBinary on one of eight seeded damages of 50 bit
  flips, and loaded the others as if whole: a PoCL binary holds the kernels' host code); a
  correctly keyed entry whose binary the driver refuses;
* the folder writable by group or others, a symlink, another user's; its key file a symlink,
  readable by others, another user's or of the wrong size.

Each case runs the model in a fresh child (tests/support/runtime_child.py) watched for time and
resident memory (support.program_cache.run_watched): it must finish, give the model's output, and
its stats must name the rejected entry's reason (program_cache_rejected: the program is rebuilt
from source and the entry stored again, so the next process loads it) or the refused folder's
(program_cache_refused: no cache for the process, nothing written there).

The tests run as root (CI's containers): the other-user cases chown to uid 65534."""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from support import SUPPORT
from support.opencl_helpers import OpModel
from support.program_cache import (PAPER_VECTOR, SECRET_NAME, damaged, keyed_entry, read_entry, run_watched,
                                   siphash24, unkeyed_entry)

CHILD = SUPPORT / "runtime_child.py"
SECONDS = 120  # a normal run takes a few seconds on the shared CI machine
MAX_RSS_MB = 1024  # a normal run peaks near 250 MiB; reading a 1 GiB entry whole passes this
NOBODY = 65534


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """x [4, 8] -> (x + c) * c: one OpenCL program (the elementwise binary kernel)."""
    m = OpModel()
    x = m.activation("x", (4, 8))
    c = m.constant("c", np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8))
    y, z = m.activation("y", (4, 8)), m.activation("z", (4, 8))
    m.builtin("ADD", [x, c], [y])
    m.builtin("MUL", [y, c], [z])
    return m.save(tmp_path_factory.mktemp("cache-model") / "model.tflite", [x], [z])


def run(lib: Path, model: Path, cache_dir: Path) -> dict:
    watched = run_watched([sys.executable, str(CHILD), str(lib), str(model), str(cache_dir), "", json.dumps({"precision": "fp32"})],
                          SECONDS, MAX_RSS_MB)
    assert not watched.killed_for, f"killed: {watched.killed_for}\n{watched.stderr[-3000:]}"
    assert watched.returncode == 0, f"exit {watched.returncode}\n{watched.stderr[-3000:]}"
    got = {**json.loads(watched.stdout.splitlines()[-1]), "stderr": watched.stderr, "rss_mb": watched.peak_rss_mb}
    np.testing.assert_allclose(got["output_head"], got["reference_head"], rtol=2e-2, atol=2e-2)
    return got


@pytest.fixture(scope="module")
def filled(opencl_lib, model, tmp_path_factory) -> dict:
    """A cache the model filled, and that first run."""
    cache = tmp_path_factory.mktemp("filled") / "cache"
    first = run(opencl_lib, model, cache)
    assert first["stats"]["programs_compiled"] == 1, first["stats"]
    return {"cache": cache, "run": first}


def the_entry(cache: Path) -> Path:
    (entry,) = cache.glob("*.clbin")
    return entry


def replace(path: Path, make: Callable[[Path], object]) -> None:
    path.unlink()
    make(path)


def forge(entry: Path, binary_of: Callable[[bytes], bytes], writer: Callable[[bytes, bytes], bytes]) -> None:
    old = read_entry(entry)
    entry.write_bytes(writer(old.key, binary_of(old.binary)))


def secret_of(cache: Path) -> bytes:
    return (cache / SECRET_NAME).read_bytes()


def grow_sparse(path: Path, size: int = 1 << 30) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the other-user cases chown files to uid 65534: run the tests as root (as CI does)")


def chown_to_nobody(path: Path) -> None:
    require_root()
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


@dataclass
class CacheCase:
    id: str
    damage: Callable[[Path], object]  # given the cache folder
    reason: str  # in the stats' reason
    heals: bool = True  # the rebuilt entry can replace what is there
    through_symlink: bool = False  # cache_dir names a symlink to the folder


def entry_damage(make: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda cache: make(the_entry(cache))


ENTRY_CASES = [
    CacheCase("symlink-to-dev-zero", entry_damage(lambda e: replace(e, lambda p: p.symlink_to("/dev/zero"))),
              "a symbolic link"),
    CacheCase("fifo", entry_damage(lambda e: replace(e, lambda p: os.mkfifo(p, 0o600))), "not a regular file"),
    CacheCase("folder", entry_damage(lambda e: replace(e, lambda p: p.mkdir())), "not a regular file", heals=False),
    CacheCase("sparse-1gib", entry_damage(grow_sparse), "over the bound"),
    CacheCase("of-another-user", entry_damage(chown_to_nobody), f"owned by uid {NOBODY}"),
    CacheCase("writable-by-others", entry_damage(lambda e: e.chmod(0o666)), "open to other users"),
    CacheCase("unkeyed-old-format", entry_damage(lambda e: forge(e, damaged, unkeyed_entry)), "unkeyed"),
    CacheCase("tagged-without-the-key",
              entry_damage(lambda e: forge(e, damaged, lambda k, b: keyed_entry(k, b, bytes(16)))),
              "tag does not match"),
    CacheCase("keyed-binary-the-driver-refuses",
              lambda cache: forge(the_entry(cache), lambda b: bytes(len(b)),
                                  lambda k, b: keyed_entry(k, b, secret_of(cache))),
              "the driver refused the stored binary"),
]

FOLDER_CASES = [
    CacheCase("a-symlink", lambda cache: None, "a symbolic link", through_symlink=True),
    CacheCase("writable-by-others", lambda cache: cache.chmod(0o777), "open to other users"),
    CacheCase("group-writable", lambda cache: cache.chmod(0o770), "open to other users"),
    CacheCase("of-another-user", chown_to_nobody, f"owned by uid {NOBODY}"),
    CacheCase("key-a-symlink-to-dev-zero",
              lambda cache: replace(cache / SECRET_NAME, lambda p: p.symlink_to("/dev/zero")),
              "key file: a symbolic link"),
    CacheCase("key-readable-by-others", lambda cache: (cache / SECRET_NAME).chmod(0o644),
              "key file: open to other users"),
    CacheCase("key-of-another-user", lambda cache: chown_to_nobody(cache / SECRET_NAME),
              f"key file: owned by uid {NOBODY}"),
    CacheCase("key-too-long", lambda cache: (cache / SECRET_NAME).write_bytes(bytes(17)), "key file: 17 bytes"),
    CacheCase("key-too-short", lambda cache: (cache / SECRET_NAME).write_bytes(bytes(15)), "key file: not 16 bytes"),
]


def copy_of(filled: dict, tmp_path: Path) -> Path:
    return Path(shutil.copytree(filled["cache"], tmp_path / "cache", symlinks=True))


def snapshot(cache: Path) -> dict[str, tuple]:
    return {p.name: (p.lstat().st_mode, p.lstat().st_uid, p.lstat().st_mtime_ns, p.lstat().st_size)
            for p in cache.iterdir()}


@pytest.mark.parametrize("case", ENTRY_CASES, ids=[c.id for c in ENTRY_CASES])
def test_hostile_entry_is_rebuilt(case, opencl_lib, model, filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    case.damage(cache)
    got = run(opencl_lib, model, cache)
    stats = got["stats"]
    assert stats["programs_from_cache"] == 0 and stats["programs_compiled"] == 1, stats
    np.testing.assert_array_equal(got["output_head"], filled["run"]["output_head"])
    (rejected,) = stats["program_cache_rejected"]
    assert case.reason in rejected["reason"], rejected
    assert rejected["entry"] == str(the_entry(cache)) and "rebuilding" in got["stderr"], got["stderr"][-2000:]
    if case.heals:
        entry = the_entry(cache).lstat()
        assert stat.S_ISREG(entry.st_mode) and entry.st_uid == os.geteuid() and entry.st_mode & 0o777 == 0o600
        again = run(opencl_lib, model, cache)["stats"]
        assert again["programs_from_cache"] == 1 and not again["program_cache_rejected"], again


@pytest.mark.parametrize("case", FOLDER_CASES, ids=[c.id for c in FOLDER_CASES])
def test_hostile_folder_is_not_used(case, opencl_lib, model, filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    case.damage(cache)
    cache_dir = cache
    if case.through_symlink:
        cache_dir = tmp_path / "link"
        cache_dir.symlink_to(cache)
    before = snapshot(cache)
    got = run(opencl_lib, model, cache_dir)
    stats = got["stats"]
    assert stats["programs_from_cache"] == 0 and stats["programs_compiled"] == 1, stats
    assert case.reason in stats["program_cache_refused"], stats
    assert got["stderr"].count(f"program cache: not using {cache_dir}") == 1, got["stderr"][-2000:]
    assert snapshot(cache) == before  # nothing read into use, nothing written
    np.testing.assert_array_equal(got["output_head"], filled["run"]["output_head"])


# --------------------------------------------------------------------------------------------
# What a sound cache looks like


def test_siphash_of_the_tests_matches_the_paper():
    key, message, want = PAPER_VECTOR
    assert siphash24(key, message) == want


def test_entries_are_tagged_with_the_folders_key(filled):
    """The library's tag equals the tests' own SipHash-2-4 under the folder's key; the folder, its
    key and its entries are the user's alone."""
    cache = filled["cache"]
    entry = read_entry(the_entry(cache))
    assert entry.magic == b"DLCLBIN2"
    assert entry.tag == siphash24(secret_of(cache), entry.body())
    assert entry.tag != siphash24(bytes(16), entry.body())
    for path, mode in ((cache, 0o700), (cache / SECRET_NAME, 0o600), (the_entry(cache), 0o600)):
        assert path.stat().st_mode & 0o777 == mode and path.stat().st_uid == os.geteuid(), path


def test_created_folders_are_private(opencl_lib, model, tmp_path):
    cache = tmp_path / "a" / "b" / "cache"
    got = run(opencl_lib, model, cache)["stats"]
    assert got["program_cache_refused"] == "" and got["programs_compiled"] == 1, got
    for folder in (tmp_path / "a", tmp_path / "a" / "b", cache):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
