"""Resize: nearest (asymmetric, floor) and bilinear (half-pixel) upsampling on NHWC."""

from __future__ import annotations

from compiler.tflite import layout
from compiler.tflite.ops import attr, lowers


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


@lowers("Resize")
def lower_resize(ctx, node):
    x = node.inputs[0]
    in_shape, out_shape = ctx.shape(x), ctx.shape(node.outputs[0])
    if len(in_shape) != 4 or in_shape[:2] != out_shape[:2]:
        raise ctx.unsupported("only spatial resizes of 4-D tensors are supported")
    mode = text(attr(node, "mode", "nearest"))
    transform = text(attr(node, "coordinate_transformation_mode", "half_pixel"))
    size = ctx.int_constant(out_shape[2:])
    xi = ctx.input(x, layout.NHWC)
    out = ctx.output(node.outputs[0], layout.NHWC)
    if mode == "nearest":
        nearest = text(attr(node, "nearest_mode", "round_prefer_floor"))
        if transform == "asymmetric" and nearest == "floor":
            ctx.builder.op("RESIZE_NEAREST_NEIGHBOR", [xi, size], [out], alignCorners=False,
                           halfPixelCenters=False)
            return
    elif mode == "linear" and transform in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        ctx.builder.op("RESIZE_BILINEAR", [xi, size], [out], alignCorners=transform == "align_corners",
                       halfPixelCenters=transform in ("half_pixel", "pytorch_half_pixel"))
        return
    raise ctx.unsupported(f"Resize mode={mode} coordinate_transformation_mode={transform}")
