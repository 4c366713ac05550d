"""The registry of lowerings: (ONNX domain, op_type) -> function(ctx, node).

Each module registers the ops it lowers with @lowers; importing this package imports them all."""

from __future__ import annotations

LOWERINGS: dict[tuple[str, str], object] = {}


def lowers(*op_types: str, domain: str = ""):
    def register(fn):
        for op_type in op_types:
            if (domain, op_type) in LOWERINGS:
                raise RuntimeError(f"two lowerings for {domain}:{op_type}")
            LOWERINGS[(domain, op_type)] = fn
        return fn
    return register


def attr(node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


from difflite.compiler.tflite.ops import (  # noqa: E402,F401  (registration side effects)
    conv,
    custom,
    elementwise,
    matmul,
    norm,
    reduce,
    resize,
    shape,
)
