"""A child process for tests/test_hostile_files.py: loads each given .tflite with the op library's
delegate (one backend), allocates, feeds its inputs and invokes, and says what happened.

usage: hostile_child.py LIB BACKEND FOLDER CASE_ID...

For each case, in order: the line `@@case ID` on stderr (so the delegate's own lines that follow
belong to it), then one JSON line on stdout, {"id", "stage", "error"}: stage "load" (the
interpreter was not made: TFLite or the delegate refused the model), "allocate", "invoke" (the
step that failed, with its message), or "ran". A case that kills the process leaves its `@@case`
line as the last one: the parent blames it and starts a new child for the cases after it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter, load_delegate

MAX_FED_ELEMENTS = 1 << 22


def run_case(lib: str, backend: str, path: Path) -> dict:
    try:
        delegate = load_delegate(lib, {"backend": backend})
        interpreter = Interpreter(model_path=str(path), experimental_delegates=[delegate])
    except Exception as exc:  # LiteRT raises ValueError or RuntimeError
        return {"stage": "load", "error": str(exc)}
    try:
        interpreter.allocate_tensors()
    except Exception as exc:
        return {"stage": "allocate", "error": str(exc)}
    rng = np.random.default_rng(0)
    try:
        for detail in interpreter.get_input_details():
            shape = [int(d) for d in detail["shape"]]
            if np.prod(shape, dtype=np.float64) > MAX_FED_ELEMENTS:
                continue  # allocated (the interpreter accepted it) but too big to fill here
            value = rng.standard_normal(shape).astype(detail["dtype"]) if shape else np.zeros((), detail["dtype"])
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
    except Exception as exc:
        return {"stage": "invoke", "error": str(exc)}
    return {"stage": "ran", "error": ""}


def main() -> None:
    lib, backend, folder, *ids = sys.argv[1:]
    for case_id in ids:
        sys.stderr.write(f"@@case {case_id}\n")
        sys.stderr.flush()
        result = run_case(lib, backend, Path(folder) / f"{case_id}.tflite")
        sys.stdout.write(json.dumps({"id": case_id, **result}) + "\n")
        sys.stdout.flush()
    sys.stderr.write("@@done\n")


if __name__ == "__main__":
    main()
