"""LoRA files merged into the pipeline's weights before export (--lora FILE[:SCALE])."""

from __future__ import annotations

from compiler.errors import BadInput


def merge_loras(pipe, loras) -> None:
    raise BadInput(f"{loras[0].path}: --lora is not supported yet")
