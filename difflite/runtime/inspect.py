"""`difflite inspect`: what is inside an output folder or any .tflite file."""

from __future__ import annotations

from pathlib import Path

from difflite.core.errors import BadInput
from difflite.folder import memory
from difflite.folder.output_folder import OutputFolder
from difflite.folder.validate import read_checked

MB = 1024 * 1024


def describe_model(path: Path) -> dict:
    summary = read_checked(path)
    plan = memory.plan(summary)
    signatures = {
        key: {kind: [{"name": name, "shape": list(summary.tensors[i].shape), "dtype": summary.tensors[i].dtype}
                     for name, i in io[kind].items()] for kind in ("inputs", "outputs")}
        for key, io in summary.signatures.items()}
    return {
        "file": str(path), "file_mb": round(summary.file_bytes / MB, 3), "ops": len(summary.ops),
        "weight_layout": summary.weight_layout,
        "op_histogram": summary.op_histogram, "signatures": signatures,
        "custom_ops": [{"name": op.name, "options": op.custom_options} for op in summary.custom_ops],
        "weight_widths": weight_widths(summary),
        **plan.as_dict(),
    }


def weight_widths(summary) -> dict[str, dict]:
    """Constant tensors by stored type: count and MB (int8 / int4: quantized weights)."""
    widths: dict[str, dict] = {}
    for t in summary.tensors:
        if t.constant:
            entry = widths.setdefault(t.dtype, {"tensors": 0, "mb": 0.0})
            entry["tensors"] += 1
            entry["mb"] += t.nbytes / MB
    return {k: {"tensors": v["tensors"], "mb": round(v["mb"], 3)} for k, v in sorted(widths.items())}


def inspect_target(target) -> dict:
    target = Path(target)
    if target.is_dir():
        folder = OutputFolder.read(target, check_models=False)  # describe_model checks them
        models = {name: describe_model(entry.path) for name, entry in folder.components.items()}
        return {"folder": str(target), "source": folder.source, "options": folder.options, "models": models}
    if target.is_file():
        return {"models": {target.stem: describe_model(target)}}
    raise BadInput(f"{target}: no such file or folder")
