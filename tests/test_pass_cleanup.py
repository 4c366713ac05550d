"""The cleanup pass (difflite/passes/cleanup.py): constant folding, static shapes, what it must keep."""

from __future__ import annotations

from support import passes_helpers as H
from support.passes_helpers import apply

from difflite.passes import cleanup as cleanup_module


def test_cleanup_makes_legacy_export_static():
    module, args = H.transformer_block()
    model = apply(H.export(module, args, opset=17, dynamo=False))
    ops = {n.op_type for n in model.graph}
    assert not ops & {"Identity", "Cast", "Shape", "Constant", "Gather"}
    for node in model.graph:
        if node.op_type == "Reshape":
            assert node.inputs[1].const_value.numpy().tolist() == list(node.outputs[0].shape)
    assert not cleanup_module.non_static_values(model) and not cleanup_module.dynamic_shape_inputs(model)


def test_cleanup_drops_softmax_nan_guard():
    model = apply(H.export(*H.tiny_clip("sdpa")))
    assert not {n.op_type for n in model.graph} & {"IsNaN", "Where"}
