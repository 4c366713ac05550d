"""ControlNet at conversion (`convert --controlnet`, difflite/compiler/controlnet.py): preset:tiny with
preset:controlnet-tiny, one and two ControlNets; the census of the ControlNet component matched;
the ControlNet and the residual-taking UNet against PyTorch fp32 (verify, and the two chained on
the op library's CPU backend); a diffusers folder and an original-format file of the preset's
ControlNet giving the same files; int8 weights at batch 2; generate without a control image;
the architecture of full-size SD 1.5 / 2.1 ControlNet files from their shapes; bad inputs.

Three conversions at 64x64 (module-scoped; the exports shared through the session's export
cache, tests/conftest.py), under a device profile whose thresholds make the small 3x3
convolutions Winograd candidates, so that "every eligible convolution fused" means something."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from difflite.core.errors import BadInput

from support import ldm_layout as L
from support.cli import run_difflite
from support.passes_helpers import module_census

SIZE = ("--height", "64", "--width", "64")
PRESET = "preset:controlnet-tiny"
BUDGET = ("--winograd-budget-mb", "1000")
FP32_RELATIVE = 1e-3  # verify's bar (DESIGN §7)
# TEST_PROFILE of tests/test_winograd_profiles.py: small convolutions eligible and compute-bound
PROFILE = {"min_in_channels": 8, "min_out_channels": 8, "min_tiles": 4}


def difflite(*args, check=True) -> subprocess.CompletedProcess:
    return run_difflite(*args, check=check, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


def rel_err(reference, actual) -> float:
    reference, actual = np.asarray(reference, np.float64), np.asarray(actual, np.float64)
    return float(np.abs(reference - actual).max() / np.abs(reference).max())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Sources and conversions


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("controlnet")


@pytest.fixture(scope="module")
def profile(base) -> Path:
    entry = json.loads((Path(__file__).parents[1] / "difflite/core/device_profiles.json").read_text())
    generic = entry["profiles"]["generic"]
    test = {**generic, "fp16": False, "launch_overhead_us": 0.001, "bandwidth_gbps": 1e6,
            "winograd": {**generic["winograd"], **PROFILE}}
    path = base / "test-profile.json"
    path.write_text(json.dumps({"profiles": {"test": test}}))
    return path


@pytest.fixture(scope="module")
def pipe():
    """preset:tiny with preset:controlnet-tiny, as convert loads them."""
    from difflite.compiler.models import load_pipeline

    return load_pipeline("preset:tiny", controlnets=(PRESET,))


@pytest.fixture(scope="module")
def sources(base, pipe) -> dict[str, Path]:
    """The preset's ControlNet as a diffusers folder (save_pretrained) and as a ControlNet 1.1
    .pth file (control_model.* keys), the latter also with bare keys as .safetensors."""
    controlnet = pipe.controlnets[0]
    folder = base / "cn-folder"
    controlnet.save_pretrained(folder, safe_serialization=True)
    state = L.controlnet_to_ldm(controlnet)
    return {"folder": folder, "file": L.write_checkpoint(base / "control_tiny.pth", state),
            "bare": L.write_checkpoint(base / "control_tiny.safetensors", L.controlnet_to_ldm(controlnet, ""))}


@pytest.fixture(scope="module")
def one(base, profile) -> Path:
    """preset:tiny (text encoder, UNet, VAE decoder) with preset:controlnet-tiny."""
    out = base / "one"
    difflite("convert", "preset:tiny", "--controlnet", PRESET, "-o", out, *SIZE, "--device-profile", profile, *BUDGET)
    return out


@pytest.fixture(scope="module")
def many(base, profile, sources) -> Path:
    """Two ControlNets: the preset's as a diffusers folder, then as an original-format file."""
    out = base / "many"
    difflite("convert", "preset:tiny", "--controlnet", sources["folder"], "--controlnet", sources["file"], "-o", out,
             *SIZE, "--components", "unet", "--device-profile", profile, *BUDGET)
    return out


@pytest.fixture(scope="module")
def int8(base, profile) -> Path:
    """int8 weights stored at fp16, batch 2, no Winograd for the ControlNet."""
    out = base / "int8"
    difflite("convert", "preset:tiny", "--controlnet", PRESET, "-o", out, *SIZE, "--components", "unet", "--batch", "2",
             "--weights", "int8", "--precision", "fp16", "--device-profile", profile,
             "--winograd-budget-mb", "controlnet_0=off")
    return out


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


# ---------------------------------------------------------------------------------------------
# Loading, without conversion


def test_preset_is_from_unet_with_non_zero_zero_convs(pipe):
    """preset:controlnet-tiny has ControlNetModel.from_unet's config for preset:tiny's UNet, and its
    zero convolutions (and the hint's last one) are not zero, so the residuals are not."""
    from diffusers import ControlNetModel

    from difflite.compiler import controlnet as C
    from difflite.compiler.presets import preset_configs

    cn = pipe.controlnets[0]
    reference = ControlNetModel.from_unet(pipe.unet, load_weights_from_unet=False)
    ours = {k: C._plain(v) for k, v in cn.config.items() if not k.startswith("_")}
    assert ours == {k: C._plain(v) for k, v in reference.config.items() if not k.startswith("_")}
    for zero in [*cn.controlnet_down_blocks, cn.controlnet_mid_block, cn.controlnet_cond_embedding.conv_out]:
        assert zero.weight.abs().min() > 0 and zero.bias.abs().min() > 0
    assert len(cn.controlnet_down_blocks) == 6  # conv_in, 2 x 2 layers, 1 downsampler
    sd15 = C.read_source("preset:controlnet")
    assert sd15.config["block_out_channels"] == preset_configs("sd15")["unet"]["block_out_channels"]
    assert sd15.config["cross_attention_dim"] == 768 and sd15.config["conditioning_embedding_out_channels"] == \
        [16, 32, 96, 256]
    record = pipe.details["controlnets"]
    assert [r["component"] for r in record] == ["controlnet_0"] and record[0]["kind"] == "preset"


@pytest.mark.parametrize("preset, linear, cross", [("sd15", False, 768), ("sd21", True, 1024)])
def test_full_size_files_from_their_shapes(preset, linear, cross):
    """SD 1.5 / 2.1 ControlNet 1.x layouts (meta tensors: shapes only; 340 tensors as
    control_v11p_sd15_canny.pth holds) give back the architecture and a weight for every tensor."""
    from diffusers import ControlNetModel, UNet2DConditionModel

    from difflite.compiler.controlnet import infer_file
    from difflite.compiler.presets import preset_configs

    unet_config = preset_configs(preset)["unet"]
    with torch.device("meta"):
        model = ControlNetModel.from_unet(UNet2DConditionModel.from_config(unet_config),
                                          load_weights_from_unet=False)
    state = L.controlnet_to_ldm(model)
    assert len(state) == 340
    config, weights, reasons = infer_file(Path(f"control_{preset}.pth"), state)
    assert config == {"in_channels": 4, "block_out_channels": [320, 640, 1280, 1280], "layers_per_block": 2,
                      "cross_attention_dim": cross, "use_linear_projection": linear,
                      "down_block_types": unet_config["down_block_types"], "conditioning_channels": 3,
                      "conditioning_embedding_out_channels": [16, 32, 96, 256]}
    assert {k: tuple(v.shape) for k, v in weights.items()} == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert "hint embedding: 3-channel image through [16, 32, 96, 256]" in reasons


def test_file_and_folder_load_the_preset_weights(pipe, sources):
    """Each form of the preset's ControlNet loads into the same weights (the LDM writer of
    tests/support/ldm_layout.py checked against diffusers' converter), the file's with its
    inferred architecture recorded."""
    from difflite.compiler.models import load_pipeline

    expected = pipe.controlnets[0].state_dict()
    for form in ("folder", "file", "bare"):
        loaded = load_pipeline("preset:tiny", controlnets=(str(sources[form]),))
        state = loaded.controlnets[0].state_dict()
        assert state.keys() == expected.keys(), form
        assert all(torch.equal(state[k], expected[k]) for k in expected), form
        record = loaded.details["controlnets"][0]
        assert record["model"] == str(sources[form]) and record["kind"] == ("folder" if form == "folder" else "file")
        assert record["architecture"]["summary"] == pipe.details["controlnets"][0]["architecture"]["summary"]
        assert loaded.source_hash != pipe.source_hash  # folded in: another source, another hash
    assert any("heads, norm groups" in r for r in loaded.details["controlnets"][0]["architecture"]["reasons"])


def test_an_sd2_controlnet_does_not_fit_sd15():
    """The fit check names each field that differs (no model is built for it)."""
    from difflite.compiler import controlnet as C
    from difflite.compiler.presets import preset_configs

    sd21 = C.ControlNetSource("/models/control_sd21.safetensors", "file",
                              {**C.from_unet_config(preset_configs("sd21")["unet"]), "layers_per_block": 1,
                               "conditioning_embedding_out_channels": [16, 32, 96, 256]}, "0" * 64)
    sd15 = types.SimpleNamespace(source="preset:sd15", vae_scale_factor=8,
                                 unet=types.SimpleNamespace(config=preset_configs("sd15")["unet"]))
    with pytest.raises(BadInput) as info:
        C.check_fits(sd21, sd15)
    assert str(info.value) == ("/models/control_sd21.safetensors: the ControlNet does not fit preset:sd15's UNet: "
                               "layers_per_block 1 (the UNet's 2); cross_attention_dim 1024 (the UNet's 768): "
                               "an SD 2.x ControlNet on an SD 1.x model")
    sd15_hint = C.ControlNetSource("/models/cn", "folder", {**C.from_unet_config(preset_configs("sd15")["unet"]),
                                                             "conditioning_embedding_out_channels": [16, 32, 96]}, "")
    with pytest.raises(BadInput, match="hint embedding downsamples the image 4 times \\(the VAE 8 times\\)$"):
        C.check_fits(sd15_hint, sd15)


# ---------------------------------------------------------------------------------------------
# One ControlNet


def test_conversion_writes_a_controlnet_component(one, pipe):
    from difflite.folder.output_folder import OutputFolder

    data = manifest(one)
    assert set(data["components"]) == {"text_encoder", "unet", "vae_decoder", "controlnet_0"}  # JSON: sorted
    assert data["options"]["components"] == ["text_encoder", "unet", "vae_decoder", "controlnet_0"]
    (record,) = data["source"]["controlnets"]
    assert record["model"] == PRESET and record["kind"] == "preset" and len(record["sha256"]) == 64
    assert record["architecture"]["summary"].startswith("ControlNet: channels [32, 64], layers_per_block 2")
    cn = data["components"]["controlnet_0"]
    assert [t["name"] for t in cn["inputs"]] == ["sample", "timestep", "encoder_hidden_states", "controlnet_cond"]
    assert cn["inputs"][3]["shape"] == [1, 64, 64, 3] and cn["inputs"][3]["layout"] == "NHWC"
    residuals = [f"down_residual_{i}" for i in range(6)] + ["mid_residual"]
    assert [t["name"] for t in cn["outputs"]] == residuals
    assert cn["conditioning"] == {"input": "controlnet_cond", "channels": 3, "height": 64, "width": 64,
                                  "value_range": [0.0, 1.0], "channel_order": "rgb"}
    unet = data["components"]["unet"]
    assert [t["name"] for t in unet["inputs"]] == ["sample", "timestep", "encoder_hidden_states", *residuals]
    assert [t["shape"] for t in unet["inputs"][3:]] == [t["shape"] for t in cn["outputs"]]
    folder = OutputFolder.read(one)
    assert [e.name for e in folder.controlnets] == ["controlnet_0"]
    assert folder.controlnets[0].conditioning["channels"] == 3
    assert folder.control_residual_names == tuple(residuals)
    assert folder.controlnets[0].control_residuals[-1].onnx_shape == (1, 64, 4, 4)
    assert folder.components["text_encoder"].control_residuals == ()


def winograd_eligible(pipe, height: int, width: int) -> tuple[int, int]:
    """(3x3 stride-1 convolutions, those PROFILE makes eligible) of the torch ControlNet at this
    size: an independent count of the Winograd candidates, from the modules and their inputs."""
    from difflite.compiler import export

    seen = []
    convs = [m for m in pipe.controlnets[0].modules() if isinstance(m, torch.nn.Conv2d)]
    hooks = [m.register_forward_hook(lambda m, args, out: seen.append((m, tuple(args[0].shape)))) for m in convs]
    spec = export.component_spec(pipe, "controlnet_0", height, width, 1)
    with torch.no_grad():
        spec.module(*spec.example_inputs)
    for hook in hooks:
        hook.remove()
    plain = [(m, shape) for m, shape in seen if m.kernel_size == (3, 3) and m.stride == (1, 1)
             and m.padding == (1, 1) and m.dilation == (1, 1) and m.groups == 1]
    eligible = [(m, s) for m, s in plain if m.in_channels >= PROFILE["min_in_channels"]
                and m.out_channels >= PROFILE["min_out_channels"]
                and math.ceil(s[2] / 4) * math.ceil(s[3] / 4) >= PROFILE["min_tiles"]]
    return len(plain), len(eligible)


def test_census_matched(one, pipe):
    """Every GroupNorm (with SiLU), LayerNorm, attention and GEGLU of the ControlNet is fused, as
    many as its torch modules hold; every 3x3 convolution the profile makes eligible is a
    WinogradConv3x3; so for the UNet."""
    fusion = {name: r["fusion"] for name, r in report(one)["components"].items()}
    expected = {"controlnet_0": module_census(pipe.controlnets[0]), "unet": module_census(pipe.unet)}
    for name, census in expected.items():
        for kind in ("groupnorm", "layernorm", "attention", "geglu", "gelu"):
            assert fusion[name][kind] == {"matched": census[kind], "candidates": census[kind], "custom_op": True}, \
                (name, kind)
        assert fusion[name]["groupnorm_silu"]["matched"] == fusion[name]["groupnorm_silu"]["candidates"] > 0
    counts = fusion["controlnet_0"]
    assert min(counts[k]["matched"] for k in ("groupnorm", "layernorm", "attention", "geglu")) > 0
    candidates, eligible = winograd_eligible(pipe, 64, 64)
    assert counts["winograd"] == {"matched": eligible, "candidates": candidates, "custom_op": True}
    assert 0 < eligible < candidates
    assert fusion["unet"]["winograd"]["matched"] > 0
    ops = manifest(one)["components"]["controlnet_0"]["custom_ops"]
    assert {"difflite.GroupNorm", "difflite.Attention", "difflite.GeGLU", "difflite.WinogradConv3x3"} <= set(ops)
    print("controlnet_0 fusion:", json.dumps({k: [v["matched"], v["candidates"]] for k, v in counts.items()}))


def test_verify_against_pytorch(one):
    """`difflite verify` checks the ControlNet (every residual) and the residual-taking UNet."""
    data = json.loads(difflite("verify", one, "--seeds", "0,1", "--backend", "cpu", "--json").stdout)
    assert data["passed"]
    checks = {(c["component"], c["output"], c["seed"]): c for c in data["checks"]}
    assert {c for c, _, _ in checks} == {"text_encoder", "unet", "vae_decoder", "controlnet_0"}
    assert {o for c, o, _ in checks if c == "controlnet_0"} == {*(f"down_residual_{i}" for i in range(6)),
                                                                "mid_residual"}
    for check in checks.values():
        assert check["relative_error"] <= FP32_RELATIVE and check["max_abs_reference"] > 0, check
    worst = {c: max(v["relative_error"] for (n, _, _), v in checks.items() if n == c) for c in ("controlnet_0", "unet")}
    print("verify worst relative error:", worst)


def test_residuals_drive_the_unet(one, pipe, lib):
    """The ControlNet file's residuals, scaled, through the UNet file (the op library's CPU backend)
    agree with diffusers' ControlNet + UNet in PyTorch; zero residuals give the UNet without
    ControlNet."""
    from difflite.compiler import export
    from difflite.folder.output_folder import OutputFolder
    from difflite.runtime.component import Component

    folder = OutputFolder.read(one)
    controlnet, unet = (Component(folder.components[n], backend="cpu") for n in ("controlnet_0", "unet"))
    spec = export.component_spec(pipe, "controlnet_0", 64, 64, 1, seed=7)
    sample, timestep, context, image = spec.example_inputs
    scale = 0.6
    with torch.no_grad():
        down, mid = pipe.controlnets[0](sample, timestep, context, image, conditioning_scale=scale, return_dict=False)
        expected = pipe.unet(sample, timestep, context, down_block_additional_residuals=down,
                             mid_block_additional_residual=mid).sample
        plain = pipe.unet(sample, timestep, context).sample
    feeds = {"sample": sample.numpy(), "timestep": timestep.numpy(), "encoder_hidden_states": context.numpy()}
    residuals = controlnet(**feeds, controlnet_cond=image.numpy())
    scaled = {name: scale * residuals[name] for name in folder.control_residual_names}
    assert rel_err(expected, unet(**feeds, **scaled)["noise_pred"]) <= FP32_RELATIVE
    zeros = {s.name: np.zeros(s.onnx_shape, np.float32) for s in folder.components["unet"].control_residuals}
    assert rel_err(plain, unet(**feeds, **zeros)["noise_pred"]) <= FP32_RELATIVE
    assert rel_err(plain, expected) > 0.01  # the residuals matter


def test_generate_without_a_control_image(one, tmp_path):
    """A folder converted with a ControlNet still generates (zero residuals), and inspect lists
    the ControlNet."""
    image = tmp_path / "cat.png"
    difflite("generate", one, "a cat", "-o", image, "--steps", "2", "--backend", "cpu")
    from PIL import Image

    assert Image.open(image).size == (64, 64)
    models = json.loads(difflite("inspect", one, "--json").stdout)["models"]
    inputs = models["controlnet_0"]["signatures"]["serving_default"]["inputs"]
    assert "controlnet_cond" in [t["name"] for t in inputs]
    assert "mid_residual" in [t["name"] for t in models["unet"]["signatures"]["serving_default"]["inputs"]]


# ---------------------------------------------------------------------------------------------
# Two ControlNets: a diffusers folder and an original-format file of the preset's


def test_folder_and_file_give_the_preset_files(one, many, sources):
    data = manifest(many)
    assert set(data["components"]) == {"unet", "controlnet_0", "controlnet_1"}
    assert data["options"]["components"] == ["unet", "controlnet_0", "controlnet_1"]
    records = data["source"]["controlnets"]
    assert [(r["component"], r["kind"], r["model"]) for r in records] == [
        ("controlnet_0", "folder", str(sources["folder"])), ("controlnet_1", "file", str(sources["file"]))]
    assert records[1]["architecture"]["reasons"][0].startswith("ControlNet: channels [32, 64], layers_per_block 2")
    preset = (one / "controlnet_0.tflite").read_bytes()
    assert (many / "controlnet_0.tflite").read_bytes() == preset
    # the file's description names its component, and nothing else differs
    second = (many / "controlnet_1.tflite").read_bytes()
    assert second.count(b"controlnet_1") == 1
    assert second.replace(b"controlnet_1", b"controlnet_0") == preset
    assert sha(many / "unet.tflite") == sha(one / "unet.tflite")  # one UNet whatever the ControlNets
    assert data["components"]["controlnet_1"]["conditioning"] == manifest(one)["components"]["controlnet_0"][
        "conditioning"]


def test_verify_reloads_the_recorded_sources(many):
    data = json.loads(difflite("verify", many, "--seeds", "0", "--backend", "cpu", "--json").stdout)
    assert data["passed"] and {c["component"] for c in data["checks"]} == {"unet", "controlnet_0", "controlnet_1"}


def test_verify_names_a_controlnet_changed_since_conversion(many, sources):
    """A recorded ControlNet whose file no longer hashes as recorded is named, not the base model."""
    import dataclasses

    from difflite.folder.output_folder import OutputFolder
    from difflite.verify import load_source

    folder = OutputFolder.read(many)
    records = [dict(r) for r in folder.source["controlnets"]]
    records[1]["sha256"] = "0" * 64
    changed = dataclasses.replace(folder, source={**folder.source, "controlnets": records})
    with pytest.raises(BadInput, match=f"^{sources['file']}: the weights of controlnet_1 changed since conversion"):
        load_source(changed, None, None)


# ---------------------------------------------------------------------------------------------
# int8 weights


def test_int8_weights_at_batch_2(int8):
    data, rep = manifest(int8), report(int8)
    cn = data["components"]["controlnet_0"]
    assert cn["quantized_weights"] and cn["inputs"][3]["shape"] == [2, 64, 64, 3]
    assert all(t["shape"][0] == 2 for t in cn["outputs"])
    assert data["options"]["winograd_budgets_mb"] == {"unet": 0.0, "controlnet_0": "off"}
    assert rep["components"]["controlnet_0"]["fusion"]["winograd"]["matched"] == 0
    assert rep["components"]["controlnet_0"]["winograd"] == {"convs": [], "extra_weights_mb": 0}
    assert rep["components"]["controlnet_0"]["weight_widths"]["by_width"]["int8"]["layers"] > 0
    assert set(data["weights_recipe"]) == {"unet", "controlnet_0"}
    checks = json.loads(difflite("verify", int8, "--seeds", "0", "--backend", "cpu", "--json").stdout)
    assert checks["passed"]
    snr = {c["output"]: c["snr_db"] for c in checks["checks"] if c["component"] == "controlnet_0"}
    assert len(snr) == 7 and min(snr.values()) >= 35.0
    print("int8 fp16 ControlNet SNR dB:", {k: round(v, 1) for k, v in snr.items()})


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2, one line naming the culprit, nothing written


def controlnet_folder(folder: Path, **changes) -> Path:
    """A diffusers ControlNet folder of preset:controlnet-tiny's config changed by `changes`, with an
    empty weight file (the fit check reads no weights)."""
    from difflite.compiler.controlnet import read_source

    folder.mkdir(parents=True)
    config = {"_class_name": "ControlNetModel", **read_source(PRESET).config, **changes}
    (folder / "config.json").write_text(json.dumps(config))
    L.write_checkpoint(folder / "diffusion_pytorch_model.safetensors", {})
    return folder


def sd_checkpoint(folder: Path) -> Path:
    models = L.tiny_models("sd1")
    return L.write_checkpoint(folder / "sd.safetensors", L.to_ldm(models, "sd1"))


def sdxl_file(folder: Path) -> Path:
    """The first keys of an SDXL ControlNet in diffusers' layout (add_embedding: text_time)."""
    return L.write_checkpoint(folder / "sdxl.safetensors", {
        "controlnet_cond_embedding.conv_in.weight": torch.randn(320, 3, 3, 3),
        "add_embedding.linear_1.weight": torch.randn(1280, 2816)})


def random_safetensors(folder: Path) -> Path:
    return L.write_checkpoint(folder / "random.safetensors", {"foo.weight": torch.randn(4, 4)})


def truncated(folder: Path, sources) -> Path:
    path = folder / "control_tiny.safetensors"
    data = sources["bare"].read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def fifo(folder: Path) -> Path:
    os.mkfifo(folder / "pipe")
    return folder / "pipe"


CN = ("convert", "preset:tiny", "-o", "{t}/OUT", *SIZE, "--controlnet")
BAD = {
    # (arguments, needles of the error line, prepare(folder, sources))
    "sd2-cross-attention": ((*CN, "{t}/cn"), ("{t}/cn", "cross_attention_dim 1024 (the UNet's 32)"),
                            lambda f, s: controlnet_folder(f / "cn", cross_attention_dim=1024)),
    "block-out-channels": ((*CN, "{t}/cn"), ("{t}/cn", "block_out_channels [32, 32] (the UNet's [32, 64])"),
                           lambda f, s: controlnet_folder(f / "cn", block_out_channels=[32, 32])),
    "layers-per-block": ((*CN, "{t}/cn"), ("layers_per_block 1 (the UNet's 2)",),
                         lambda f, s: controlnet_folder(f / "cn", layers_per_block=1)),
    "in-channels": ((*CN, "{t}/cn"), ("in_channels 9 (the UNet's 4)",),
                    lambda f, s: controlnet_folder(f / "cn", in_channels=9)),
    "missing": ((*CN, "{t}/nothing"), ("{t}/nothing", "no such file or folder"), None),
    "fifo": ((*CN, "{t}/pipe"), ("{t}/pipe", "neither a folder nor a file"), lambda f, s: fifo(f)),
    "sd-checkpoint": ((*CN, "{t}/sd.safetensors"), ("{t}/sd.safetensors", "Stable Diffusion checkpoint, not"),
                      lambda f, s: sd_checkpoint(f)),
    "random-safetensors": ((*CN, "{t}/random.safetensors"), ("{t}/random.safetensors", "not a ControlNet"),
                           lambda f, s: random_safetensors(f)),
    "truncated": ((*CN, "{t}/control_tiny.safetensors"), ("{t}/control_tiny.safetensors", "cannot read checkpoint"),
                  truncated),
    "sdxl-folder": ((*CN, "{t}/cn"), ("{t}/cn/config.json", "SDXL ControlNets need SDXL support (not yet)"),
                    lambda f, s: controlnet_folder(f / "cn", addition_embed_type="text_time")),
    "sdxl-file": ((*CN, "{t}/sdxl.safetensors"), ("{t}/sdxl.safetensors", "SDXL ControlNets need SDXL support"),
                  lambda f, s: sdxl_file(f)),
    "not-a-controlnet-folder": ((*CN, "{t}/cn"), ("{t}/cn/config.json", "not a ControlNetModel"),
                                lambda f, s: controlnet_folder(f / "cn", _class_name="UNet2DConditionModel")),
    "unknown-preset": ((*CN, "preset:controlnet-huge"), ("preset:controlnet-huge", "preset:controlnet-tiny"), None),
    "without-unet": ((*CN, PRESET, "--components", "text_encoder,vae_decoder"),
                     ("--controlnet needs the unet among --components",), None),
    "named-in-components": ((*CN, PRESET, "--components", "unet,controlnet_0"),
                            ("controlnet_0 comes from --controlnet",), None),
    "budget-of-a-missing-controlnet": ((*CN, PRESET, "--winograd-budget-mb", "controlnet_1=0"),
                                       ("controlnet_1", "1 --controlnet"), None),
}


@pytest.fixture(scope="module")
def bad_outcomes(base, sources) -> dict:
    """Every BAD case run, two at a time: (the folder, the completed process, the folder's files before)."""
    from support import ROOT
    from support.cli import difflite_command

    def run(case_id: str):
        args, _, prepare = BAD[case_id]
        folder = base / "bad" / case_id
        folder.mkdir(parents=True)
        if prepare is not None:
            prepare(folder, sources)
        before = sorted(p.name for p in folder.iterdir())
        result = subprocess.run([*difflite_command(), *(a.format(t=folder) for a in args)], capture_output=True,
                                text=True, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300,
                                check=False)
        return folder, result, before

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(BAD, pool.map(run, BAD)))


@pytest.mark.parametrize("case_id", sorted(BAD))
def test_bad_input_exits_2_with_one_line(case_id, bad_outcomes):
    folder, result, before = bad_outcomes[case_id]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert all(line.startswith("[difflite] ") for line in lines[:-1]), result.stderr
    assert lines[-1].startswith("difflite: error: ")
    print(case_id, lines[-1])
    for needle in BAD[case_id][1]:
        assert needle.format(t=folder) in lines[-1], lines[-1]
    assert sorted(p.name for p in folder.iterdir()) == before and not (folder / "OUT").exists()
