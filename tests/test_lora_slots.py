"""Run-time LoRA slots (convert --lora-slots / --lora-rank, passes/lora.py): which layers get a
slot, what the manifest and the files hold, and that a slot computes W x + b + U (D x): the
`--no-fuse` form on the stock TFLite interpreter (no op library: what an app on stock LiteRT
runs), against the tiny preset's PyTorch model with the same factors merged into its weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from difflite.compiler import export
from difflite.compiler.models import load_pipeline
from difflite.core import custom_ops, lora
from difflite.folder.output_folder import OutputFolder
from difflite.folder.reader import read_tflite

from support.cli import convert_side_by_side, run_difflite
from support.lora_files import slots_of

SIZE = 64
RANK = 6  # the --no-fuse folder's factor inputs
CONVERSIONS = {
    "fused": ["--lora-slots", "auto"],
    "nofuse": ["--lora-slots", "auto", "--no-fuse", "--lora-rank", str(RANK)],
    "none": ["--lora-slots", "none"],
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("lora_slots")
    out = {name: base / name for name in CONVERSIONS}
    convert_side_by_side({name: ["preset:tiny", *args, "-o", out[name], "--height", SIZE, "--width", SIZE,
                                 "--components", "text_encoder,unet", "--json"]
                          for name, args in CONVERSIONS.items()},
                         first=("fused",))  # the others reuse its exports (slots are added after the export)
    return out


@pytest.fixture(scope="module")
def pipe():
    return load_pipeline("preset:tiny")


def expected_slots(pipe, component: str) -> dict[str, tuple[int, int, bool]]:
    """Every module of the torch model that core.lora gives a slot: (K, N, 1x1 conv)."""
    return {s.module: (s.in_features, s.out_features, s.conv) for s in slots_of(pipe, (component,))}


@pytest.mark.parametrize("name", ["fused", "nofuse"])
def test_every_attention_and_feed_forward_layer_gets_a_slot(folders, pipe, name):
    folder = OutputFolder.read(folders[name])
    for component in ("unet", "text_encoder"):
        entry = folder.components[component]
        slots = entry.lora_slots
        assert slots.form == ("custom" if name == "fused" else "inputs")
        assert slots.max_rank == (RANK if name == "nofuse" else lora.DEFAULT_MAX_RANK["custom"])
        got = {s.module: (s.in_features, s.out_features, s.conv) for s in slots.slots}
        want = expected_slots(pipe, component)
        assert got == want
        # the tiny UNet: 3 transformers x (proj_in, 8 attention projections, 2 feed-forward, proj_out)
        assert len(got) == {"unet": 6 * 12, "text_encoder": 2 * 6}[component]
        ops = [op for op in read_tflite(entry.path).ops if op.name == custom_ops.LORA.custom_code]
        if name == "fused":
            assert sorted(op.custom_options["slot"] for op in ops) == list(range(len(got)))
            assert not any(lora.is_factor_input(spec.name) for spec in entry.inputs)
        else:
            assert not ops
            factor_inputs = [spec for spec in entry.inputs if lora.is_factor_input(spec.name)]
            assert len(factor_inputs) == 2 * len(got)


def test_no_slots_leave_the_files_as_before(folders):
    folder = OutputFolder.read(folders["none"])
    for entry in folder.components.values():
        assert entry.lora_slots is None
        assert custom_ops.LORA.custom_code not in entry.custom_ops
        assert not any(lora.is_factor_input(spec.name) for spec in entry.inputs)


def random_factors(slots, count: int, rank: int, seed: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Factors for `count` slots spread over the model, scaled so the LoRA moves the output visibly."""
    rng = np.random.default_rng(seed)
    chosen = np.linspace(0, len(slots) - 1, count).round().astype(int)
    out = {}
    for index in sorted(set(chosen.tolist())):
        s = slots[index]
        down = rng.standard_normal((rank, s.in_features)).astype(np.float32) / np.sqrt(s.in_features)
        up = rng.standard_normal((s.out_features, rank)).astype(np.float32) * 0.3
        out[s.slot] = (down, up)
    return out


def torch_outputs(pipe, component: str, merged: dict[str, np.ndarray]) -> np.ndarray:
    """The component's PyTorch output on export's example inputs, with `merged` (module -> U D)
    added to those modules' weights."""
    spec = export.component_spec(pipe, component, SIZE, SIZE)
    modules = dict(getattr(pipe, component).named_modules())
    saved = {}
    try:
        for module_name, delta in merged.items():
            name = module_name if module_name in modules else module_name.removeprefix("text_model.")
            weight = modules[name].weight
            saved[name] = weight.detach().clone()
            with torch.no_grad():
                weight += torch.from_numpy(delta).reshape(weight.shape)
        with torch.no_grad():
            return spec.module(*spec.example_inputs).numpy(), spec
    finally:
        with torch.no_grad():
            for name, weight in saved.items():
                modules[name].weight.copy_(weight)


def stock_interpreter_call(entry, feeds: dict) -> np.ndarray:
    """The file on ai_edge_litert's interpreter with no delegate at all (stock LiteRT)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(entry.path))
    interpreter.allocate_tensors()
    runner = interpreter.get_signature_runner("serving_default")
    outputs = runner(**feeds)
    return entry.from_file_layout(outputs)[entry.outputs[0].name]


@pytest.mark.parametrize("component", ["unet", "text_encoder"])
def test_no_fuse_factor_inputs_apply_a_lora_on_stock_litert(folders, pipe, component):
    from difflite.runtime.loras import SlotFactors

    entry = OutputFolder.read(folders["nofuse"]).components[component]
    slots = entry.lora_slots.slots
    factors = random_factors(slots, count=12, rank=RANK - 2, seed=3)
    state = SlotFactors(entry)
    zeros = dict(state.feeds())
    state.change(factors)
    merged = {slots[slot].module: up @ down for slot, (down, up) in factors.items()}
    for given, deltas in ((zeros, {}), (state.feeds(), merged)):
        want, spec = torch_outputs(pipe, component, deltas)
        feeds = entry.to_file_layout({n: t.numpy() for n, t in zip(spec.input_names, spec.example_inputs)})
        got = stock_interpreter_call(entry, {**feeds, **given})
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-4, f"{component} {'with' if deltas else 'without'} a LoRA: relative error {err:.2e}"
    base, _ = torch_outputs(pipe, component, {})
    lora_out, _ = torch_outputs(pipe, component, merged)
    assert np.abs(lora_out - base).max() > 100 * 1e-4 * np.abs(base).max()  # the LoRA changes the output


def test_bad_slot_options_exit_2_without_output(tmp_path):
    for args, said in ((["--lora-rank", "0"], "--lora-rank 0 must be from 1 to"),
                       (["--lora-rank", "5000"], "--lora-rank 5000 must be from 1 to"),
                       (["--lora-slots", "some"], "Invalid value for '--lora-slots'")):
        out = tmp_path / "out"
        result = run_difflite("convert", "preset:tiny", "-o", out, "--height", SIZE, "--width", SIZE, *args)
        assert result.returncode == 2, result.stderr
        assert said in result.stderr
        assert not out.exists()


def test_manifest_records_the_slots(folders):
    manifest = json.loads((folders["nofuse"] / "manifest.json").read_text())
    record = manifest["components"]["unet"]["lora_slots"]
    assert record["form"] == "inputs" and record["max_rank"] == RANK
    first = record["slots"][0]
    assert first == {"slot": 0, "module": "down_blocks.0.attentions.0.proj_in", "in_features": 32,
                     "out_features": 32, "conv": True}
    assert manifest["options"]["lora_slots"] == "auto" and manifest["options"]["lora_rank"] == RANK
