"""difflite.compiler.export: tiny components -> ONNX, checked against PyTorch with onnxruntime."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from difflite.compiler.export import (
    COMPONENTS,
    ComponentSpec,
    ExportError,
    check_size,
    component_spec,
    export_onnx,
    latent_size,
)
from difflite.compiler.models import load_pipeline
from difflite.core.errors import BadInput

HEIGHT, WIDTH = 64, 64  # pixels; tiny latents are 32x32


@pytest.fixture(scope="module")
def tiny():
    return load_pipeline("preset:tiny")


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory) -> dict[str, tuple[ComponentSpec, Path]]:
    folder = tmp_path_factory.mktemp("onnx")
    out = {}
    for name in COMPONENTS:
        spec = component_spec(tiny, name, HEIGHT, WIDTH)
        out[name] = (spec, export_onnx(spec, folder / f"{name}.onnx"))
    return out


def _run_and_compare(spec: ComponentSpec, path: Path) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(spec.input_names)
    assert [o.name for o in session.get_outputs()] == list(spec.output_names)
    feeds = {name: x.numpy() for name, x in zip(spec.input_names, spec.example_inputs)}
    got = session.run(None, feeds)
    with torch.no_grad():
        want = spec.module(*spec.example_inputs)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = w.numpy()
        assert g.shape == w.shape
        scale = float(np.abs(w).max())
        assert scale > 0
        assert float(np.abs(g - w).max()) <= 1e-4 * scale
    return got


@pytest.mark.parametrize("name", COMPONENTS)
def test_component_matches_torch(exported, name):
    spec, path = exported[name]
    _run_and_compare(spec, path)


@pytest.mark.parametrize("name", COMPONENTS)
def test_onnx_file_layout(exported, name):
    _, path = exported[name]
    assert path.name == f"{name}.onnx"
    assert (path.parent / f"{name}.onnx.data").is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no staging left
    model = onnx.load(str(path), load_external_data=False)
    assert {o.domain: o.version for o in model.opset_import}[""] == 18
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        assert dims and all(d.HasField("dim_value") for d in dims), value.name  # static shapes
    locations = {
        entry.value
        for tensor in model.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    assert locations == {f"{name}.onnx.data"}


def test_contract_shapes_and_dtypes(tiny, exported):
    hidden = tiny.text_encoder.config.hidden_size
    h, w = latent_size(tiny, HEIGHT, WIDTH)
    expected = {
        "text_encoder": ({"input_ids": ([1, 77], torch.int64)}, [[1, 77, hidden]]),
        "unet": ({"sample": ([1, 4, h, w], torch.float32), "timestep": ([1], torch.float32),
                  "encoder_hidden_states": ([1, 77, hidden], torch.float32)}, [[1, 4, h, w]]),
        "vae_decoder": ({"latent": ([1, 4, h, w], torch.float32)}, [[1, 3, HEIGHT, WIDTH]]),
        "vae_encoder": ({"image": ([1, 3, HEIGHT, WIDTH], torch.float32)}, [[1, 4, h, w], [1, 4, h, w]]),
    }
    for name, (inputs, outputs) in expected.items():
        spec, path = exported[name]
        for input_name, x in zip(spec.input_names, spec.example_inputs):
            assert (list(x.shape), x.dtype) == inputs[input_name]
            assert torch.count_nonzero(x) > 0
        model = onnx.load(str(path), load_external_data=False)
        shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output]
        assert shapes == outputs


def test_vae_encoder_outputs_are_scaled(tiny, exported):
    spec, _ = exported["vae_encoder"]
    mean, std = spec.module(*spec.example_inputs)
    dist = tiny.vae.encode(spec.example_inputs[0]).latent_dist
    factor = tiny.vae.config.scaling_factor
    torch.testing.assert_close(mean, dist.mean * factor)
    torch.testing.assert_close(std, dist.std * factor)
    assert torch.all(spec.example_inputs[0].abs() <= 1)


def test_vae_decoder_unscales_latent(tiny, exported):
    spec, _ = exported["vae_decoder"]
    latent = spec.example_inputs[0]
    want = tiny.vae.decode(latent / tiny.vae.config.scaling_factor).sample
    torch.testing.assert_close(spec.module(latent), want)


def test_unet_batch2_non_square(tiny, tmp_path):
    spec = component_spec(tiny, "unet", 64, 96, batch=2, seed=5)
    assert [list(x.shape) for x in spec.example_inputs] == [[2, 4, 8, 12], [2], [2, 77, 32]]
    got = _run_and_compare(spec, export_onnx(spec, tmp_path / "unet_b2.onnx"))
    assert got[0].shape == (2, 4, 8, 12)


def test_export_is_byte_deterministic(tiny, exported, tmp_path, capsys):
    _, first = exported["unet"]
    again = export_onnx(component_spec(tiny, "unet", HEIGHT, WIDTH), tmp_path / "unet.onnx")
    assert again.read_bytes() == first.read_bytes()
    assert (tmp_path / "unet.onnx.data").read_bytes() == (first.parent / "unet.onnx.data").read_bytes()
    assert capsys.readouterr().out == ""  # the exporter's progress lines are swallowed


def test_example_inputs_are_seeded(tiny):
    a = component_spec(tiny, "unet", HEIGHT, WIDTH, seed=1).example_inputs
    b = component_spec(tiny, "unet", HEIGHT, WIDTH, seed=1).example_inputs
    c = component_spec(tiny, "unet", HEIGHT, WIDTH, seed=2).example_inputs
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_check_size(tiny):
    check_size(tiny, 64, 96)
    check_size(tiny, 16, 32)
    for height, width in ((56, 64), (64, 72), (0, 64), (-16, 64), (64.0, 64)):
        with pytest.raises(BadInput, match="multiple of 16"):
            check_size(tiny, height, width)
    with pytest.raises(BadInput, match="multiple of 16"):
        component_spec(tiny, "vae_decoder", 64, 72)


def test_latent_size(tiny):
    assert latent_size(tiny, 64, 96) == (8, 12)


def test_bad_batch_and_component(tiny):
    with pytest.raises(BadInput, match="batch"):
        component_spec(tiny, "unet", HEIGHT, WIDTH, batch=3)
    with pytest.raises(BadInput, match="safety_checker"):
        component_spec(tiny, "safety_checker", HEIGHT, WIDTH)


class _Broken(torch.nn.Module):
    def forward(self, x):
        raise ValueError("boom")


def test_export_failure_names_component_and_leaves_nothing(tmp_path):
    spec = ComponentSpec("unet", _Broken(), ("x",), ("y",), (torch.ones(2),))
    with pytest.raises(ExportError, match="unet") as failed:
        export_onnx(spec, tmp_path / "unet.onnx")
    assert list(tmp_path.iterdir()) == []
    assert isinstance(failed.value, BadInput)  # the CLI's exit 2, one line
    assert "\n" not in str(failed.value) and "ValueError: boom" in str(failed.value)
