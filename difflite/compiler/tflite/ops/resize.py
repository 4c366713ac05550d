"""Resize of the two spatial axes of a 4-D tensor, exactly as ONNX samples.

ONNX's Resize is separable: along each spatial axis the output is a fixed matrix times the input
(one 1 per row for nearest; two taps for linear, four for cubic, more with antialias). The
lowering takes those matrices from ONNX's own reference implementation, run on a one-axis problem
of basis vectors with the node's attributes and scale, then writes:

- RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR when one of their flag settings samples exactly the
  same (checked against a model of the TFLite kernels' arithmetic, float32 for nearest): nearest
  asymmetric/floor, linear half_pixel, asymmetric, align_corners, with a scale of output/input;
- else GATHERs of the selected rows and columns (nearest, any mode and type), or the matrices as
  FULLY_CONNECTED weights (linear and cubic of float32 tensors, antialias included; float32 even
  at --precision fp16, so the weights are exact).

The sampling grid depends on the scale ONNX uses, not only on the shapes (a scale of 0.6 maps
4 -> 2 pixels with other coordinates than 0.5 does): computed scales are refused, computed sizes
are taken from the static output shape (the "stretch" policy only). Also refused: modes whose
samples are not a plain interpolation (tf_crop_and_resize, which fills outside the region of
interest), Resize before opset 11 (other attributes), other ranks."""

from __future__ import annotations

import math

import numpy as np

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.ops import attr, lowers

SPATIAL = (2, 3)
COPIED_ATTRIBUTES = ("mode", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                     "nearest_mode", "antialias")
REFERENCE_OPSET = 19
MAX_MATRIX_ELEMENTS = 1 << 22  # per axis: output length x input length (16 MiB of float32)
BUILTIN_TOLERANCE = 1e-6  # linear weights: the builtin's must equal the reference's this closely


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def node_opset(node) -> int | None:
    if node.version is not None:
        return node.version
    graph = node.graph
    return graph.opset_imports.get("", graph.opset_imports.get("ai.onnx")) if graph is not None else None


def spatial_scales(ctx, node, in_shape, out_shape) -> tuple[dict[int, float], str]:
    """{axis: the scale ONNX's coordinate transform uses} and where it comes from: "scales",
    "sizes" (output / input) or "policy" (keep_aspect_ratio_policy's common scale)."""
    inputs = list(node.inputs) + [None] * 4
    scales_value, sizes_value = inputs[2], inputs[3]
    axes = [a % 4 for a in attr(node, "axes", range(4))]
    scales = ctx.const(scales_value) if scales_value is not None else None
    if scales_value is not None and scales is None:
        raise ctx.unsupported("Resize scales must be constant (they set the sampling grid; only the "
                              "output shape is static)")
    if scales is not None and scales.size:
        full = dict.fromkeys(range(4), 1.0)
        full.update({a: float(s) for a, s in zip(axes, scales.reshape(-1))})
        return full, "scales"
    if sizes_value is None:
        raise ctx.unsupported("Resize without scales or sizes")
    policy = text(attr(node, "keep_aspect_ratio_policy", "stretch"))
    sizes = ctx.const(sizes_value)
    if sizes is None:
        if policy != "stretch":
            raise ctx.unsupported(f"Resize with computed sizes and keep_aspect_ratio_policy={policy}")
        sizes = [out_shape[a] for a in axes]  # stretch: the sizes are the output shape
    ratios = {a: int(s) / in_shape[a] for a, s in zip(axes, np.asarray(sizes).reshape(-1))}
    if policy != "stretch":
        common = (min if policy == "not_larger" else max)(ratios.values())
        ratios = dict.fromkeys(ratios, float(np.float32(common)))
    full = dict.fromkeys(range(4), 1.0)
    full.update(ratios)
    return full, "sizes" if policy == "stretch" else "policy"


def reference_matrix(node, length: int, out_length: int, scale: float, by_sizes: bool) -> np.ndarray:
    """[out_length, length]: ONNX's reference Resize of each basis vector along one axis (with
    the node's attributes and `scale`), column k the output for e_k."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    attributes = {name: node.attributes[name].value for name in COPIED_ATTRIBUTES
                  if name in node.attributes}
    if by_sizes:
        operands = ["x", "", "", "sizes"]
        feeds = {"sizes": np.array([length, 1, out_length, 1], np.int64)}
    else:
        operands = ["x", "", "scales"]
        feeds = {"scales": np.array([1.0, 1.0, scale, 1.0], np.float32)}
    resize = helper.make_node("Resize", operands, ["y"], **attributes)
    graph = helper.make_graph(
        [resize], "axis", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, None),
                           *[helper.make_tensor_value_info(n, TensorProto.INT64 if n == "sizes"
                                                           else TensorProto.FLOAT, None) for n in feeds]],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", REFERENCE_OPSET)])
    basis = np.eye(length, dtype=np.float64).reshape(length, 1, length, 1)
    (y,) = ReferenceEvaluator(model).run(None, {"x": basis, **feeds})
    return np.asarray(y).reshape(length, -1).T


def tflite_scale(length: int, out_length: int, align_corners: bool) -> np.float32:
    if align_corners and out_length > 1:
        return np.float32((length - 1) / (out_length - 1))
    return np.float32(length / out_length)


def tflite_nearest(length: int, out_length: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """The input index RESIZE_NEAREST_NEIGHBOR reads for each output index (float32 arithmetic)."""
    scale = tflite_scale(length, out_length, align_corners)
    offset = np.float32(0.5 if half_pixel else 0.0)
    position = ((np.arange(out_length, dtype=np.float32) + offset) * scale).astype(np.float64)
    index = np.floor(position + 0.5) if align_corners else np.floor(position)
    index = np.minimum(index, length - 1)
    return np.maximum(index, 0).astype(np.int64)


def tflite_bilinear(length: int, out_length: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """[out_length, length]: the weights RESIZE_BILINEAR gives each input along one axis."""
    scale = float(tflite_scale(length, out_length, align_corners))
    matrix = np.zeros((out_length, length))
    for i in range(out_length):
        position = (i + 0.5) * scale - 0.5 if half_pixel else i * scale
        low = max(math.floor(position), 0)
        high = min(math.ceil(position), length - 1)
        matrix[i, low] += 1.0 - (position - low)
        matrix[i, high] += position - low
    return matrix


BUILTIN_FLAGS = ((False, False), (False, True), (True, False))  # (align_corners, half_pixel_centers)


@lowers("Resize")
def lower_resize(ctx, node):
    x, out_value = node.inputs[0], node.outputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(out_value)
    if len(in_shape) != 4 or in_shape[:2] != out_shape[:2]:
        raise ctx.unsupported("only spatial resizes of 4-D tensors are supported")
    opset = node_opset(node)
    if opset is not None and opset < 11:
        raise ctx.unsupported(f"Resize of opset {opset} (before 11) is not supported")
    mode = text(attr(node, "mode", "nearest"))
    transform = text(attr(node, "coordinate_transformation_mode", "half_pixel"))
    if transform == "tf_crop_and_resize":
        raise ctx.unsupported("Resize coordinate_transformation_mode=tf_crop_and_resize (fills "
                              "outside the region of interest) is not supported")
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"Resize mode={mode}")
    scales, source = spatial_scales(ctx, node, in_shape, out_shape)
    if scales[0] != 1.0 or scales[1] != 1.0:
        raise ctx.unsupported("Resize scaling the batch or channel axis")
    matrices = {}
    for axis in SPATIAL:
        length, out_length = in_shape[axis], out_shape[axis]
        if out_length * length > MAX_MATRIX_ELEMENTS:
            raise ctx.unsupported(f"Resize of axis {axis} from {length} to {out_length}: the sampling "
                                  "matrix would exceed 4M elements")
        # One axis alone: sizes give the same scale (output / input); a scale must give the
        # output length as ONNX computes it from scales (a floor).
        by_sizes = source == "sizes"
        if not by_sizes and math.floor(length * scales[axis]) != out_length:
            raise ctx.unsupported(f"Resize output length {out_length} on axis {axis} is not "
                                  f"floor({length} x scale {scales[axis]:g})")
        matrix = reference_matrix(node, length, out_length, scales[axis], by_sizes)
        if matrix.shape != (out_length, length) or not np.allclose(matrix.sum(axis=1), 1.0, atol=1e-9):
            raise ctx.unsupported(f"Resize mode={mode} coordinate_transformation_mode={transform}: "
                                  "the samples are not an interpolation of the input")
        matrices[axis] = matrix
    if mode == "nearest":
        lower_nearest(ctx, x, out_value, matrices)
    else:
        lower_interpolating(ctx, x, out_value, matrices, mode)


def lower_nearest(ctx, x, out_value, matrices) -> None:
    rows = {}
    for axis, matrix in matrices.items():
        index = matrix.argmax(axis=1)
        if not np.array_equal(matrix, np.eye(matrix.shape[1])[index]):
            raise ctx.unsupported("Resize nearest: a sample is not one input element")
        rows[axis] = index
    xi = ctx.input(x, layout.NHWC)
    if ctx.dtype(x) == np.float32:
        for align, half in BUILTIN_FLAGS:
            if all(np.array_equal(tflite_nearest(matrices[a].shape[1], len(index), align, half), index)
                   for a, index in rows.items()):
                out = ctx.output(out_value, layout.NHWC)
                ctx.builder.op("RESIZE_NEAREST_NEIGHBOR", [xi, ctx.int_constant(ctx.shape(out_value)[2:])],
                               [out], alignCorners=align, halfPixelCenters=half)
                return
    # GATHER the rows, then the columns (an axis sampled as it is is left alone).
    steps = [(axis, index) for axis, index in rows.items()
             if not np.array_equal(index, np.arange(matrices[axis].shape[1]))]
    current = xi
    shape = list(ctx.builder.shape_of(xi))
    for i, (axis, index) in enumerate(steps):
        stored_axis = layout.NHWC.index(axis)
        shape[stored_axis] = len(index)
        last = i == len(steps) - 1
        target = ctx.output(out_value, layout.NHWC) if last else ctx.temp("rows", shape, ctx.builder.dtype_of(xi))
        ctx.builder.op("GATHER", [current, ctx.int_constant(index)], [target], axis=stored_axis)
        current = target
    if not steps:
        ctx.define(out_value, xi, layout.NHWC)


def lower_interpolating(ctx, x, out_value, matrices, mode: str) -> None:
    if ctx.dtype(x) != np.float32:
        raise ctx.unsupported(f"Resize mode={mode} of a {ctx.dtype(x)} tensor (float32 only)")
    if mode == "linear":
        for align, half in BUILTIN_FLAGS:
            if all(np.abs(tflite_bilinear(m.shape[1], m.shape[0], align, half) - m).max() <= BUILTIN_TOLERANCE
                   for m in matrices.values()):
                xi = ctx.input(x, layout.NHWC)
                out = ctx.output(out_value, layout.NHWC)
                ctx.builder.op("RESIZE_BILINEAR", [xi, ctx.int_constant(ctx.shape(out_value)[2:])], [out],
                               alignCorners=align, halfPixelCenters=half)
                return
    # The matrices as FULLY_CONNECTED weights, each contracting the stored last axis:
    # [N,H,C,W] -> (W) -> [N,H,C,W'] -> transpose -> [N,W',C,H] -> (H) -> [N,W',C,H'], which is
    # the output stored in layout (0, 3, 1, 2).
    n, c, h, w = ctx.shape(x)
    out_w = ctx.shape(out_value)[3]
    xi = ctx.input(x, (0, 2, 1, 3))
    if is_identity(matrices[2]):  # the rows stay: [N,H,C,W'] is the output in layout (0, 2, 1, 3)
        fully_connected(ctx, xi, matrices[3], ctx.output(out_value, (0, 2, 1, 3)), "resize_w")
        return
    along_w = xi
    if not is_identity(matrices[3]):
        along_w = ctx.temp("resize_w", (n, h, c, out_w))
        fully_connected(ctx, xi, matrices[3], along_w, "resize_w")
    swapped = ctx.temp("resize_wt", (n, out_w, c, h))
    ctx.builder.op("TRANSPOSE", [along_w, ctx.int_constant((0, 3, 2, 1))], [swapped])
    out = ctx.output(out_value, (0, 3, 1, 2))
    fully_connected(ctx, swapped, matrices[2], out, "resize_h")


def is_identity(matrix: np.ndarray) -> bool:
    return matrix.shape[0] == matrix.shape[1] and np.array_equal(matrix, np.eye(matrix.shape[0]))


def fully_connected(ctx, xi: int, matrix: np.ndarray, out: int, name: str) -> None:
    weight = ctx.builder.constant(ctx.unique_name(f"{ctx.node.outputs[0].name}/{name}"),
                                  np.ascontiguousarray(matrix, np.float32))
    ctx.builder.op("FULLY_CONNECTED", [xi, weight, -1], [out], keepNumDims=True)
