"""The one way difflite reads JSON it did not just make itself: an output folder's manifest,
scheduler config and tokenizer files, a model folder's configs, a weights recipe, a device profile,
a safetensors header, caches and reports.

A hostile file must end in one BadInput line naming it, never a traceback: the file's size is
checked before it is read, its bytes are decoded as strict UTF-8, and its nesting depth is measured
by a linear scan before `json.loads` recurses into it (CPython's decoder raises RecursionError
near 1000 levels, sooner from a deep call stack: the bound is checked, not the error awaited). The bounds are far above what real files need: a tokenizer.json is 2 to 4 MB and
about 6 levels deep, a manifest with a weights recipe a few MB and about 8."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from difflite.core.errors import BadInput

MAX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 128

# A JSON string, escapes included (the unrolled form: linear, no backtracking)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_OPENERS = "[{"


def read_json(path, *, what: str = "JSON file", max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH):
    """The JSON value in the file at `path`; BadInput naming the file where it cannot be read, is
    larger than `max_bytes`, is not UTF-8, is nested deeper than `max_depth` or is not JSON.
    `what` names the file's role in the messages ("manifest", "scheduler config", ...)."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            _check_size(os.fstat(file.fileno()).st_size, path, what, max_bytes)
            data = file.read(max_bytes + 1)  # a file that grows while read is caught below
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file (the {what})") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror or exc})") from exc
    return loads_json(data, source=path, what=what, max_bytes=max_bytes, max_depth=max_depth)


def loads_json(text: str | bytes, *, source, what: str = "JSON text", max_bytes: int = MAX_BYTES,
               max_depth: int = MAX_DEPTH):
    """The JSON value of `text` (str, or bytes decoded as strict UTF-8) held in memory, under the
    same bounds as read_json; `source` names where it came from in the messages."""
    _check_size(len(text), source, what, max_bytes)
    if not isinstance(text, str):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(f"{source}: not valid JSON (not UTF-8: byte 0x{exc.object[exc.start]:02x} at "
                           f"offset {exc.start})") from None
    if nesting_depth(text, stop_after=max_depth) > max_depth:
        raise BadInput(f"{source}: not valid JSON (nested more than {max_depth} levels deep)")
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and int() refusing a number of too many digits
        raise BadInput(f"{source}: not valid JSON ({_first_line(exc)})") from None
    except RecursionError:  # within the bound: only from a caller already deep in its stack
        raise BadInput(f"{source}: not valid JSON (nested too deeply to parse)") from None


def nesting_depth(text: str, stop_after: int | None = None) -> int:
    """How deep the arrays and objects of the JSON `text` nest (brackets inside strings do not
    count); the scan stops once the depth exceeds `stop_after`."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in _OPENERS:
            depth += 1
            deepest = max(deepest, depth)
            if stop_after is not None and deepest > stop_after:
                break
        else:
            depth -= 1
    return deepest


def _check_size(size: int, source, what: str, max_bytes: int) -> None:
    if size > max_bytes:
        raise BadInput(f"{source}: {size} bytes, larger than difflite reads for a {what} ({max_bytes} bytes)")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


__all__ = ["MAX_BYTES", "MAX_DEPTH", "loads_json", "nesting_depth", "read_json"]
