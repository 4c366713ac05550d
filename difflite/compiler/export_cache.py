"""`convert --export-cache DIR`: ONNX exports reused between conversions of one model at one size.

Exporting is most of a conversion's time (the tiny preset: about 25 of 35 s; SD 1.5's UNet:
minutes), and nothing the export reads depends on the options applied after it (--precision,
--weights, --fuse, Winograd budgets, device profiles). A CI job that writes one checkpoint at
several widths, or a person trying recipes, exports each component once.

An entry is keyed by everything the exporter reads: the wrapper module's structure and every
config and attention processor in it, the bytes of every parameter and buffer, the example
inputs, the opset, and the versions of torch, onnx, onnxscript, diffusers and transformers and
the text of difflite/compiler/export.py. Its files are checked against their recorded sha256 before reuse
(remembered per file stamp, as for component files: an entry is read whole once, not at every
reuse); an entry that changed or is incomplete is removed and exported again. Entries are written
in a staging folder and renamed into place, so concurrent conversions never see half of one. Nothing
is pruned: the folder holds one ONNX graph per component, model, size and batch (SD 1.5's UNet
at fp32: 3.4 GB), and can be deleted at any time."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable

import torch

from difflite.compiler import export
from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json
from difflite.folder.manifest import checked_sha256, sha256_file

ENTRY = "entry.json"
KEY_VERSION = 1
EXPORTER_PACKAGES = ("torch", "onnx", "onnxscript", "onnx-ir", "diffusers", "transformers")


def export_key(spec: export.ComponentSpec, opset: int) -> str:
    """The sha256 of everything the export of `spec` at `opset` depends on."""
    digest = hashlib.sha256()

    def add(text: str) -> None:
        digest.update(text.encode())
        digest.update(b"\0")

    add(f"difflite-export-cache {KEY_VERSION} opset {opset}")
    for package in EXPORTER_PACKAGES:
        add(f"{package} {_version(package)}")
    digest.update(Path(export.__file__).read_bytes())
    add(f"{spec.name} {spec.input_names} {spec.output_names}")
    add(repr(spec.module))
    for name, module in spec.module.named_modules():
        add(f"{name} {_config_text(module)} {type(getattr(module, 'processor', None)).__qualname__}")
    for name, tensor in spec.module.state_dict().items():
        _add_tensor(digest, name, tensor)
    for i, tensor in enumerate(spec.example_inputs):
        _add_tensor(digest, f"input {i}", tensor)
    return digest.hexdigest()


def export_cached(spec: export.ComponentSpec, path: Path, cache: Path, opset: int = 18,
                  warn: Callable[[str], None] = lambda message: None) -> bool:
    """export.export_onnx(spec, path), or the files of an earlier identical export from `cache`;
    True when they came from the cache. A cache that cannot be written only warns."""
    cache = Path(cache).expanduser()
    key = export_key(spec, opset)
    if _reuse(cache / key, Path(path)):
        return True
    export.export_onnx(spec, path, opset)
    try:
        _store(cache, key, Path(path))
    except OSError as exc:
        warn(f"--export-cache {cache}: not stored ({exc.strerror or exc})")
    return False


def _reuse(entry: Path, path: Path) -> bool:
    """Place the entry's files at `path` (and its .data) when they are all there and unchanged."""
    names = _file_names(path)
    try:
        files = read_json(entry / ENTRY, what="export cache entry")["files"]
        intact = sorted(files) == sorted(names) and all(
            (entry / name).stat().st_size == files[name]["bytes"]
            and checked_sha256(entry / name) == files[name]["sha256"] for name in names)
    except (OSError, BadInput, KeyError, TypeError):
        intact = False
    if not intact:
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)  # changed or incomplete: exported again
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        _copy(entry / name, path.parent / name)
    return True


def _store(cache: Path, key: str, path: Path) -> None:
    """Record the export at `path` as the entry `key`; another process's entry of the same key
    wins, ours is dropped."""
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=cache))
    try:
        files = {}
        for name in _file_names(path):
            _copy(path.parent / name, staging / name)
            files[name] = {"bytes": (staging / name).stat().st_size, "sha256": sha256_file(staging / name)}
        (staging / ENTRY).write_text(json.dumps({"files": files}, indent=2))
        try:
            os.rename(staging, cache / key)
        except OSError:
            if not (cache / key).is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _file_names(path: Path) -> list[str]:
    """The graph and its external data (the graph names its data file: the names are kept)."""
    return [path.name, path.name + ".data"]


def _copy(source: Path, target: Path) -> None:
    """A copy, not a hard link: onnx_ir refuses to read external data with several links."""
    shutil.copyfile(source, target)


def _add_tensor(digest, name: str, tensor: torch.Tensor) -> None:
    tensor = tensor.detach().contiguous()
    digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\0".encode())
    digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)


def _config_text(module) -> str:
    config = getattr(module, "config", None)
    if config is None:
        return ""
    if hasattr(config, "to_json_string"):  # transformers
        return config.to_json_string(use_diff=False)
    # diffusers' FrozenDict; its private keys are bookkeeping (_use_default_values: a set's order)
    return json.dumps({k: v for k, v in dict(config).items() if not k.startswith("_")}, sort_keys=True, default=repr)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"
