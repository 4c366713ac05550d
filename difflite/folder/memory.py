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


def _place_in_order(spans: dict[int, tuple[int, int]], sizes: dict[int, int], order: list[int]) -> int:
    """Each tensor in turn into the smallest buffer free for its lifetime that holds it, else the
    largest free one grown to it, else a new buffer: the buffers' bytes."""
    buffers: list[list] = []  # [size, spans of its tensors]
    for t in order:
        first, last = spans[t]
        free = [b for b in buffers if not any(a <= last and first <= z for a, z in b[1])]
        holds = [b for b in free if b[0] >= sizes[t]]
        if holds:
            chosen = min(holds, key=lambda b: b[0])
        elif free:
            chosen = max(free, key=lambda b: b[0])
            chosen[0] = sizes[t]
        else:
            chosen = [sizes[t], []]
            buffers.append(chosen)
        chosen[1].append((first, last))
    return sum(size for size, _ in buffers)


def shared_buffers_size(spans: dict[int, tuple[int, int]], sizes: dict[int, int]) -> int:
    """Whole buffers shared by tensors whose lifetimes do not meet (PlanSharedObjects in the OpenCL
    backend): the smaller of two greedy placements, tensors taken largest first (no buffer grows),
    or by breadth (the steps with the most live bytes first, each step's tensors largest first)."""
    by_size = sorted(spans, key=lambda t: (-sizes[t], spans[t][0]))
    steps = max((b for _, b in spans.values()), default=-1) + 1
    live = [0] * (steps + 1)
    for t, (a, b) in spans.items():
        live[max(a, 0)] += sizes[t]
        live[b + 1] -= sizes[t]
    for i in range(1, steps + 1):
        live[i] += live[i - 1]
    taken: set[int] = set()
    by_breadth: list[int] = []
    for step in sorted(range(steps), key=lambda i: -live[i]):
        if len(by_breadth) == len(spans):
            break
        for t in by_size:
            if t not in taken and max(spans[t][0], 0) <= step <= spans[t][1]:
                taken.add(t)
                by_breadth.append(t)
    return min(_place_in_order(spans, sizes, by_size), _place_in_order(spans, sizes, by_breadth))


def plan(summary: TFLiteSummary, alignment: int = 64) -> MemoryPlan:
    spans = lifetimes(summary)
    sizes = {t: tensor_bytes(summary, t, None, alignment) for t in spans}
    half = {t: tensor_bytes(summary, t, 2, alignment) for t in spans}
    return MemoryPlan(summary.weight_bytes, arena_size(spans, sizes), max(sizes.values(), default=0),
                      sum(sizes.values()), arena_size(spans, half),
                      shared_buffers_size(spans, sizes), shared_buffers_size(spans, half))
