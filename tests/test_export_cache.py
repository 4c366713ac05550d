"""difflite/compiler/export_cache.py (`convert --export-cache`): an export is reused only when it is the
same export, byte for byte, and a changed entry is exported again."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from difflite.compiler import export, export_cache
from difflite.compiler.models import load_pipeline

from support import ROOT

SIZE = (32, 32)


@pytest.fixture(scope="module")
def pipe():
    return load_pipeline("preset:tiny")


def spec_of(pipe, name="text_encoder", size=SIZE):
    return export.component_spec(pipe, name, *size)


def key_in_a_new_process(name: str) -> str:
    code = ("from difflite.compiler import export, export_cache; from difflite.compiler.models import load_pipeline; "
            f"print(export_cache.export_key(export.component_spec(load_pipeline('preset:tiny'), {name!r}, "
            f"{SIZE[0]}, {SIZE[1]}), 18))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return run.stdout.split()[-1]


def test_the_key_is_the_same_in_another_process(pipe):
    """Nothing process-dependent (a set's order, an address) enters the key: diffusers' configs
    carry a list of defaulted keys in set order."""
    assert key_in_a_new_process("unet") == export_cache.export_key(spec_of(pipe, "unet"), 18)


def test_the_key_follows_weights_size_and_opset(pipe):
    spec = spec_of(pipe)
    key = export_cache.export_key(spec, 18)
    assert export_cache.export_key(spec_of(pipe, "unet", size=(32, 48)), 18) != export_cache.export_key(
        spec_of(pipe, "unet"), 18)
    assert export_cache.export_key(spec, 19) != key
    weight = spec.module.text_encoder.final_layer_norm.weight
    with torch.no_grad():
        weight[0] = torch.nextafter(weight[0], torch.tensor(9.0))
    try:
        assert export_cache.export_key(spec, 18) != key
    finally:
        with torch.no_grad():
            weight[0] = torch.nextafter(weight[0], torch.tensor(-9.0))
    assert export_cache.export_key(spec, 18) == key


def test_a_reused_export_is_the_export_and_a_changed_entry_is_exported_again(pipe, tmp_path):
    """The first call exports (export.export_onnx, whose output is byte-deterministic:
    test_export.py), the second copies those bytes."""
    spec = spec_of(pipe)
    cache = tmp_path / "cache"
    first, second = (tmp_path / run / "text_encoder.onnx" for run in ("first", "second"))
    assert export_cache.export_cached(spec, first, cache) is False
    assert export_cache.export_cached(spec, second, cache) is True
    exported = {suffix: Path(str(first) + suffix).read_bytes() for suffix in ("", ".data")}
    assert all(Path(str(second) + suffix).read_bytes() == exported[suffix] for suffix in exported)

    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    data = entry / "text_encoder.onnx.data"
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0x40
    data.write_bytes(bytes(damaged))
    third = tmp_path / "third" / "text_encoder.onnx"
    assert export_cache.export_cached(spec, third, cache) is False  # found changed: exported again
    assert Path(str(third) + ".data").read_bytes() == exported[".data"]
    assert data.read_bytes() == exported[".data"]
    assert json.loads((entry / export_cache.ENTRY).read_text())["files"].keys() == {
        "text_encoder.onnx", "text_encoder.onnx.data"}
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []  # no staging left


def test_a_cache_that_cannot_be_written_only_warns(pipe, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    warnings = []
    path = tmp_path / "out" / "text_encoder.onnx"
    assert export_cache.export_cached(spec_of(pipe), path, blocker / "cache",
                                      warn=warnings.append) is False
    assert path.is_file() and Path(str(path) + ".data").is_file()
    assert len(warnings) == 1 and "not stored" in warnings[0] and str(blocker) in warnings[0]
