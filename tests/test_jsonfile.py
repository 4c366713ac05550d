"""The one JSON loader (difflite/core/jsonfile.py): its size, encoding and depth bounds, each a
BadInput naming the file; and that every JSON read of difflite/ goes through it. The commands
against hostile JSON files are cases of test_bad_inputs.py."""

from __future__ import annotations

import ast
import json

import pytest

from difflite.core import jsonfile
from difflite.core.errors import BadInput
from difflite.core.jsonfile import MAX_BYTES, MAX_DEPTH, loads_json, nesting_depth, read_json
from support import ROOT

DEEP = 200_000  # levels: far past CPython's recursion limit


def refused(call, *needles: str) -> str:
    with pytest.raises(BadInput) as error:
        call()
    message = str(error.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def test_reads_what_json_reads(tmp_path):
    value = {"vocab": {"a</w>": 0, "\u00e9": 1}, "merges": [["a", "b"]], "nested": [[{"x": [1.5, None, True]}]]}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    assert read_json(path) == value
    assert loads_json(path.read_bytes(), source="memory") == value


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting_is_refused_before_parsing(tmp_path, opener):
    path = tmp_path / "manifest.json"
    path.write_text(opener * DEEP)
    refused(lambda: read_json(path, what="manifest"), str(path), f"nested more than {MAX_DEPTH} levels")


def test_the_depth_bound_is_exact():
    assert loads_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, source="s") is not None
    refused(lambda: loads_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), source="s"), "nested more than")


def test_brackets_inside_strings_do_not_nest():
    text = json.dumps({"pattern": "[" * DEEP, "escaped": '\\"[{' * 10})
    assert nesting_depth(text) == 1
    assert loads_json(text, source="s")["pattern"] == "[" * DEEP


def test_a_parser_already_deep_in_its_stack_is_still_one_line():
    """The last resort: a depth within the given bound that the parser cannot reach."""
    refused(lambda: loads_json("[" * DEEP + "]" * DEEP, source="s", max_depth=2 * DEEP), "s: not valid JSON",
            "too deeply")


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "scheduler_config.json"
    with open(path, "wb") as sparse:  # no disk blocks: a hole of MAX_BYTES + 1
        sparse.truncate(MAX_BYTES + 1)
    reads = []
    monkeypatch.setattr(jsonfile, "loads_json", lambda *a, **k: reads.append(a))
    refused(lambda: read_json(path, what="scheduler config"), str(path), f"{MAX_BYTES + 1} bytes", "scheduler config")
    assert reads == []


def test_an_oversized_text_is_refused():
    refused(lambda: loads_json(b"[" + b" " * 100 + b"]", source="header", max_bytes=64), "header", "102 bytes")


def test_bytes_that_are_not_utf8_are_refused(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_bytes(b'{"caf\xe9": 1}')
    refused(lambda: read_json(path), str(path), "not UTF-8", "0xe9", "offset 5")


@pytest.mark.parametrize("text, reason", [
    ('{"a": 1', "Expecting"),
    ("1" * 5000, "digits"),  # int() refuses it with a ValueError of its own
    ("", "Expecting value"),
])
def test_what_is_not_json_is_refused(text, reason):
    refused(lambda: loads_json(text, source="the file"), "the file: not valid JSON", reason)


def test_a_missing_or_unreadable_path_is_one_line(tmp_path):
    refused(lambda: read_json(tmp_path / "nothing.json", what="device profile"), "nothing.json", "no such file",
            "device profile")
    refused(lambda: read_json(tmp_path, what="manifest"), str(tmp_path), "cannot read the manifest")


# ---------------------------------------------------------------------------------------------
# Every JSON read of the package goes through the loader

# JSON from difflite's own child processes, and a deep copy of a preset's literal config
TRUSTED_JSON = {"difflite/core/procmem.py", "difflite/runtime/litert_gpu.py", "difflite/compiler/presets.py",
                "difflite/core/jsonfile.py"}


def json_reads(path) -> list[int]:
    """Lines of `path` that call json.load or json.loads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("load", "loads") and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "json"]


def test_every_json_read_goes_through_the_loader():
    stray = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / "difflite").rglob("*.py"))
             if str(path.relative_to(ROOT)) not in TRUSTED_JSON and (lines := json_reads(path))}
    assert stray == {}, f"read JSON through difflite.core.jsonfile (read_json / loads_json): {stray}"

