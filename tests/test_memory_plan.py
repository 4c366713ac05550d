"""The static memory plan (difflite/folder/memory.py): offsets in one arena, and whole buffers shared by
lifetime (what the OpenCL backend allocates)."""

from __future__ import annotations

import numpy as np

from difflite.compiler.tflite.builder import ModelBuilder
from difflite.folder import memory
from difflite.folder.reader import read_tflite


def test_offsets_pack_tighter_than_shared_buffers():
    # A lives alone at step 0; B and C live together at step 1, each half of A's size.
    spans = {0: (0, 0), 1: (1, 1), 2: (1, 1)}
    sizes = {0: 100, 1: 50, 2: 50}
    assert memory.arena_size(spans, sizes) == 100           # B and C share A's bytes
    assert memory.shared_buffers_size(spans, sizes) == 150  # C needs a buffer of its own


def test_shared_buffers_reuse_the_smallest_free_buffer():
    spans = {0: (0, 1), 1: (1, 2), 2: (2, 3), 3: (3, 4)}
    sizes = {0: 100, 1: 60, 2: 100, 3: 40}
    # 0 and 2 share one 100-byte buffer, 1 and 3 the 60-byte one (smaller than the free 100).
    assert memory.shared_buffers_size(spans, sizes) == 160
    assert memory.arena_size(spans, sizes) == 160


def test_shared_buffers_by_breadth_when_smaller():
    # Largest first: 0 and 2 take a buffer each, 1 (free of 0) shares 0's, and 3 overlaps both 1 and
    # 2: a third buffer, 110 in all. By breadth (the steps where 80 bytes live first): 0 and 2, then
    # 3 into 0's buffer (free from step 2) and 1 into 2's (free from step 4): 80, the most live at once.
    spans = {0: (0, 1), 1: (4, 5), 2: (0, 3), 3: (2, 5)}
    sizes = {0: 40, 1: 40, 2: 40, 3: 30}
    by_size = sorted(spans, key=lambda t: (-sizes[t], spans[t][0]))
    assert memory._place_in_order(spans, sizes, by_size) == 110
    assert memory.shared_buffers_size(spans, sizes) == 80  # offsets by size (arena_size): 110 too
    assert memory.arena_size(spans, sizes) == 110


def chain_model(path, ops: int, shape=(64, 127)) -> None:
    """x -> ADD c -> ADD c -> ... (ops times): every intermediate is dead after the next op."""
    builder = ModelBuilder("chain")
    x = builder.tensor("x", shape, np.float32)
    c = builder.constant("c", np.full(shape, 0.5, np.float32))
    builder.inputs.append(("x", x))
    current = x
    for i in range(ops):
        out = builder.tensor(f"t{i}", shape, np.float32)
        builder.op("ADD", [current, c], [out])
        current = out
    builder.outputs.append(("y", current))
    path.write_bytes(builder.serialize())


def test_plan_of_a_chain_holds_two_tensors(tmp_path):
    path = tmp_path / "chain.tflite"
    chain_model(path, 12)
    plan = memory.plan(read_tflite(path))
    tensor = 64 * 127 * 4
    rounded = -(-tensor // 64) * 64
    assert plan.arena_bytes == 2 * rounded
    assert plan.shared_bytes == 2 * rounded
    assert plan.naive_bytes == 13 * rounded  # the input and 12 outputs, each in its own buffer
    assert plan.arena_fp16_bytes == plan.shared_fp16_bytes == 2 * (-(-tensor // 2 // 64) * 64)
    assert plan.weights_bytes == tensor
    report = plan.as_dict()
    assert report["shared_buffers_mb"] == round(2 * rounded / memory.MB, 3)
