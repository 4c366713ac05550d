"""--lora: LoRA files (diffusers/PEFT and kohya/A1111 layouts) merged into the tiny preset's UNet and
text encoder. Every merged weight is checked against W + scale * (alpha / rank) * up @ down computed
here in float64, every other weight against the base bit for bit; then end to end through the CLI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from difflite.compiler.lora import merge_loras
from difflite.compiler.models import load_pipeline
from difflite.core.lora import LoraSpec
from difflite.compiler.pipeline import fold_into_hash
from difflite.core.errors import BadInput

from support.cli import run_difflite as difflite
from support.lora_files import KOHYA, METADATA, kohya_key, named_module, write_diffusers, write_kohya


@pytest.fixture(scope="module")
def base():
    """The tiny preset as loaded, never merged into (errors are raised before any merge)."""
    return load_pipeline("preset:tiny")


@pytest.fixture(scope="module")
def base_weights(base):
    return {c: {k: v.clone() for k, v in getattr(base, c).state_dict().items()}
            for c in ("unet", "text_encoder", "vae")}


def _expected(base_weights, merges):
    """{(component, weight key): float64 weight} after merging [(layers, scale)] in order."""
    out = {}
    for layers, scale in merges:
        for component, name, down, up, factor in layers:
            key = (component, f"{name}.weight")
            w = out.get(key, base_weights[component][key[1]].double())
            delta = (up.double().flatten(1) @ down.double().flatten(1)).reshape(w.shape)
            out[key] = w + scale * factor * delta
    return out


def assert_merged(pipe, base_weights, merges):
    from peft.tuners.tuners_utils import BaseTunerLayer

    expected = _expected(base_weights, merges)
    for component, weights in base_weights.items():
        model = getattr(pipe, component)
        assert not any(isinstance(m, BaseTunerLayer) for m in model.modules()), component
        merged = model.state_dict()
        assert set(merged) == set(weights), f"{component}: parameters added or removed"
        for key, before in weights.items():
            after = merged[key]
            if (component, key) in expected:
                assert not torch.equal(after, before), key
                torch.testing.assert_close(after.double(), expected[component, key], rtol=1e-6, atol=1e-6,
                                           msg=lambda m, name=f"{component}.{key}": f"{name}: {m}")
            else:
                assert torch.equal(after, before), f"{component}.{key} changed but no LoRA targets it"
    for layers, _ in merges:
        for component, name, *_ in layers:
            module = named_module(pipe, component, name)
            assert type(module) in (torch.nn.Linear, torch.nn.Conv2d), (name, type(module))


def _record(path, scale, fmt, layers):
    return {"file": path.name, "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "scale": scale, "format": fmt, "layers": layers}


# ---------------------------------------------------------------------------------------------
# Merging


@pytest.mark.parametrize("layout", ["kohya", "peft", "peft_metadata", "diffusers_old"])
def test_merge_matches_the_lora_arithmetic(layout, base, base_weights, tmp_path):
    path = tmp_path / f"{layout}.safetensors"
    if layout == "kohya":
        layers = write_kohya(base, path)
    else:
        layers = write_diffusers(base, path, style="old" if layout == "diffusers_old" else "peft",
                                 metadata=METADATA if layout == "peft_metadata" else None)
    scale = 0.8
    pipe = load_pipeline("preset:tiny", loras=(LoraSpec(str(path), scale),))
    assert_merged(pipe, base_weights, [(layers, scale)])

    fmt = "kohya" if layout == "kohya" else "diffusers"
    counts = {c: sum(1 for layer in layers if layer[0] == c) for c in ("unet", "text_encoder")}
    [record] = pipe.details["loras"]
    assert {k: v for k, v in record.items() if k != "summary"} == _record(path, scale, fmt, counts)
    assert record["summary"] == f"{fmt}, {counts['unet']} UNet + {counts['text_encoder']} text encoder layers"
    folded = SimpleNamespace(source_hash=base.source_hash)
    fold_into_hash(folded, f"lora={record['sha256']}:0.8")
    assert pipe.source_hash == folded.source_hash


def test_two_loras_merge_in_order_with_their_own_scales(base, base_weights, tmp_path):
    kohya, peft = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    kohya_layers = write_kohya(base, kohya)
    peft_layers = write_diffusers(base, peft)
    pipe = load_pipeline("preset:tiny", loras=(LoraSpec(str(kohya), 0.7), LoraSpec(str(peft), -0.3)))
    assert_merged(pipe, base_weights, [(kohya_layers, 0.7), (peft_layers, -0.3)])
    assert [(r["file"], r["scale"]) for r in pipe.details["loras"]] == [("a.safetensors", 0.7), ("b.safetensors", -0.3)]
    # Order and scale are part of the hash.
    swapped = load_pipeline("preset:tiny", loras=(LoraSpec(str(peft), -0.3), LoraSpec(str(kohya), 0.7)))
    assert swapped.source_hash != pipe.source_hash


def test_partial_match_warns_with_counts_and_merges_the_rest(base, base_weights, tmp_path, capfd):
    path = tmp_path / "partial.safetensors"
    extra = [("lora_unet_down_blocks_3_attentions_0_transformer_blocks_0_attn1_to_q", 32, 32),
             ("lora_te2_text_model_encoder_layers_0_self_attn_q_proj", 32, 32)]
    layers = write_kohya(base, path, extra=extra)
    # kohya files may bundle textual-inversion embeddings beside the LoRA layers.
    tensors = load_file(str(path))
    tensors["bundle_emb.style.string_to_param.*"] = torch.zeros(1, 32)
    save_file(tensors, str(path))
    capfd.readouterr()
    pipe = load_pipeline("preset:tiny", loras=(LoraSpec(str(path), 1.0),))
    err = capfd.readouterr().err
    assert f"difflite: warning: {path}: 3 of its 16 LoRA layers match no layer of the model and are skipped " \
           f"(matched: unet 8/9, text_encoder 5/5, text_encoder_2 0/1, other 0/1)" in err
    assert_merged(pipe, base_weights, [(layers, 1.0)])
    assert pipe.details["loras"][0]["layers"] == {"unet": 8, "text_encoder": 5}


# ---------------------------------------------------------------------------------------------
# Bad input (checked before anything is merged, so the shared base stays untouched)


def _bad(base, path, match):
    with pytest.raises(BadInput, match=match) as info:
        merge_loras(base, (LoraSpec(str(path), 1.0),))
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert "loras" not in base.details


def test_bad_files(base, base_weights, tmp_path):
    _bad(base, tmp_path / "missing.safetensors", "no such LoRA file")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    _bad(base, tmp_path / "garbage.safetensors", "not a .safetensors file")
    torch.save({"lora_unet_x.lora_down.weight": torch.zeros(1)}, tmp_path / "pickled.ckpt")
    _bad(base, tmp_path / "pickled.ckpt", "not a .safetensors file")
    _bad(base, tmp_path, "a folder")

    unrelated = tmp_path / "unrelated.safetensors"
    save_file({"model.layers.0.mlp.lora_A.weight": torch.zeros(4, 8),
               "model.layers.0.mlp.lora_B.weight": torch.zeros(8, 4)}, str(unrelated))
    _bad(base, unrelated, r"none of its 1 LoRA layers matches .*keys look like 'model\.layers\.0\.mlp\.lora_A\.weight'")

    wrong_shape = tmp_path / "sd2.safetensors"  # a text-encoder LoRA for a wider CLIP
    save_file({"lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight": torch.zeros(4, 1024),
               "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight": torch.zeros(1024, 4)},
              str(wrong_shape))
    _bad(base, wrong_shape, r"encoder\.layers\.0\.self_attn\.q_proj has down \(4, 1024\)")

    dora = tmp_path / "dora.safetensors"
    key = kohya_key(*KOHYA[0][:2])
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 32), f"{key}.lora_up.weight": torch.zeros(32, 4),
               f"{key}.dora_scale": torch.ones(1, 32)}, str(dora))
    _bad(base, dora, "not plain LoRA")

    no_up = tmp_path / "no_up.safetensors"
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 32), f"{key}.alpha": torch.tensor(4.0)}, str(no_up))
    _bad(base, no_up, "needs lora_down.weight and lora_up.weight")

    # A bad second file stops the run before the first is merged.
    good = tmp_path / "good.safetensors"
    write_kohya(base, good)
    with pytest.raises(BadInput, match="unrelated"):
        merge_loras(base, (LoraSpec(str(good), 1.0), LoraSpec(str(unrelated), 1.0)))
    assert all(torch.equal(v, base_weights["unet"][k]) for k, v in base.unet.state_dict().items())
    assert all(torch.equal(v, base_weights["text_encoder"][k]) for k, v in base.text_encoder.state_dict().items())


# ---------------------------------------------------------------------------------------------
# Through the CLI


def _ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


def convert_with_lora(path: Path, scale: float, out: Path):
    """`convert` of the tiny UNet and text encoder with one LoRA: (the run, the manifest's record
    of the LoRA, whose sha256 is checked here)."""
    result = difflite("convert", "preset:tiny", "-o", out, "--components", "unet,text_encoder",
                      "--height", "64", "--width", "64", "--lora", f"{path}:{scale}")
    _ok(result)
    [record] = json.loads((out / "manifest.json").read_text())["source"]["loras"]
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    return result, record


def test_cli_convert_and_verify_with_a_kohya_lora(base, tmp_path):
    path = tmp_path / "kohya.safetensors"
    write_kohya(base, path)
    out = tmp_path / "out"
    result, record = convert_with_lora(path, 0.8, out)
    assert "merged LoRA kohya.safetensors x0.8 (kohya, 8 UNet + 5 text encoder layers)" in result.stderr
    assert record["scale"] == 0.8 and record["path"] == str(path) and record["format"] == "kohya"
    _ok(difflite("verify", out))


def test_cli_partial_lora_warns_and_converts(base, tmp_path):
    path = tmp_path / "partial.safetensors"
    write_kohya(base, path, extra=[("lora_unet_down_blocks_3_attentions_0_transformer_blocks_0_attn1_to_q", 32, 32)])
    out = tmp_path / "out"
    result = difflite("convert", "preset:tiny", "-o", out, "--components", "text_encoder", "--lora", str(path))
    _ok(result)
    assert "difflite: warning:" in result.stderr
    assert "1 of its 14 LoRA layers match no layer" in result.stderr and "unet 8/9, text_encoder 5/5" in result.stderr
    assert (out / "manifest.json").is_file()


@pytest.mark.parametrize("case", ["unrelated", "missing"])
def test_cli_bad_lora_exits_2_without_output(case, tmp_path):
    path = tmp_path / f"{case}.safetensors"
    if case == "unrelated":
        save_file({"model.layers.0.mlp.lora_A.weight": torch.zeros(4, 8),
                   "model.layers.0.mlp.lora_B.weight": torch.zeros(8, 4)}, str(path))
    out = tmp_path / "out"
    result = difflite("convert", "preset:tiny", "-o", out, "--components", "text_encoder", "--lora", f"{path}:0.5")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[difflite]")]
    assert len(lines) == 1 and lines[0].startswith("difflite: error: ") and str(path) in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_cli_convert_and_verify_with_a_diffusers_lora(base, tmp_path):
    """The diffusers/PEFT layout end to end, at a negative scale: converted, recorded, verified."""
    path = tmp_path / "peft.safetensors"
    write_diffusers(base, path)
    out = tmp_path / "out"
    _, record = convert_with_lora(path, -0.5, out)
    assert record["scale"] == -0.5 and record["format"] == "diffusers"
    assert record["layers"]["unet"] > 0 and record["layers"]["text_encoder"] > 0
    _ok(difflite("verify", out))
