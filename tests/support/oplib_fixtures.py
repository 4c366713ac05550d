"""Fixtures of the op library's tests (tests/test_op_*.py, tests/test_oplib_delegate.py);
tests/conftest.py registers this module (`pytest_plugins`).

* runtime: a test taking it runs once on ai_edge_litert ("litert") and once on tensorflow's
  tf.lite ("tf"), the second runtime of the delegate's ABI (the same header, another build of
  TFLite). tensorflow missing is a failure, never a skip. No process runs an in-process OpenCL
  test after a "tf" run (conftest.py's order: PoCL's compiler breaks once tensorflow is loaded).
"""
from __future__ import annotations

import pytest

RUNTIMES = ["litert", "tf"]


@pytest.fixture(params=RUNTIMES)
def runtime(request) -> str:
    from support.oplib_helpers import load_runtime

    load_runtime(request.param)  # tf missing -> a clear failure, not a skip
    return request.param
