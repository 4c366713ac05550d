"""End to end through the real `difflite` console script: convert the tiny preset, verify it
against PyTorch, inspect it, run it in a second runtime, and fail cleanly on bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from support import ROOT
from support.cli import difflite_command, run_difflite

SIZE = ["--height", "64", "--width", "96"]  # non-square on purpose


def difflite(*args, check=True, env=None) -> subprocess.CompletedProcess:
    return run_difflite(*args, check=check, env=env)


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("conv") / "tiny"
    difflite("convert", "preset:tiny", "-o", out, *SIZE, "--components",
             "text_encoder,unet,vae_decoder,vae_encoder", "--no-fuse")
    return out


def test_convert_writes_the_output_folder(tiny_out):
    names = sorted(p.name for p in tiny_out.iterdir())
    assert names == ["manifest.json", "report.json", "scheduler", "text_encoder.tflite", "tokenizer",
                     "unet.tflite", "vae_decoder.tflite", "vae_encoder.tflite"]
    manifest = json.loads((tiny_out / "manifest.json").read_text())
    unet = manifest["components"]["unet"]
    assert [i["name"] for i in unet["inputs"]] == ["sample", "timestep", "encoder_hidden_states"]
    latent = manifest["latent"]
    assert latent["height"] * latent["vae_scale_factor"] == 64 and latent["width"] * latent["vae_scale_factor"] == 96
    assert unet["inputs"][0]["shape"] == [1, latent["height"], latent["width"], 4]
    assert unet["inputs"][0]["layout"] == "NHWC"
    assert unet["outputs"][0]["name"] == "noise_pred"
    assert (tiny_out / "scheduler" / "scheduler_config.json").is_file()
    assert (tiny_out / "tokenizer" / "vocab.json").is_file()
    report = json.loads((tiny_out / "report.json").read_text())
    for name, r in report["components"].items():
        assert r["weights_mb"] > 0 and r["intermediate_mb"] > 0, name
        assert set(r["stages"]) == {"export", "write"}
        assert not any(k.startswith("difflite.") for k in r["op_histogram"]), "--no-fuse emits builtins only"
    assert not list(tiny_out.glob(".difflite-staging-*"))


def test_verify_passes_against_pytorch(tiny_out):
    result = difflite("verify", tiny_out, "--json", "--seeds", "0,3")
    data = json.loads(result.stdout)
    assert data["passed"]
    components = {c["component"] for c in data["checks"]}
    assert components == {"text_encoder", "unet", "vae_decoder", "vae_encoder"}
    outputs = {(c["component"], c["output"]) for c in data["checks"]}
    assert ("vae_encoder", "latent_std") in outputs
    for check in data["checks"]:
        assert check["relative_error"] <= 1e-3, check
        assert check["max_abs_reference"] > 0


def test_verify_fails_against_other_weights(tmp_path):
    """Verification can fail: files converted from seed 1 checked against seed-0 weights."""
    from difflite.compiler.models import load_pipeline

    folder = tmp_path / "seed0"
    load_pipeline("preset:tiny", seed=0).save_pretrained(folder)
    out = tmp_path / "out"
    difflite("convert", "preset:tiny", "--seed", "1", "-o", out, *SIZE, "--components", "vae_decoder")
    assert difflite("verify", out, "--seeds", "0", check=False).returncode == 0
    result = difflite("verify", out, "--model", folder, "--seeds", "0", "--json", check=False)
    assert result.returncode == 1
    assert json.loads(result.stdout)["passed"] is False


def test_conversion_is_byte_identical(tiny_out, tmp_path):
    again = tmp_path / "again"
    difflite("convert", "preset:tiny", "-o", again, *SIZE, "--components", "unet,vae_decoder", "--no-fuse")
    for name in ("unet.tflite", "vae_decoder.tflite"):
        assert (again / name).read_bytes() == (tiny_out / name).read_bytes(), name
    first = json.loads((tiny_out / "manifest.json").read_text())["components"]["unet"]["sha256"]
    second = json.loads((again / "manifest.json").read_text())["components"]["unet"]["sha256"]
    assert first == second


def test_inspect_folder_and_file(tiny_out):
    data = json.loads(difflite("inspect", tiny_out, "--json").stdout)
    assert set(data["models"]) == {"text_encoder", "unet", "vae_decoder", "vae_encoder"}
    unet = data["models"]["unet"]
    assert unet["op_histogram"]["CONV_2D"] > 0
    assert unet["signatures"]["serving_default"]["inputs"][0]["name"] == "sample"
    text = difflite("inspect", tiny_out / "vae_decoder.tflite").stdout
    assert "CONV_2D" in text and "image" in text


def test_models_run_in_tensorflow_lite(tiny_out):
    """The same files load and agree in a second runtime (tensorflow's tf.lite)."""
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    path = str(tiny_out / "unet.tflite")
    rng = np.random.default_rng(0)
    results = []
    for interpreter_cls in (tf.lite.Interpreter, Interpreter):
        runner = interpreter_cls(model_path=path).get_signature_runner("serving_default")
        feeds = {name: rng.standard_normal(d["shape"]).astype(np.float32)
                 for name, d in sorted(runner.get_input_details().items())}
        rng = np.random.default_rng(0)
        results.append(runner(**feeds)["noise_pred"])
    assert np.abs(results[0]).max() > 0
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4, atol=1e-4 * np.abs(results[1]).max())


@pytest.mark.parametrize("args, needle", [
    (["convert", "{tmp}/missing-folder", "-o", "{tmp}/o"], "missing-folder"),
    (["convert", "{tmp}/empty", "-o", "{tmp}/o"], "empty"),
    (["convert", "preset:nope", "-o", "{tmp}/o"], "nope"),
    (["convert", "preset:tiny", "-o", "{tmp}/o", "--height", "50"], "height"),
    (["convert", "preset:tiny", "-o", "{tmp}/o", "--fuse", "magic"], "magic"),
    (["convert", "preset:tiny", "-o", "{tmp}/o", "--components", "unet,refiner"], "refiner"),
    (["verify", "{tmp}/empty"], "empty"),
    (["inspect", "{tmp}/garbage.tflite"], "garbage.tflite"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.tflite").write_bytes(b"\x00" * 64)
    result = difflite(*[a.format(tmp=tmp_path) for a in args], check=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("difflite: error:")]
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists(), "nothing half-written"


def test_truncated_tflite_is_rejected(tiny_out, tmp_path):
    cut = tmp_path / "cut.tflite"
    data = (tiny_out / "vae_decoder.tflite").read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    result = difflite("inspect", cut, check=False)
    assert result.returncode == 2 and "cut.tflite" in result.stderr


def test_unwritable_output_exits_2(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            # root ignores permission bits; a regular file in the way is unwritable for everyone
            target = tmp_path / "file"
            target.write_text("x")
            out = target / "sub"
        else:
            out = locked / "sub"
        result = difflite("convert", "preset:tiny", "-o", out, *SIZE, "--components", "vae_decoder", check=False)
        assert result.returncode == 2, result.stderr
        assert str(out.parent.name) in result.stderr
    finally:
        locked.chmod(0o700)


def test_interrupted_conversion_leaves_no_partial_files(tmp_path):
    """Ctrl-C while exporting: the staging folder goes, and so does the folder the run created."""
    out = tmp_path / "o"
    command = difflite_command()
    # Ctrl-C's default action in the child, as in a shell: a test worker may run with SIGINT
    # ignored (xdist's do), which the child would inherit and so finish the conversion.
    process = subprocess.Popen([*command, "convert", "preset:tiny", "-o", str(out), *SIZE],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob(".difflite-staging-*/onnx/*.onnx")):
        time.sleep(0.05)
    assert list(out.glob(".difflite-staging-*/onnx/*.onnx")), "conversion never started exporting"
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode == 130
    assert not out.exists()


def folder_state(folder: Path) -> dict[str, str]:
    """Every file under `folder` but staging folders: relative path -> sha256."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file() and not p.relative_to(folder).parts[0].startswith(".difflite-staging-")}


def test_killed_conversion_leaves_an_existing_folder_as_it_was(tiny_out, tmp_path):
    """SIGKILL while a conversion into an existing OUT (a copy of the module's) is exporting: OUT's
    files are exactly as before (only the killed run's staging folder is new); the next run
    succeeds and removes what the killed one staged."""
    out = tmp_path / "o"
    shutil.copytree(tiny_out, out)
    command = [sys.executable, "-m", "difflite", "convert", "preset:tiny", "-o", str(out), *SIZE,
               "--components", "vae_decoder"]
    before = folder_state(out)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.glob(".difflite-staging-*/onnx/*.onnx")):
        time.sleep(0.05)
    assert list(out.glob(".difflite-staging-*/onnx/*.onnx")), "conversion never started exporting"
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert folder_state(out) == before and len(list(out.glob(".difflite-staging-*"))) == 1
    assert subprocess.run(command, capture_output=True, cwd=ROOT).returncode == 0
    assert not list(out.glob(".difflite-staging-*")) and folder_state(out).keys() == before.keys()


def test_local_folder_and_single_file_round_trip(tmp_path):
    """The usual user case: a save_pretrained folder, and one .safetensors plus --config."""
    from difflite.compiler.models import load_pipeline
    from difflite.compiler.single_file import save_single_file

    folder = tmp_path / "sd-folder"
    pipe = load_pipeline("preset:tiny", seed=3)
    pipe.save_pretrained(folder)
    save_single_file(pipe, tmp_path / "model.safetensors")
    for source, extra in ((folder, []), (tmp_path / "model.safetensors", ["--config", folder])):
        out = tmp_path / f"out-{source.name}"
        difflite("convert", source, "-o", out, *SIZE, "--components", "vae_decoder", *extra)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["source"]["model"] == str(source.absolute())
        data = json.loads(difflite("verify", out, "--seeds", "0", "--json").stdout)
        assert data["passed"] and data["checks"][0]["max_abs_reference"] > 0


def test_fused_conversion_verifies_against_pytorch(tmp_path):
    """The default conversion (custom ops run by the op library's CPU backend) verifies like the
    builtin-only one, and every component really contains difflite ops."""
    out = tmp_path / "fused"
    difflite("convert", "preset:tiny", "-o", out, *SIZE)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["fuse"] == ["attention", "gelu", "groupnorm", "layernorm", "winograd"]
    fusion = {name: r["fusion"] for name, r in json.loads((out / "report.json").read_text())["components"].items()}
    for name in ("text_encoder", "unet"):  # the transformer blocks' LayerNorms run as GroupNorm(groups=1)
        layernorm = fusion[name]["layernorm"]
        assert layernorm["matched"] == layernorm["candidates"] > 0 and layernorm["custom_op"], (name, layernorm)
    for name in ("text_encoder", "unet", "vae_decoder"):
        assert any(op.startswith("difflite.") for op in manifest["components"][name]["custom_ops"]), name
    data = json.loads(difflite("verify", out, "--seeds", "0", "--json").stdout)
    assert data["passed"] and {c["component"] for c in data["checks"]} == {"text_encoder", "unet", "vae_decoder"}
    inspected = json.loads(difflite("inspect", out / "unet.tflite", "--json").stdout)
    options = [op["options"] for op in inspected["models"]["unet"]["custom_ops"] if op["name"] == "difflite.GroupNorm"]
    assert options and all(set(o) == {"groups", "epsilon", "activation"} for o in options)


def test_verify_on_litert_gpu_says_when_there_is_no_gpu(tiny_out):
    """`verify --backend litert-gpu` on a machine whose Vulkan finds no driver: exit 2 and one
    line saying so (the accelerator probed with a one-op file), not a crash."""
    env = {**os.environ, "VK_DRIVER_FILES": "/nonexistent.json", "VK_ICD_FILENAMES": "/nonexistent.json"}
    result = difflite("verify", tiny_out, "--backend", "litert-gpu", "--components", "vae_decoder",
                      "--seeds", "0", check=False, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no LiteRT GPU accelerator on this machine" in lines[0], result.stderr
    assert "vae_decoder.tflite" in lines[0] and "Traceback" not in result.stderr


def test_litert_child_runs_every_feed_set_as_the_interpreter_does(tiny_out):
    """The child process verify --backend litert-gpu uses, on LiteRT's CPU accelerator: every
    feed set's every output comes back, as the interpreter computes them."""
    from ai_edge_litert.interpreter import Interpreter

    from difflite.core.errors import BadInput
    from difflite.folder.output_folder import ComponentEntry
    from difflite.runtime import litert_gpu

    path = tiny_out / "vae_encoder.tflite"
    runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
    rng = np.random.default_rng(3)
    feeds = [{"image": rng.uniform(-1, 1, (1, 64, 96, 3)).astype(np.float32)} for _ in range(2)]  # the file's NHWC
    got = litert_gpu.run(path, feeds, "cpu")
    assert got.fully_accelerated is None and len(got.outputs) == 2
    for feed, outputs in zip(feeds, got.outputs):
        want = runner(**feed)
        assert set(outputs) == set(want) == {"latent_mean", "latent_std"}
        for name in want:
            np.testing.assert_allclose(outputs[name], want[name], rtol=1e-5, atol=1e-6 * np.abs(want[name]).max())
    assert not np.allclose(got.outputs[0]["latent_mean"], got.outputs[1]["latent_mean"])
    with pytest.raises(BadInput, match="--no-fuse"):
        litert_gpu.check_runnable(ComponentEntry(path.stem, path, custom_ops=("difflite.GroupNorm",)))
