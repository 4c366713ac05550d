"""Static memory plan of an emitted model: weights, and the arena the intermediates need when
each activation lives from the op that writes it to the last op that reads it and buffers are
placed greedily by size (largest first, lowest free offset), as GPU delegates plan them; and
the same lifetimes packed into whole shared buffers, as difflite's OpenCL backend allocates
them (no sub-buffers: custom_ops/README.md)."""

from __future__ import annotations

from dataclasses import dataclass

from difflite.folder.reader import TFLiteSummary

MB = 1024 * 1024


@dataclass
class MemoryPlan:
    weights_bytes: int
    arena_bytes: int        # planned intermediate memory (greedy placement by lifetime)
    largest_tensor_bytes: int
    naive_bytes: int        # every intermediate in its own buffer
    arena_fp16_bytes: int   # the same plan with float activations stored as float16 (GPU fp16)
    shared_bytes: int = 0       # whole buffers shared by lifetime (the OpenCL backend's plan)
    shared_fp16_bytes: int = 0

    def as_dict(self) -> dict:
        return {"weights_mb": round(self.weights_bytes / MB, 3),
                "intermediate_mb": round(self.arena_bytes / MB, 3),
                "intermediate_fp16_mb": round(self.arena_fp16_bytes / MB, 3),
                "shared_buffers_mb": round(self.shared_bytes / MB, 3),
                "shared_buffers_fp16_mb": round(self.shared_fp16_bytes / MB, 3),
                "largest_intermediate_mb": round(self.largest_tensor_bytes / MB, 3),
                "unplanned_intermediate_mb": round(self.naive_bytes / MB, 3)}


def lifetimes(summary: TFLiteSummary) -> dict[int, tuple[int, int]]:
    """tensor index -> (first op writing it, last op reading it) for computed tensors. Graph
    inputs live from the start, graph outputs to the end; ops on constants only are weights."""
    end = len(summary.ops)
    spans: dict[int, list[int]] = {t: [-1, -1] for t in summary.inputs}
    constant = {i for i, t in enumerate(summary.tensors) if t.constant}
    for i, op in enumerate(summary.ops):
        if op.inputs and all(t < 0 or t in constant for t in op.inputs):
            constant.update(op.outputs)  # e.g. DEQUANTIZE of fp16 weights: folded at load time
            continue
        for t in op.outputs:
            spans.setdefault(t, [i, i])
        for t in op.inputs:
            if t >= 0 and t in spans:
                spans[t][1] = max(spans[t][1], i)
    for t in summary.outputs:
        if t in spans:
            spans[t][1] = end
    return {t: (a, b) for t, (a, b) in spans.items()}


def tensor_bytes(summary: TFLiteSummary, index: int, float_bytes: int | None, alignment: int) -> int:
    tensor = summary.tensors[index]
    nbytes = tensor.nbytes
    if float_bytes is not None and tensor.dtype.startswith("float"):
        nbytes = nbytes // max(1, int(tensor.dtype[5:]) // 8) * float_bytes
    return -(-nbytes // alignment) * alignment


def arena_size(spans: dict[int, tuple[int, int]], sizes: dict[int, int]) -> int:
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    arena = 0
    for t in sorted(spans, key=lambda t: (-sizes[t], t)):
        first, last = spans[t]
        busy = sorted((off, off + size) for off, size, a, b in placed if a <= last and first <= b)
        offset = 0
        for lo, hi in busy:
            if offset + sizes[t] <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, sizes[t], first, last))
        arena = max(arena, offset + sizes[t])
    return arena


def shared_buffers_size(spans: dict[int, tuple[int, int]], sizes: dict[int, int]) -> int:
    """Largest first, each tensor into the smallest buffer none of whose tensors is alive at the
    same time, else a new buffer sized to it (PlanSharedObjects in the OpenCL backend)."""
    buffers: list[tuple[int, list[tuple[int, int]]]] = []  # (size, spans of its tensors)
    for t in sorted(spans, key=lambda t: (-sizes[t], spans[t][0])):
        first, last = spans[t]
        free = [i for i, (_, used) in enumerate(buffers)
                if not any(a <= last and first <= b for a, b in used)]
        if free:
            buffers[min(free, key=lambda i: buffers[i][0])][1].append((first, last))
        else:
            buffers.append((sizes[t], [(first, last)]))
    return sum(size for size, _ in buffers)


def plan(summary: TFLiteSummary, alignment: int = 64) -> MemoryPlan:
    spans = lifetimes(summary)
    sizes = {t: tensor_bytes(summary, t, None, alignment) for t in spans}
    half = {t: tensor_bytes(summary, t, 2, alignment) for t in spans}
    return MemoryPlan(summary.weight_bytes, arena_size(spans, sizes), max(sizes.values(), default=0),
                      sum(sizes.values()), arena_size(spans, half),
                      shared_buffers_size(spans, sizes), shared_buffers_size(spans, half))
