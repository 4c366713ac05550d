"""Conv (2-D): CONV_2D or DEPTHWISE_CONV_2D on NHWC, SAME/VALID or an explicit PAD."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite import layout
from difflite.compiler.tflite.ops import attr, lowers


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """The (before, after) padding TFLite's SAME applies along one axis."""
    out = -(-size // stride)
    effective = (kernel - 1) * dilation + 1
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def conv_padding(ctx, node, in_hw, kernel, strides, dilations) -> tuple[str, list[int] | None]:
    """'SAME' or 'VALID', plus explicit [top, bottom, left, right] pads when neither fits
    exactly (e.g. stride 2 with pads 1,1: SAME would pad 0 before, 1 after)."""
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(in_hw, kernel, strides, dilations):
            before, after = same_padding(size, k, s, d)
            pads.append((after, before) if auto_pad == "SAME_LOWER" else (before, after))
    elif auto_pad == "VALID":
        pads = [(0, 0), (0, 0)]
    else:
        p = list(attr(node, "pads", [0, 0, 0, 0]))
        pads = [(p[0], p[2]), (p[1], p[3])]
    if all(b == 0 and a == 0 for b, a in pads):
        return "VALID", None
    if all(tuple(pad) == same_padding(size, k, s, d)
           for pad, size, k, s, d in zip(pads, in_hw, kernel, strides, dilations)):
        return "SAME", None
    return "VALID", [pads[0][0], pads[0][1], pads[1][0], pads[1][1]]


def pad_nhwc(ctx, x_index: int, pads: list[int]) -> int:
    n, h, w, c = ctx.builder.shape_of(x_index)
    top, bottom, left, right = pads
    out = ctx.temp("pad", (n, h + top + bottom, w + left + right, c), ctx.builder.dtype_of(x_index))
    paddings = np.array([[0, 0], [top, bottom], [left, right], [0, 0]], np.int32)
    ctx.builder.op("PAD", [x_index, ctx.int_constant(paddings)], [out])
    return out


@lowers("Conv")
def lower_conv(ctx, node):
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    weights = ctx.const(w)
    if weights is None:
        raise ctx.unsupported("convolution weights must be constant")
    if weights.ndim != 4:
        raise ctx.unsupported(f"only 2-D convolutions are supported (weights {weights.shape})")
    out_ch, in_per_group, kh, kw = weights.shape
    group = attr(node, "group", 1)
    in_ch = ctx.shape(x)[1]
    strides = list(attr(node, "strides", [1, 1]))
    dilations = list(attr(node, "dilations", [1, 1]))
    padding, explicit = conv_padding(ctx, node, ctx.shape(x)[2:], (kh, kw), strides, dilations)
    xi = ctx.input(x, layout.NHWC)
    if explicit is not None:
        xi = pad_nhwc(ctx, xi, explicit)
    b = ctx.const(bias) if bias is not None else np.zeros(out_ch, np.float32)
    if b is None:
        raise ctx.unsupported("convolution bias must be constant")
    bias_index = ctx.constant(b.astype(np.float32), f"{w.name}/bias" if bias is None else bias.name)
    out = ctx.output(node.outputs[0], layout.NHWC)
    common = dict(padding=0 if padding == "SAME" else 1, strideH=strides[0], strideW=strides[1],
                  dilationHFactor=dilations[0], dilationWFactor=dilations[1])
    if group == 1:
        filt = ctx.weight(np.transpose(weights, (0, 2, 3, 1)), f"{w.name}/ohwi")
        ctx.builder.op("CONV_2D", [xi, filt, bias_index], [out], **common)
    elif group == in_ch and in_per_group == 1:
        filt = ctx.constant(np.transpose(weights, (1, 2, 3, 0)), f"{w.name}/1hwo")
        ctx.builder.op("DEPTHWISE_CONV_2D", [xi, filt, bias_index], [out],
                       depthMultiplier=out_ch // in_ch, **common)
    else:
        raise ctx.unsupported(f"grouped convolution (group={group}) is not supported")
