"""The fp16 lane: the OpenCL tests of half storage and half arithmetic, run again in a child pytest
on an OpenCL device that has cl_khr_fp16.

PoCL, where the other OpenCL tests run, has no cl_khr_fp16: there precision=fp16 is vload_half
storage with float arithmetic, and the kernels' cl_khr_fp16 path (half buffers accessed directly,
-DDL_FP16=1) and their half multiply-adds (-DDL_FP16_MATH=1) would only be compiled. Intel's CPU
runtime for OpenCL has the extension on any x86-64 CPU; scripts/fetch_fp16_opencl.sh (run by
scripts/setup.sh --test) unpacks it, and the child sees only it (OCL_ICD_VENDORS). The child's
tests assert that the delegate ran half arithmetic (DIFFLITE_EXPECT_ARITHMETIC=float16).

A missing runtime is a failure that names the fetch script, never a skip.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT, TESTS

DEFAULT_DIR = Path.home() / ".cache" / "difflite" / "intel-cpu-opencl-2026.2.0"

# (test files, -k expression, at least this many tests must pass)
LANES = {
    "builtins": (("test_opencl_builtins.py",), "fp16 or tensor_cores", 200),
    "models": (("test_opencl_models.py",), "fp16", 5),
    "kernels": (("test_op_group_norm.py", "test_op_gelu.py", "test_op_attention.py", "test_opencl_programs.py"),
                "half_io or fp16", 11),
}


@pytest.fixture(scope="module")
def fp16_vendors() -> Path:
    root = Path(os.environ.get("DIFFLITE_FP16_OPENCL_DIR", DEFAULT_DIR))
    icd = root / "vendors" / "intel-cpu.icd"
    if not icd.is_file() or not (root / "lib" / "libintelocl.so").is_file():
        pytest.fail(f"no OpenCL runtime with cl_khr_fp16 at {root}: run scripts/fetch_fp16_opencl.sh "
                    "(scripts/setup.sh --test does), or set DIFFLITE_FP16_OPENCL_DIR")
    return icd.parent


@pytest.mark.parametrize("lane", sorted(LANES))
def test_fp16_lane(fp16_vendors, lane):
    paths, expression, at_least = LANES[lane]
    env = dict(os.environ,
               OCL_ICD_VENDORS=str(fp16_vendors),
               DIFFLITE_OPENCL_DEVICE="Intel(R) OpenCL",  # the pyopencl harness's device choice
               DIFFLITE_EXPECT_ARITHMETIC="float16")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-k", expression,
         *(str(TESTS / path) for path in paths)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, f"the fp16 lane failed ({' '.join(paths)} -k {expression}):\n{tail}"
    summary = result.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= at_least, f"too few tests ran:\n{tail}"
    assert not re.search(r"skipped|xfail|xpass", summary), f"a test was not run:\n{tail}"
