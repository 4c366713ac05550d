"""Fixtures of the OpenCL kernel tests (tests/test_op_*.py, tests/test_opencl_programs.py), made once
a session: tests/conftest.py registers this module (`pytest_plugins`) and runs every test that takes
one of them in the "opencl" xdist group (one worker, before anything loads tensorflow into it).

* launch: benchmarks/gpu_kernels_harness/launch.py, which launches the op library's kernels from
  Python with the plans of the C++ host code (custom_ops/ops/<op>/<op>_opencl.cc);
* runner: its Runner on the OpenCL device: PoCL (the CPU OpenCL device), or the platform / device
  whose name holds $DIFFLITE_OPENCL_DEVICE; float32 storage (-DDL_T=float -DDL_T4=float4);
* half_runner: the same device with half storage through vload_half / vstore_half
  (-DDL_HALF_IO=1, no cl_khr_fp16 needed).

No OpenCL (pyopencl missing, no ICD, no matching device) is a failure with the reason, never a skip.
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def launch():
    try:
        import pyopencl  # noqa: F401
    except ImportError as e:  # a failure, not a skip
        pytest.fail(f"pyopencl is not importable ({e}); `pip install pyopencl` and "
                    "`apt-get install pocl-opencl-icd` to run the OpenCL kernel tests")
    from benchmarks.gpu_kernels_harness import launch as mod

    return mod


@pytest.fixture(scope="session")
def runner(launch):
    prefer = os.environ.get("DIFFLITE_OPENCL_DEVICE", "Portable Computing Language")
    try:
        ctx, dev = launch.pick_context(prefer=prefer)
    except Exception as e:  # no ICD loader, no platform, no PoCL
        pytest.fail(f"no OpenCL device matching {prefer!r} ({type(e).__name__}: {e}); "
                    "install pocl-opencl-icd (PoCL) or set DIFFLITE_OPENCL_DEVICE")
    return launch.Runner(ctx, dev)


@pytest.fixture(scope="session")
def half_runner(launch, runner):
    return launch.Runner(runner.ctx, runner.device, half_io=True)
