"""Weights inside the flatbuffer ("inline") and after it ("appended", Buffer.offset/size, the
layout of models over 2 GiB): both run in LiteRT and tf.lite and agree with onnxruntime, and the
writer never keeps the ONNX weight file mapped."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from ai_edge_litert import schema_py_generated as schema

from difflite.compiler.tflite.builder import APPENDED_ALIGNMENT, ModelBuilder
from difflite.compiler.tflite.writer import load_onnx, write_tflite
from difflite.core.errors import BadInput
from difflite.folder.reader import read_tflite

from support.lowering_helpers import (
    Case,
    compare,
    make_model,
    node,
    run_onnxruntime,
    run_tflite,
    weight,
)


def conv_matmul_case() -> Case:
    """A conv then a matmul: 4-D weights (transposed to OHWI) and 2-D weights, plus biases."""
    nodes = [
        node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Reshape", ["c", "shape"], ["r"]),
        node("MatMul", ["r", "M"], ["y"]),
    ]
    inits = {"W": weight(1, 16, 8, 3, 3), "B": weight(2, 16), "M": weight(3, 36, 40),
             "shape": np.array([1, 16, 36], np.int64)}
    return Case("conv-matmul-layout", nodes, {"x": (1, 8, 6, 6)}, ["y"], inits)


def external_onnx(tmp_path, case: Case) -> tuple[onnx.ModelProto, ir.Model]:
    """The case saved with every initializer in an external-data file, then loaded lazily."""
    model = make_model(case)
    path = tmp_path / "model.onnx"
    on_disk = onnx.ModelProto()
    on_disk.CopyFrom(model)  # save_model moves the tensors of the proto it saves out
    onnx.save_model(on_disk, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return model, load_onnx(path)


def buffer_locations(path) -> list[tuple[int, int, int]]:
    """(inline data length, offset, size) of every buffer of a .tflite file."""
    data = path.read_bytes()
    model = schema.Model.GetRootAs(data, 0)
    return [(model.Buffers(i).DataLength(), model.Buffers(i).Offset(), model.Buffers(i).Size())
            for i in range(model.BuffersLength())]


@pytest.mark.parametrize("runtime", ["litert", "tf"])
@pytest.mark.parametrize("layout", ["inline", "appended"])
def test_both_weight_layouts_run_and_agree_with_onnxruntime(tmp_path, layout, runtime):
    case = conv_matmul_case()
    model, graph = external_onnx(tmp_path, case)
    path = tmp_path / f"{layout}.tflite"
    result = write_tflite(graph, path=path, weights=layout)
    assert result.weight_layout == layout and result.data is None
    result.data = path.read_bytes()
    feeds = case.feeds(0)
    compare(run_tflite(result, feeds, runtime), run_onnxruntime(model, feeds), case.outputs, 1e-5)


def test_appended_weights_live_after_the_flatbuffer_aligned(tmp_path):
    _, graph = external_onnx(tmp_path, conv_matmul_case())
    path = tmp_path / "appended.tflite"
    write_tflite(graph, path=path, weights="appended")
    located = [(offset, size) for inline, offset, size in buffer_locations(path) if size]
    assert located and all(inline == 0 for inline, _, _ in buffer_locations(path))
    file_bytes = path.stat().st_size
    assert all(offset % APPENDED_ALIGNMENT == 0 and offset + size <= file_bytes for offset, size in located)
    # the weight segment is exactly the buffers' bytes (plus alignment gaps), after the flatbuffer
    assert file_bytes - min(offset for offset, _ in located) < sum(s for _, s in located) + \
        APPENDED_ALIGNMENT * len(located)
    summary = read_tflite(path)
    assert summary.weight_bytes == sum(size for _, size in located)


def test_auto_layout_is_inline_below_the_flatbuffer_limit(tmp_path):
    _, graph = external_onnx(tmp_path, conv_matmul_case())
    path = tmp_path / "auto.tflite"
    assert write_tflite(graph, path=path).weight_layout == "inline"
    located = buffer_locations(path)
    assert any(inline for inline, _, _ in located) and not any(offset for _, offset, _ in located)


def test_auto_layout_appends_when_the_weights_would_not_fit(monkeypatch):
    builder = ModelBuilder()
    builder.constant("w", np.ones(1000, np.float32))
    assert builder.weight_layout("auto") == "inline"
    monkeypatch.setattr("difflite.compiler.tflite.builder.FLATBUFFER_LIMIT", 1000)
    assert builder.weight_layout("auto") == "appended"
    with pytest.raises(ValueError, match="weight layout"):
        builder.weight_layout("sideways")
    # inline asked for weights that cannot fit: refused in one line (convert exits 2), not written
    with pytest.raises(BadInput, match=r"--weights-layout inline: .* do not fit inside a flatbuffer"):
        builder.weight_layout("inline")
    assert builder.weight_layout("appended") == "appended"


def test_convert_writes_the_weights_layout_asked_for(tmp_path):
    """`convert --weights-layout appended`: every component's file keeps its weights after the
    flatbuffer, the manifest says so, and verify passes against PyTorch; a layout convert does not
    know is refused by the command line."""
    from click.testing import CliRunner

    from difflite.cli import main

    out = tmp_path / "appended"
    done = CliRunner().invoke(main, ["convert", "preset:tiny", "-o", str(out), "--weights-layout", "appended",
                                     "--components", "text_encoder,vae_decoder", "--json"])
    assert done.exit_code == 0, done.output
    manifest = json.loads((out / "manifest.json").read_text())
    for name in ("text_encoder", "vae_decoder"):
        entry = manifest["components"][name]
        assert entry["weights"] == "appended"
        located = buffer_locations(out / entry["file"])
        assert all(inline == 0 for inline, _, _ in located) and any(size for _, _, size in located)
    verified = CliRunner().invoke(main, ["verify", str(out), "--backend", "cpu", "--json"])
    assert verified.exit_code == 0, verified.output
    refused = CliRunner().invoke(main, ["convert", "preset:tiny", "-o", str(tmp_path / "x"),
                                        "--weights-layout", "sideways"])
    assert refused.exit_code == 2 and "--weights-layout" in refused.output and not (tmp_path / "x").exists()


def test_writer_releases_the_onnx_weight_file(tmp_path):
    """Each external weight is copied out and unmapped when read: no mapping of the (multi-GB)
    weight file survives the write."""
    _, graph = external_onnx(tmp_path, conv_matmul_case())
    external = [v.const_value for v in graph.graph.initializers.values()
                if isinstance(v.const_value, ir.ExternalTensor)]
    assert len(external) == 4
    write_tflite(graph, path=tmp_path / "m.tflite")
    assert all(tensor.raw is None for tensor in external)


def test_same_model_writes_identical_bytes_in_both_layouts(tmp_path):
    for layout in ("inline", "appended"):
        files = []
        for attempt in range(2):
            folder = tmp_path / f"{layout}{attempt}"
            folder.mkdir()
            _, graph = external_onnx(folder, conv_matmul_case())
            write_tflite(graph, path=folder / "m.tflite", weights=layout)
            files.append((folder / "m.tflite").read_bytes())
        assert files[0] == files[1]


def test_truncated_appended_model_is_a_clear_error(tmp_path):
    from click.testing import CliRunner

    from difflite.cli import main

    _, graph = external_onnx(tmp_path, conv_matmul_case())
    path = tmp_path / "appended.tflite"
    write_tflite(graph, path=path, weights="appended")
    whole = CliRunner().invoke(main, ["inspect", str(path), "--json"])
    assert whole.exit_code == 0 and '"weight_layout": "appended"' in whole.output
    path.write_bytes(path.read_bytes()[:-100])
    cut = CliRunner().invoke(main, ["inspect", str(path)])
    assert cut.exit_code == 2 and "truncated .tflite" in cut.output


def test_convert_refuses_inline_weights_past_the_flatbuffer_limit(tmp_path, monkeypatch):
    """`--weights-layout inline` for weights a flatbuffer cannot hold (the limit lowered to 1 MiB
    here, as SDXL's fp16 UNet passes 2 GiB): exit 2 with one line naming the component, and no
    output folder."""
    from click.testing import CliRunner

    from difflite.cli import main

    monkeypatch.setattr("difflite.compiler.tflite.builder.FLATBUFFER_LIMIT", 1 << 20)
    out = tmp_path / "inline"
    done = CliRunner().invoke(main, ["convert", "preset:tiny", "-o", str(out), "--weights-layout", "inline",
                                     "--components", "text_encoder"])
    assert done.exit_code == 2, done.output
    assert "--weights-layout inline" in done.output and "text_encoder" in done.output
    assert "use appended or auto" in done.output and not out.exists()
