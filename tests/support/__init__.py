"""Helpers shared by the test modules; tests/README.md says which module holds what.

The test modules import them as `from support.oplib_helpers import build_oplib`: pyproject's
`pythonpath` puts tests/ (and the checkout's root, for difflite, benchmarks/ and scripts/) on
the import path. A child Python that imports them gets the same paths from `child_env()`."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
SUPPORT = TESTS / "support"


def child_env(base: dict | None = None, **extra: str) -> dict:
    """`base` (default os.environ) with tests/ and the checkout's root first on PYTHONPATH, so that
    a child Python imports `support.*` and this checkout's difflite; `extra` set on top."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env
