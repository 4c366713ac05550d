"""Layout bookkeeping between ONNX (channels first) and TFLite (channels last).

Every ONNX value is stored in TFLite as `onnx_value.transpose(perm)`; `perm` is chosen per value
as the graph is lowered. ONNX Transposes therefore cost nothing (they only change `perm`), and a
real TRANSPOSE is emitted only where an op needs its input in another order. Rank-4 activations
enter convolutions in NHWC = perm (0, 2, 3, 1)."""

from __future__ import annotations

import math

NHWC = (0, 2, 3, 1)


def identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def inverse(perm) -> tuple[int, ...]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def apply(shape, perm) -> tuple[int, ...]:
    return tuple(shape[p] for p in perm)


def relative(current, wanted) -> tuple[int, ...]:
    """TRANSPOSE permutation taking a tensor stored in `current` order to `wanted` order."""
    position = inverse(current)
    return tuple(position[w] for w in wanted)


def channels_last(rank: int) -> tuple[int, ...]:
    """Channels-first ONNX axis order (N, C, spatial...) stored channels last."""
    if rank < 3:
        return identity(rank)
    return (0, *range(2, rank), 1)


def transpose_is_reshape(shape, perm) -> bool:
    """True when transposing `shape` by `perm` keeps the order of the non-unit axes, so a
    RESHAPE (free) does the same job as a TRANSPOSE."""
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def reshape_blocks(src, dst):
    """Split a reshape from `src` to `dst` into blocks (src axes, dst axes) whose products match,
    each block a run of consecutive axes on both sides. Unit axes form their own blocks where
    possible. Returns None when no such split exists (only possible with zero-size dims)."""
    blocks = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and not (j < len(dst) and dst[j] == 1):
            blocks.append(((i,), ()))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and not (i < len(src) and src[i] == 1):
            blocks.append(((), (j,)))
            j += 1
            continue
        if i < len(src) and j < len(dst) and src[i] == 1 and dst[j] == 1:
            blocks.append(((i,), (j,)))
            i += 1
            j += 1
            continue
        si, dj = [i], [j]
        ps, pd = src[i], dst[j]
        i += 1
        j += 1
        while ps != pd:
            if ps < pd:
                if i >= len(src):
                    return None
                ps *= src[i]
                si.append(i)
                i += 1
            else:
                if j >= len(dst):
                    return None
                pd *= dst[j]
                dj.append(j)
                j += 1
        blocks.append((tuple(si), tuple(dj)))
    return blocks


def reshape_in_layout(src_shape, src_perm, dst_shape):
    """Find a layout for the reshape output such that the TFLite op is a plain RESHAPE of the
    stored input. Returns the output perm, or None when the input must first be transposed.

    Works when every block of the reshape keeps its source axes adjacent and in order in the
    stored layout: e.g. [N,C,H,W] stored NHWC reshaped to [N,C,H*W] stays [N,H*W,C]."""
    if math.prod(src_shape) != math.prod(dst_shape):
        return None
    blocks = reshape_blocks(tuple(src_shape), tuple(dst_shape))
    if blocks is None:
        return None
    block_of_src_axis = {}
    for b, (src_axes, _) in enumerate(blocks):
        for a in src_axes:
            block_of_src_axis[a] = b
    # Order the blocks as their source axes appear in the stored layout.
    order: list[int] = []
    position = 0
    stored = list(src_perm)
    while position < len(stored):
        b = block_of_src_axis[stored[position]]
        src_axes = blocks[b][0]
        if tuple(stored[position:position + len(src_axes)]) != src_axes:
            return None
        order.append(b)
        position += len(src_axes)
    # Blocks with no source axes (new unit dims) go right after their predecessor block.
    placed = set(order)
    for b, (src_axes, _) in enumerate(blocks):
        if b in placed:
            continue
        anchor = b - 1
        while anchor >= 0 and anchor not in placed:
            anchor -= 1
        at = order.index(anchor) + 1 if anchor >= 0 else 0
        order.insert(at, b)
        placed.add(b)
    return tuple(a for b in order for a in blocks[b][1])
