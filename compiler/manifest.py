"""The output folder format (DESIGN §3): manifest.json, report.json, one .tflite per component,
tokenizer/ and scheduler/. Every file is written under a temporary name in the same folder and
renamed into place, so an interrupted run leaves no partial model."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from compiler.errors import BadInput

FORMAT = "difflite-output"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REPORT = "report.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def json_text(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


class StagedFolder:
    """Collects the files of an output folder in a hidden staging directory inside it and moves
    them into place on commit(); abort() (or an exception in the with-block) removes the
    staging directory, and the folder itself if this run created it."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.created = False
        self.staging: Path | None = None

    def __enter__(self) -> "StagedFolder":
        if self.folder.exists() and not self.folder.is_dir():
            raise BadInput(f"{self.folder}: exists and is not a folder")
        try:
            if not self.folder.exists():
                self.folder.mkdir(parents=True)
                self.created = True
            self.staging = Path(tempfile.mkdtemp(prefix=".difflite-staging-", dir=self.folder))
        except OSError as exc:
            raise BadInput(f"{self.folder}: cannot write the output folder ({exc.strerror})") from exc
        return self

    def path(self, relative: str) -> Path:
        target = self.staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_bytes(self, relative: str, data) -> Path:
        target = self.path(relative)
        with open(target, "wb") as f:
            f.write(data)
        return target

    def write_json(self, relative: str, data) -> Path:
        return self.write_bytes(relative, json_text(data).encode())

    def commit(self) -> None:
        """Move every staged entry into the folder. The manifest goes last, so a folder with a
        manifest always has the files the manifest names."""
        entries = sorted(self.staging.iterdir(), key=lambda p: p.name == MANIFEST)
        for entry in entries:
            target = self.folder / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)
        self.staging.rmdir()
        self.staging = None

    def abort(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        if self.created:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only if empty: never delete what a user put there

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def read_manifest(folder) -> dict:
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise BadInput(f"{folder}: no such folder")
    if not path.is_file():
        raise BadInput(f"{folder}: not a difflite output folder (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not valid JSON ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise BadInput(f"{path}: not a difflite manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BadInput(f"{path}: format version {manifest.get('format_version')} is not supported "
                       f"(this difflite reads {FORMAT_VERSION})")
    return manifest


def read_report(folder) -> dict:
    path = Path(folder) / REPORT
    return json.loads(path.read_text()) if path.is_file() else {}
