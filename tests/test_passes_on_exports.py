"""Every pass on real tiny exports: all candidates fused, match counts against the independent census (difflite/passes/census.py) and the torch modules, cleanup static."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from support import passes_helpers as H
from support.passes_helpers import ALL_FUSIONS, TOLERANCE

from difflite.passes import census, run_passes
from difflite.passes import cleanup as cleanup_module
from difflite.passes.cleanup import cleanup

TINY_HEIGHT, TINY_WIDTH, TINY_BATCH = 48, 32, 2  # non-square; the batch applies to the UNet


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from difflite.compiler.export import COMPONENTS, component_spec, export_onnx
    from difflite.compiler.models import load_pipeline

    pipe = load_pipeline("preset:tiny")
    folder = tmp_path_factory.mktemp("tiny_onnx")
    paths = {name: export_onnx(component_spec(pipe, name, TINY_HEIGHT, TINY_WIDTH, TINY_BATCH),
                               folder / f"{name}.onnx")
             for name in COMPONENTS}
    modules = {"text_encoder": pipe.text_encoder, "unet": pipe.unet,
               "vae_decoder": pipe.vae.decoder, "vae_encoder": pipe.vae.encoder}
    return paths, modules


@pytest.mark.parametrize("component", ["text_encoder", "unet", "vae_decoder", "vae_encoder"])
def test_tiny_component_all_candidates_fused(tiny, component):
    paths, modules = tiny
    model = ir.load(str(paths[component]))
    before = H.snapshot(model)
    counts = run_passes(model, ALL_FUSIONS | {"winograd"})
    for kind, count in counts.items():
        if kind == "winograd":  # selective by design: chosen by a cost model, not all candidates
            continue
        assert count["matched"] == count["candidates"], (component, kind, counts)
    expected = H.module_census(modules[component])
    for kind in ("gelu", "geglu", "groupnorm", "layernorm", "attention"):
        assert counts[kind]["candidates"] == expected[kind], (component, kind, counts, expected)
    assert set(counts) == {*census.KINDS, "winograd"}
    assert cleanup_module.non_static_values(model) == []
    assert H.relative_error(before, H.snapshot(model)) <= TOLERANCE


def test_tiny_unet_counts_and_partial_fusion(tiny):
    paths, modules = tiny
    model = ir.load(str(paths["unet"]))
    counts = run_passes(model, {"groupnorm", "winograd"})
    assert counts["groupnorm"]["matched"] == H.module_census(modules["unet"])["groupnorm"] > 0
    assert counts["groupnorm_silu"]["matched"] == counts["groupnorm_silu"]["candidates"] > 0
    assert counts["attention"] == {"matched": 0, "candidates": H.module_census(modules["unet"])["attention"]}
    assert counts["layernorm"] == {"matched": 0, "candidates": H.module_census(modules["unet"])["layernorm"]}
    assert counts["layernorm"]["candidates"] > 0
    assert counts["geglu"]["matched"] == 0 < counts["geglu"]["candidates"]
    with pytest.raises(ValueError):
        run_passes(model, {"flash"})


@pytest.mark.parametrize("component", ["text_encoder", "unet", "vae_decoder", "vae_encoder"])
def test_tiny_component_cleanup_is_static(tiny, component):
    model = ir.load(str(tiny[0][component]))
    stats = cleanup(model)
    assert stats["non_static"] == [] and stats["dynamic_inputs"] == []
