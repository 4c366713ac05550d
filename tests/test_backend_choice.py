"""`--backend auto|cpu|opencl|litert-gpu` of generate, bench and verify (difflite/runtime/backend.py),
the typed reader of the output folder they share (difflite/folder/output_folder.py), and the
in-process LiteRT component behind generate's and bench's litert-gpu."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

from difflite.core.errors import BadInput
from difflite.folder.output_folder import ComponentEntry, OutputFolder
from difflite.runtime import backend, litert_gpu
from difflite.runtime.component import Component, open_component, uses_oplib
from support.cli import run_difflite

SIZE = ("--height", "64", "--width", "64")


def difflite(*args, check=True):
    return run_difflite(*args, check=check, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """preset:tiny at 64x64, batch 1: --no-fuse (stock LiteRT runs it) and the fused default."""
    base = tmp_path_factory.mktemp("backends")
    out = {"nofuse": base / "nofuse", "fused": base / "fused"}
    difflite("convert", "preset:tiny", "-o", out["nofuse"], *SIZE, "--batch", "1", "--no-fuse")
    difflite("convert", "preset:tiny", "-o", out["fused"], *SIZE, "--batch", "1",
             "--components", "text_encoder,vae_decoder")
    return out


def pyopencl_devices() -> list[tuple[str, bool]]:
    return [(d.name.strip(), bool(d.type & cl.device_type.GPU)) for p in cl.get_platforms() for d in p.get_devices()]


def test_opencl_devices_match_pyopencl():
    """The ctypes enumeration lists what the ICD loader lists (pyopencl as the independent reader),
    in the same order, with the same GPU flags: PoCL's device is a CPU device."""
    ours = [(d.name, d.is_gpu) for d in backend.opencl_devices()]
    assert ours == pyopencl_devices()
    assert ours, "the tests' machine has PoCL"


def test_auto_takes_opencl_only_for_a_gpu_device():
    choice = backend.choose("auto")
    gpus = [name for name, is_gpu in pyopencl_devices() if is_gpu]
    assert choice.requested == "auto"
    if gpus:
        assert choice.backend == "opencl" and gpus[0] in choice.reason
    else:
        assert choice.backend == "cpu" and "no OpenCL GPU device" in choice.reason
        assert all(name in choice.reason for name, _ in pyopencl_devices())
    assert choice.line().startswith(f"[difflite] backend {choice.backend} (auto: ")
    assert backend.choose("opencl").as_dict() == {"backend": "opencl", "requested": "opencl", "reason": "as asked"}
    with pytest.raises(BadInput, match="choose from auto, cpu, opencl, litert-gpu"):
        backend.choose("vulkan")


def test_no_opencl_loader_means_cpu(monkeypatch):
    monkeypatch.setattr(backend, "_opencl_library", lambda: None)
    assert backend.opencl_devices() == []
    assert backend.choose("auto").backend == "cpu"
    assert backend.choose("auto").reason == "auto: no OpenCL device"


def test_typed_reader(folders):
    folder = OutputFolder.read(folders["nofuse"])
    manifest = json.loads((folders["nofuse"] / "manifest.json").read_text())
    assert folder.precision == manifest["options"]["precision"] and folder.weights == "float"
    assert set(folder.components) == set(manifest["components"])
    for name, entry in folder.components.items():
        written = manifest["components"][name]
        assert entry.path == folders["nofuse"] / written["file"] and entry.sha256 == written["sha256"]
        assert [(s.name, list(s.shape), s.dtype, s.layout) for s in entry.inputs] == \
            [(s["name"], s["shape"], s["dtype"], s["layout"]) for s in written["inputs"]]
        assert entry.custom_ops == () and entry.quantized_weights is written["quantized_weights"] is False
    latent = folder.latent
    assert (latent.image_height, latent.image_width) == (64, 64)
    assert (latent.height, latent.channels) == (manifest["latent"]["height"], manifest["latent"]["channels"])
    assert folder.components["unet"].batch == 1 and folder.components["unet"].timestep_cond_dim is None
    fused = OutputFolder.read(folders["fused"])
    assert set(fused.components) == {"text_encoder", "vae_decoder"}
    assert "difflite.GroupNorm" in fused.components["vae_decoder"].custom_ops
    with pytest.raises(BadInput, match="unet.tflite: missing \\(convert again\\)"):
        fused.component("unet")


def test_typed_reader_refuses_a_changed_file(folders, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(folders["nofuse"], copy)
    with open(copy / "unet.tflite", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BadInput, match="unet.tflite: sha256 differs"):
        OutputFolder.read(copy)
    assert set(OutputFolder.read(copy, names=["vae_decoder"]).components) >= {"unet"}  # listed, not checked


def test_uses_oplib_from_the_manifest(folders):
    fused = OutputFolder.read(folders["fused"]).components["vae_decoder"]
    plain = OutputFolder.read(folders["nofuse"]).components["vae_decoder"]
    assert uses_oplib(fused, "cpu") and not uses_oplib(plain, "cpu")
    assert uses_oplib(plain, "opencl") and not uses_oplib(fused, "litert-gpu")
    quantized = ComponentEntry("unet", plain.path, quantized_weights=True)
    assert uses_oplib(quantized, "cpu")
    lone = ComponentEntry.for_file(fused.path)
    assert lone.custom_ops == fused.custom_ops and not lone.quantized_weights


def test_litert_component_matches_the_interpreter(folders):
    """LiteRT's CompiledModel in process (its CPU accelerator here; the GPU one where there is a GPU)
    gives the interpreter's outputs, NCHW in and out."""
    entry = OutputFolder.read(folders["nofuse"]).components["vae_decoder"]
    compiled = litert_gpu.LiteRtComponent(entry, "cpu")
    interpreted = Component(entry)
    (spec,), (out,) = entry.inputs, entry.outputs
    n, h, w, c = spec.shape  # the file's NHWC
    feeds = {spec.name: np.random.default_rng(0).standard_normal((n, c, h, w)).astype(np.float32)}
    got, want = compiled(**feeds), interpreted(**feeds)
    assert set(got) == set(want) == {out.name} and got[out.name].shape == (1, 3, 64, 64)
    np.testing.assert_allclose(got[out.name], want[out.name], rtol=1e-4, atol=1e-4 * np.abs(want[out.name]).max())
    compiled.close()
    with pytest.raises(RuntimeError, match="closed"):
        compiled(**feeds)


def test_litert_refuses_custom_ops_and_falls_back(folders):
    entry = OutputFolder.read(folders["fused"]).components["vae_decoder"]
    with pytest.raises(BadInput, match="--no-fuse"):
        open_component(entry, "litert-gpu")
    told = []
    component = open_component(entry, "litert-gpu", fallback="cpu", on_fallback=told.append)
    assert isinstance(component, Component) and component.backend == "cpu"
    assert len(told) == 1 and "--no-fuse" in told[0] and component.fallback_reason == told[0]


def test_generate_says_and_records_the_choice(folders, tmp_path):
    choice = backend.choose("auto")
    run = difflite("generate", folders["nofuse"], "a cat", "-o", tmp_path / "cat.png", "--steps", 2)
    assert run.stderr.splitlines().count(choice.line()) == 1
    run = difflite("generate", folders["nofuse"], "a cat", "-o", tmp_path / "cat.png", "--steps", 2, "--json")
    assert json.loads(run.stdout)["backend_choice"] == choice.as_dict() and choice.line() not in run.stderr
    assert (tmp_path / "cat.png").is_file()


@pytest.mark.skipif(any(is_gpu for _, is_gpu in pyopencl_devices()), reason="a GPU machine runs LiteRT's GPU")
def test_litert_gpu_without_a_gpu_is_bad_input(folders, tmp_path):
    """No GPU here: generate and bench say so in one line, exit 2, and write nothing."""
    run = difflite("generate", folders["nofuse"], "a cat", "-o", tmp_path / "cat.png", "--steps", 1,
                   "--backend", "litert-gpu", check=False)
    assert run.returncode == 2 and "no LiteRT GPU accelerator on this machine" in run.stderr
    assert not (tmp_path / "cat.png").exists()
    run = difflite("bench", folders["nofuse"], "--backend", "litert-gpu", "--runs", 1, "--warmup", 0,
                   "--components", "vae_decoder", check=False)
    assert run.returncode == 2 and "no LiteRT GPU accelerator on this machine" in run.stderr


def test_bench_records_the_choice(folders):
    run = difflite("bench", folders["fused"], "--runs", 1, "--warmup", 0, "--components", "vae_decoder", "--json")
    result = json.loads(run.stdout)
    assert result["backend_choice"] == backend.choose("auto").as_dict()
    assert result["backend"] == result["backend_choice"]["backend"]
