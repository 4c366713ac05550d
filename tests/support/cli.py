"""Running the `difflite` command line from the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from . import ROOT


def difflite_command() -> list[str]:
    """The installed `difflite` script, or `python -m difflite` with this interpreter."""
    exe = shutil.which("difflite")
    return [exe] if exe else [sys.executable, "-m", "difflite"]


def run_difflite(*args, check: bool = False, env: dict | None = None,
                 command: list[str] | None = None) -> subprocess.CompletedProcess:
    """`difflite ARGS...` from the checkout's root, output captured as text; `env` on top of this
    process's environment. check: raise AssertionError (with the output) unless it exits 0."""
    result = subprocess.run([*(command or difflite_command()), *map(str, args)], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, **(env or {})}, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"difflite {' '.join(map(str, args))} exited {result.returncode}\n"
                             f"{result.stdout[-5000:]}\n{result.stderr[-5000:]}")
    return result
