"""Run-time LoRA files (difflite/runtime/lora_files.py): every layout read into factors whose
W + up @ down is the weight `convert --lora` merges (compiler/lora.py through diffusers, on copies of
the tiny preset's UNet and text encoder), at scales 1, 0.7, -0.3 and 0; several files combined; and
every refusal, one line naming the file."""

from __future__ import annotations

import copy
import json
import os
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from difflite.compiler.lora import merge_loras
from difflite.compiler.models import load_pipeline
from difflite.core.errors import BadInput
from difflite.core.lora import LoraSpec
from difflite.runtime.lora_files import MAX_HEADER_BYTES, Factors, combine, read_lora

from support.lora_files import (
    ATTN,
    DIFFUSERS,
    KOHYA_SLOTS,
    METADATA,
    UP_ATTN,
    kohya_key,
    slots_of,
    write_diffusers,
    write_kohya,
)

SCALES = (1.0, 0.7, -0.3, 0.0)
COMPONENTS = ("unet", "text_encoder")


@pytest.fixture(scope="module")
def base():
    """The tiny preset as loaded; merges go into copies of it."""
    return load_pipeline("preset:tiny")


@pytest.fixture(scope="module")
def slots(base):
    return slots_of(base)


def merge(base, specs):
    """What load_pipeline("preset:tiny", loras=specs) does after loading, on copies of the base's
    UNet and text encoder: merge_loras (test_merge_through_load_pipeline_is_the_same checks it)."""
    pipe = SimpleNamespace(unet=copy.deepcopy(base.unet), text_encoder=copy.deepcopy(base.text_encoder),
                           details={}, source_hash=base.source_hash, family=base.family)
    merge_loras(pipe, tuple(specs))
    return pipe


def weights(pipe, slots):
    """{(component, module): float64 [N, K] weight} of every slot of `pipe`."""
    modules = {c: dict(getattr(pipe, c).named_modules()) for c in COMPONENTS}
    out = {}
    for slot in slots:
        name = slot.module if slot.component == "unet" else slot.module.removeprefix("text_model.")
        if name not in modules[slot.component]:  # transformers 4 keeps text_model. in the names
            name = slot.module
        w = modules[slot.component][name].weight.detach().double()
        out[slot.component, slot.module] = w.reshape(slot.out_features, slot.in_features)
    return out


def assert_applies_like_merging(base, slots, factors, merged):
    """W + up @ down (float64) of every slot with factors is the merged weight at float32 precision;
    every other slot is unchanged."""
    before, after = weights(base, slots), weights(merged, slots)
    assert set(factors) <= set(before)
    for key, w in before.items():
        if key not in factors:
            assert torch.equal(after[key], w), f"{key}: merged but no factors"
            continue
        f = factors[key]
        assert f.down.dtype == np.float32 and f.up.dtype == np.float32
        assert f.down.shape == (f.rank, w.shape[1]) and f.up.shape == (w.shape[0], f.rank), key
        expected = w + torch.from_numpy(f.up.astype(np.float64) @ f.down.astype(np.float64))
        torch.testing.assert_close(after[key], expected, rtol=1e-6, atol=1e-6,
                                   msg=lambda m, key=key: f"{key}: {m}")


def _write(base, layout, path):
    """One LoRA file of `layout` for the tiny preset (only layers that take run-time slots)."""
    if layout == "kohya":
        write_kohya(base, path, layers=KOHYA_SLOTS)
    elif layout == "kohya_bf16":
        write_kohya(base, path, layers=KOHYA_SLOTS, dtype=torch.bfloat16)
    elif layout == "kohya_te1_bundle":  # lora_te1_ names, float32, a bundled embedding set aside
        write_kohya(base, path, layers=KOHYA_SLOTS, dtype=torch.float32)
        tensors = {k.replace("lora_te_", "lora_te1_"): v for k, v in load_file(str(path)).items()}
        tensors["bundle_emb.style.string_to_param.*"] = torch.zeros(1, 32)
        save_file(tensors, str(path))
    elif layout == "kohya_te_flat":  # text-encoder names without text_model_ (transformers 5's)
        write_kohya(base, path, layers=KOHYA_SLOTS)
        save_file({k.replace("lora_te_text_model_", "lora_te_"): v for k, v in load_file(str(path)).items()},
                  str(path))
    elif layout == "peft_metadata":
        write_diffusers(base, path, metadata=METADATA)
    elif layout == "peft_f16_rslora":  # one rank per component, rsLoRA's alpha / sqrt(r)
        layers = [layer if layer[2] == 4 else (*layer[:2], 4) for layer in DIFFUSERS]
        meta = {"unet.r": 4, "unet.lora_alpha": 3, "unet.use_rslora": True, "text_encoder.r": 4,
                "text_encoder.lora_alpha": 5, "text_encoder.use_rslora": True,
                "unet.target_modules": METADATA["unet.target_modules"],
                "text_encoder.target_modules": METADATA["text_encoder.target_modules"]}
        write_diffusers(base, path, layers=layers, metadata=meta, dtype=torch.float16)
    else:
        write_diffusers(base, path, style=layout)
    return path


LAYOUTS = ["kohya", "kohya_bf16", "kohya_te1_bundle", "kohya_te_flat", "peft", "peft_metadata", "peft_f16_rslora", "flat", "old",
           "processor"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_factors_apply_as_convert_merges(layout, base, slots, tmp_path):
    path = _write(base, layout, tmp_path / f"{layout}.safetensors")
    for scale in SCALES:
        factors = read_lora(LoraSpec(str(path), scale), slots)
        assert factors, layout
        if scale == 0:  # a product of exactly zero: the caller may skip it
            assert all(not np.any(f.up @ f.down) for f in factors.values())
        merged = merge(base, [LoraSpec(str(path), scale)])
        counts = merged.details["loras"][0]["layers"]
        assert len(factors) == counts["unet"] + counts["text_encoder"], (layout, scale)
        assert_applies_like_merging(base, slots, factors, merged)


def test_every_layer_of_the_files_is_read(base, slots, tmp_path):
    """Which layers come back, by name, and the kohya factor alpha / rank in down, the scale in up."""
    path = _write(base, "kohya", tmp_path / "k.safetensors")
    factors = read_lora(LoraSpec(str(path), 0.5), slots)
    want = {(c, m if c == "unet" else f"text_model.{m}") for c, m, *_ in KOHYA_SLOTS}
    assert set(factors) == want
    tensors = load_file(str(path))
    key = kohya_key("unet", f"{ATTN}.attn1.to_k")  # rank 4, alpha 2
    f = factors["unet", f"{ATTN}.attn1.to_k"]
    np.testing.assert_array_equal(f.down, (tensors[f"{key}.lora_down.weight"].double().numpy() * 0.5).astype(np.float32))
    np.testing.assert_array_equal(f.up, (tensors[f"{key}.lora_up.weight"].double().numpy() * 0.5).astype(np.float32))
    conv = factors["unet", "down_blocks.0.attentions.0.proj_in"]
    assert conv.down.shape == (4, 32) and conv.up.shape == (32, 4)

    peft = _write(base, "peft", tmp_path / "p.safetensors")
    want = {(c, m if c == "unet" else f"text_model.{m}") for c, m, _ in DIFFUSERS}
    for style in ("flat", "old", "processor"):
        assert set(read_lora(LoraSpec(str(_write(base, style, tmp_path / f"{style}.safetensors"))), slots)) == want
    assert set(read_lora(LoraSpec(str(peft)), slots)) == want


def test_merge_through_load_pipeline_is_the_same(base, slots, tmp_path):
    """The merge helper above is what `convert --lora` does: load_pipeline with the LoRA."""
    path = _write(base, "peft_metadata", tmp_path / "p.safetensors")
    spec = LoraSpec(str(path), 0.7)
    loaded = load_pipeline("preset:tiny", loras=(spec,))
    ours = weights(merge(base, [spec]), slots)
    for key, w in weights(loaded, slots).items():
        assert torch.equal(w, ours[key]), key
    assert_applies_like_merging(base, slots, read_lora(spec, slots), loaded)


def test_two_files_combined_are_both_merged(base, slots, tmp_path):
    kohya = _write(base, "kohya", tmp_path / "a.safetensors")
    peft = _write(base, "peft_metadata", tmp_path / "b.safetensors")
    specs = [LoraSpec(str(kohya), 0.7), LoraSpec(str(peft), -0.3)]
    per_file = [read_lora(spec, slots) for spec in specs]
    both = combine(per_file, max_rank=8)
    assert set(both) == set(per_file[0]) | set(per_file[1])
    shared = ("unet", f"{ATTN}.attn1.to_q")  # in both files, rank 4 each
    assert both[shared].rank == 8
    np.testing.assert_array_equal(both[shared].down[:4], per_file[0][shared].down)
    np.testing.assert_array_equal(both[shared].up[:, 4:], per_file[1][shared].up)
    assert_applies_like_merging(base, slots, both, merge(base, specs))
    # one file: its own factors
    assert {k: (f.down.tolist(), f.up.tolist()) for k, f in combine(per_file[:1]).items()} == \
        {k: (f.down.tolist(), f.up.tolist()) for k, f in per_file[0].items()}


def test_combined_rank_above_the_folders_is_refused(base, slots, tmp_path):
    first = _write(base, "peft", tmp_path / "a.safetensors")
    second = tmp_path / "b.safetensors"
    write_diffusers(base, second, seed=3)
    per_file = [read_lora(LoraSpec(str(p)), slots, max_rank=4) for p in (first, second)]
    assert len(combine(per_file, max_rank=8)) == len(DIFFUSERS)
    with pytest.raises(BadInput, match=rf"{first}, {second}: together they give layer text_encoder\.text_model\."
                                       r"encoder\.layers\.0\.self_attn\.q_proj rank 8 \(4 \+ 4\), more than the 7 "
                                       r"this folder's LoRA slots take"):
        combine(per_file, max_rank=7, names=[str(first), str(second)])
    with pytest.raises(BadInput, match=r"the 2 LoRAs: together they give layer .* rank 8"):
        combine(per_file, max_rank=7)


# ---------------------------------------------------------------------------------------------
# Refusals: one line naming the file, and nothing returned


def _bad(path, match, slots, max_rank=None, scale=1.0):
    with pytest.raises(BadInput, match=match) as info:
        read_lora(LoraSpec(str(path), scale), slots, max_rank=max_rank)
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message
    return message


def _header_file(path, header: bytes, data: bytes = b"", length: int | None = None):
    path.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header + data)
    return path


def test_files_that_are_not_safetensors(base, slots, tmp_path):
    _bad(tmp_path / "missing.safetensors", "no such LoRA file", slots)
    _bad(tmp_path, "a folder, not a .safetensors LoRA file", slots)
    os.mkfifo(tmp_path / "fifo.safetensors")  # opening it would wait for a writer
    _bad(tmp_path / "fifo.safetensors", "not a regular file", slots)
    pickled = tmp_path / "pickled.ckpt"
    pickled.write_bytes(pickle.dumps({"lora_unet_x.lora_down.weight": [0.0] * 4}))
    _bad(pickled, r"not a \.safetensors file \(a Python pickle.*\); LoRAs are read from \.safetensors only", slots)
    zipped = tmp_path / "zipped.pt"
    torch.save({"lora_unet_x.lora_down.weight": torch.zeros(1)}, zipped)
    _bad(zipped, r"not a \.safetensors file \(a zip archive", slots)
    (tmp_path / "short.safetensors").write_bytes(b"\x02\x00")
    _bad(tmp_path / "short.safetensors", r"not a \.safetensors file \(2 bytes, too short", slots)
    garbage = _header_file(tmp_path / "garbage.safetensors", b"{nope")
    _bad(garbage, r"not a \.safetensors file \(header: not valid JSON", slots)
    _bad(_header_file(tmp_path / "text.safetensors", b"hello"), r"not a \.safetensors file \(its first bytes", slots)
    _bad(_header_file(tmp_path / "list.safetensors", b"[1, 2]"), "its header is a JSON list, not an object", slots)
    _bad(_header_file(tmp_path / "huge.safetensors", b"{}", length=MAX_HEADER_BYTES + 1),
         rf"its safetensors header says {MAX_HEADER_BYTES + 1} bytes, more than difflite reads", slots)
    _bad(_header_file(tmp_path / "empty.safetensors", b"{}"), "the LoRA file holds no tensors", slots)
    meta = _header_file(tmp_path / "meta.safetensors", b'{"__metadata__": {"a": 1}}')
    _bad(meta, "its __metadata__ is not an object of strings", slots)
    entry = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}'
    _bad(_header_file(tmp_path / "size.safetensors", entry, bytes(4)), r"F32 \(2,\) is 8 bytes, its offsets span 4",
         slots)
    entry = b'{"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}'
    _bad(_header_file(tmp_path / "dtype.safetensors", entry, bytes(1)), r'dtype "Q7", which safetensors does not define',
         slots)
    overlap = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ' \
              b'"b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}'
    _bad(_header_file(tmp_path / "overlap.safetensors", overlap, bytes(8)), "tensor b's bytes start at 2", slots)
    newline = b'{"a\\nb": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    _bad(_header_file(tmp_path / "newline.safetensors", newline, bytes(4)), "a tensor name of 3 characters, or with "
         "control characters", slots)


def test_truncated_files(base, slots, tmp_path):
    path = _write(base, "kohya", tmp_path / "whole.safetensors")
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-3])
    _bad(cut, rf"truncated: its tensors need {len(data) - 8 - length} bytes after the header but the file has "
              rf"{len(data) - 8 - length - 3}", slots)
    cut.write_bytes(data[:8 + length // 2])
    _bad(cut, rf"truncated: its safetensors header says {length} bytes but only {length // 2} follow", slots)
    longer = tmp_path / "longer.safetensors"
    longer.write_bytes(data + b"\0")
    _bad(longer, r"not a \.safetensors file \(1 bytes after its last tensor\)", slots)


def test_values_and_dtypes(base, slots, tmp_path):
    key = kohya_key("unet", f"{ATTN}.attn1.to_q")
    down, up = torch.full((4, 32), 0.1), torch.full((32, 4), 0.1)
    cases = {
        "nan": ({f"{key}.lora_down.weight": down.clone().index_fill_(1, torch.tensor([3]), float("nan")),
                 f"{key}.lora_up.weight": up}, rf"tensor {key}\.lora_down\.weight holds NaN or infinite values"),
        "inf_bf16": ({f"{key}.lora_down.weight": down.bfloat16(),
                      f"{key}.lora_up.weight": up.bfloat16().index_fill_(0, torch.tensor([0]), float("inf"))},
                     rf"tensor {key}\.lora_up\.weight holds NaN or infinite values"),
        "inf_alpha": ({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up,
                       f"{key}.alpha": torch.tensor(float("inf"))}, r"\.alpha holds NaN or infinite values"),
        "f64_overflow": ({f"{key}.lora_down.weight": down.double() * 1e300, f"{key}.lora_up.weight": up},
                         r"lora_down\.weight holds values beyond float32's range"),
        "int": ({f"{key}.lora_down.weight": torch.ones(4, 32, dtype=torch.int32), f"{key}.lora_up.weight": up},
                r"lora_down\.weight is I32; LoRA weights are read in float16, bfloat16, float32 or float64"),
        "alpha_shape": ({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up,
                         f"{key}.alpha": torch.ones(2)}, r"\.alpha has shape \(2,\), expected a scalar"),
    }
    for name, (tensors, match) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        _bad(path, match, slots)
    # an integer alpha is a number like any other (alpha 2 over rank 4)
    path = tmp_path / "int_alpha.safetensors"
    save_file({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up, f"{key}.alpha": torch.tensor(2)},
              str(path))
    [f] = read_lora(LoraSpec(str(path)), slots).values()
    np.testing.assert_array_equal(f.down, np.full((4, 32), np.float32(0.1) * 0.5, np.float32))
    _bad(path, r"LoRA scale nan must be a finite number", slots, scale=float("nan"))


def test_lora_variants_are_refused(base, slots, tmp_path):
    key = kohya_key("unet", f"{ATTN}.attn1.to_q")
    peft = f"unet.{ATTN}.attn1.to_q"
    pair = {f"{key}.lora_down.weight": torch.zeros(4, 32), f"{key}.lora_up.weight": torch.zeros(32, 4)}
    peft_pair = {f"{peft}.lora_A.weight": torch.zeros(4, 32), f"{peft}.lora_B.weight": torch.zeros(32, 4)}
    cases = {
        "dora": ({**pair, f"{key}.dora_scale": torch.ones(1, 32)}, r"dora_scale is not plain LoRA \(DoRA"),
        "dora_peft": ({**peft_pair, f"{peft}.lora_magnitude_vector": torch.ones(32)}, r"not plain LoRA \(DoRA"),
        "bias": ({**peft_pair, f"{peft}.lora_B.bias": torch.ones(32)}, r"not plain LoRA \(a LoRA bias"),
        "loha": ({f"{key}.hada_w1_a": torch.zeros(32, 4), f"{key}.hada_w1_b": torch.zeros(4, 32)},
                 r"hada_w1_a is not plain LoRA \(LoHa"),
        "lokr": ({f"{key}.lokr_w1": torch.zeros(4, 4), f"{key}.lokr_w2": torch.zeros(8, 8)}, r"not plain LoRA \(LoKr"),
        "tucker": ({**pair, f"{key}.lora_mid.weight": torch.zeros(4, 4, 3, 3)},
                   r"lora_mid\.weight is not a kohya LoRA weight"),
        "no_up": ({f"{key}.lora_down.weight": torch.zeros(4, 32), f"{key}.alpha": torch.tensor(4.0)},
                  rf"LoRA layer {key} needs both down and up weights \(has alpha, lora_down\.weight\)"),
        "peft_no_b": ({f"{peft}.lora_A.weight": torch.zeros(4, 32)}, rf"layer {peft} needs both down and up"),
        "peft_alpha": ({**peft_pair, f"{peft}.alpha": torch.tensor(4.0)}, rf"tensor {peft}\.alpha is not understood"),
        "peft_adapter": ({f"{peft}.lora_A.default.weight": torch.zeros(4, 32)}, "is not understood"),
        "twice": ({**peft_pair, f"unet.{ATTN}.attn1.processor.to_q_lora.down.weight": torch.zeros(4, 32)},
                  r"are both the down weight of layer"),
    }
    for name, (tensors, match) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        _bad(path, match, slots)


def test_shapes_of_another_architecture(base, slots, tmp_path):
    to_k = f"{UP_ATTN}.attn2.to_k"  # cross-attention: K is the text encoder's width
    sd2 = tmp_path / "sd2.safetensors"  # as an SD 2.x LoRA's 1024 on SD 1.5's 768
    save_file({f"unet.{to_k}.lora_A.weight": torch.zeros(4, 64), f"unet.{to_k}.lora_B.weight": torch.zeros(32, 4)},
              str(sd2))
    _bad(sd2, rf"layer unet\.{to_k} is 64 -> 32 in the file but 32 -> 32 in this model: a LoRA for another "
              r"architecture\?", slots)
    proj_in = kohya_key("unet", "down_blocks.0.attentions.0.proj_in")  # SD 2.x: a Linear, here a 1x1 Conv2d
    linear = tmp_path / "linear_proj.safetensors"
    save_file({f"{proj_in}.lora_down.weight": torch.zeros(4, 32), f"{proj_in}.lora_up.weight": torch.zeros(32, 4)},
              str(linear))
    _bad(linear, rf"LoRA layer {proj_in} has down \(4, 32\) / up \(32, 4\), which do not fit this model's 1x1 Conv2d "
                 r"32 -> 32", slots)
    ranks = tmp_path / "ranks.safetensors"
    key = kohya_key("text_encoder", "encoder.layers.0.self_attn.q_proj")
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 32), f"{key}.lora_up.weight": torch.zeros(32, 2)}, str(ranks))
    _bad(ranks, r"has down \(4, 32\) / up \(32, 2\), which do not fit this model's Linear", slots)


def test_rank_above_the_folders(base, slots, tmp_path):
    path = _write(base, "kohya", tmp_path / "k.safetensors")
    _bad(path, r"LoRA layer lora_\w+ has rank 4, more than the 3 this folder's LoRA slots take", slots, max_rank=3)
    assert read_lora(LoraSpec(str(path)), slots, max_rank=8)
    _bad(path, r"LoRA layer lora_te_text_model_encoder_layers_0_self_attn_out_proj has rank 8, more than the 7", slots,
         max_rank=7)


def test_layers_without_a_slot(base, slots, tmp_path):
    locon = tmp_path / "locon.safetensors"
    write_kohya(base, locon)  # with its resnets' 3x3 convolutions
    _bad(locon, r"2 of its 13 LoRA layers have no run-time LoRA slot in this model \(e\.g\. "
                r"lora_unet_down_blocks_0_resnets_0_conv1\): run-time LoRAs take the UNet's attention, "
                r"feed-forward and proj_in/proj_out layers and the text encoder's attention and MLP layers only; "
                r"`difflite convert --lora` can merge this file instead", slots)
    time_emb = tmp_path / "time_emb.safetensors"
    name = "unet.down_blocks.0.resnets.0.time_emb_proj"
    tensors = load_file(str(_write(base, "peft", tmp_path / "p.safetensors")))
    save_file({**tensors, f"{name}.lora_A.weight": torch.zeros(4, 128), f"{name}.lora_B.weight": torch.zeros(32, 4)},
              str(time_emb))
    _bad(time_emb, rf"1 of its 11 LoRA layers have no run-time LoRA slot in this model \(e\.g\. {name}\)", slots)

    # a text encoder without slots in this folder: the text-encoder layers are refused, not dropped
    unet_only = [s for s in slots if s.component == "unet"]
    kohya = _write(base, "kohya", tmp_path / "k.safetensors")
    _bad(kohya, r"6 of its 16 LoRA layers are for the text encoder, which has no LoRA slots in this folder",
         unet_only)


def test_layers_of_another_model(base, slots, tmp_path):
    sdxl = tmp_path / "sdxl.safetensors"  # SDXL's second text encoder
    write_kohya(base, sdxl, layers=KOHYA_SLOTS,
                extra=[("lora_te2_text_model_encoder_layers_0_self_attn_q_proj", 32, 32)])
    _bad(sdxl, r"1 of its 17 LoRA layers match no layer of this model that takes a LoRA at run time \(e\.g\. "
               r"lora_te2_text_model_encoder_layers_0_self_attn_q_proj; text_encoder_2 is SDXL's second text "
               r"encoder\): a LoRA for another architecture\?", slots)
    deeper = tmp_path / "deeper.safetensors"  # a transformer block this UNet does not have
    tensors = load_file(str(_write(base, "peft", tmp_path / "p.safetensors")))
    name = "unet.down_blocks.0.attentions.0.transformer_blocks.1.attn1.to_q"
    save_file({**tensors, f"{name}.lora_A.weight": torch.zeros(4, 32), f"{name}.lora_B.weight": torch.zeros(32, 4)},
              str(deeper))
    _bad(deeper, rf"1 of its 11 LoRA layers match no layer .* \(e\.g\. {name}\)", slots)
    peft_te2 = tmp_path / "peft_te2.safetensors"
    save_file({**tensors, "text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32),
               "text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4)},
              str(peft_te2))
    _bad(peft_te2, r"1 of its 11 LoRA layers match no layer .*text_encoder_2 is SDXL's", slots)

    ldm = tmp_path / "ldm.safetensors"  # A1111 names of the original LDM UNet
    key = "lora_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q"
    save_file({f"{key}.lora_down.weight": torch.zeros(4, 32), f"{key}.lora_up.weight": torch.zeros(32, 4)}, str(ldm))
    _bad(ldm, r"none of its 1 LoRA layers matches a layer of this model that takes a LoRA at run time \(keys look "
              rf"like '{key}\.lora_down\.weight', '{key}\.lora_up\.weight'; UNet layers under the original LDM names",
         slots)
    unrelated = tmp_path / "unrelated.safetensors"
    save_file({"model.layers.0.mlp.lora_A.weight": torch.zeros(4, 8),
               "model.layers.0.mlp.lora_B.weight": torch.zeros(8, 4)}, str(unrelated))
    _bad(unrelated, r"none of its 1 LoRA layers matches .* \(keys look like 'model\.layers\.0\.mlp\.lora_A\.weight', "
                    r"'model\.layers\.0\.mlp\.lora_B\.weight'\); is it a LoRA for Stable Diffusion 1\.x/2\.x\?", slots)
    embedding = tmp_path / "embedding.safetensors"  # a textual inversion, no LoRA at all
    save_file({"emb_params": torch.zeros(2, 32)}, str(embedding))
    _bad(embedding, r"none of its tensors is a LoRA layer \(keys look like 'emb_params'\)", slots)


def test_peft_metadata(base, slots, tmp_path):
    cases = {
        "not_json": ("{nope", r"its lora_adapter_metadata: not valid JSON"),
        "not_object": ("[1]", r"its lora_adapter_metadata is not a JSON object"),
        "rank": (json.dumps({**METADATA, "text_encoder.r": 8}),
                 r"gives layer text_encoder\.text_model\.encoder\.layers\.\d\.self_attn\.\w+ rank 8, its weights rank 4"),
        "r_type": (json.dumps({**METADATA, "unet.r": 4.0}), r"lora_adapter_metadata's unet\.r is 4\.0, not a positive"),
        "alpha_type": (json.dumps({**METADATA, "unet.lora_alpha": "8"}), r'unet\.lora_alpha is "8", not a finite number'),
        "dora": (json.dumps({**METADATA, "unet.use_dora": True}), r"unet\.use_dora is set: DoRA is not plain LoRA"),
        "many": (json.dumps({**METADATA, "unet.rank_pattern": {f"m{i}": 4 for i in range(4097)}}),
                 r"unet\.rank_pattern has 4097 entries, more than difflite reads \(4096\)"),
        "regex": (json.dumps({**METADATA, "unet.alpha_pattern": {"(a+)+$": 1}}),
                  r'unet\.alpha_pattern key "\(a\+\)\+\$" is a regular expression difflite does not evaluate'),
    }
    for name, (metadata, match) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        write_diffusers(base, path)
        save_file(load_file(str(path)), str(path), metadata={"lora_adapter_metadata": metadata})
        _bad(path, match, slots)


def test_pattern_keys_match_as_peft_matches_them(base, slots, tmp_path):
    """rank_pattern / alpha_pattern keys: a full module name or a suffix at a dot, the first key that
    matches wins (PEFT's get_pattern_key); short keys as files in the wild have them."""
    meta = {**METADATA, "unet.rank_pattern": {"attn2.to_out.0": 2},
            "unet.alpha_pattern": {"to_out.0": 1, "to_q": 2, f"{UP_ATTN}.attn2.to_q": 16},
            "text_encoder.alpha_pattern": {"layers.1.self_attn.k_proj": 12}}
    path = tmp_path / "patterns.safetensors"
    write_diffusers(base, path, metadata=meta)
    factors = read_lora(LoraSpec(str(path), 0.7), slots)
    assert_applies_like_merging(base, slots, factors, merge(base, [LoraSpec(str(path), 0.7)]))
    tensors = load_file(str(path))
    # "to_q" comes before the full name: it wins for every to_q (alpha 2 over rank 4)
    down = tensors[f"unet.{UP_ATTN}.attn2.to_q.lora_A.weight"].double().numpy()
    np.testing.assert_array_equal(factors["unet", f"{UP_ATTN}.attn2.to_q"].down, (down * 0.5).astype(np.float32))


def test_factors_type():
    f = Factors(np.zeros((3, 5), np.float32), np.zeros((7, 3), np.float32))
    assert f.rank == 3
