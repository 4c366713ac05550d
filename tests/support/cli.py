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


def convert_side_by_side(conversions: dict, first: tuple = ()) -> None:
    """`difflite convert ARGS...` for every {key: args} at once, each its own process; an
    AssertionError naming the key (with its stderr's end) where one does not exit 0.

    first: keys converted (side by side) before the others start. Conversions that share an export
    (the same model, size, batch and weights; options applied after the export differ) started at
    once would each export it; the keys in `first` export it once into the session's export cache
    (tests/conftest.py), and the others then take it from there."""
    unknown = set(first) - set(conversions)
    assert not unknown, f"first: no such conversion {sorted(unknown, key=str)}"
    waves = [{key: conversions[key] for key in first},
             {key: args for key, args in conversions.items() if key not in first}]
    for wave in waves:
        runs = {key: subprocess.Popen([*difflite_command(), "convert", *map(str, args)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT)
                for key, args in wave.items()}
        for key, run in runs.items():
            _, stderr = run.communicate()
            assert run.returncode == 0, f"convert ({key}) failed:\n{stderr[-3000:]}"
