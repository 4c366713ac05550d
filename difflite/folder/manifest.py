"""The output folder format (DESIGN §3): manifest.json, report.json, one .tflite per component,
tokenizer/ and scheduler/. Every file is written under a temporary name in the same folder and
renamed into place, so an interrupted run leaves no partial model."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json

FORMAT = "difflite-output"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REPORT = "report.json"
# What the place being written says, not the program: a full or read-only filesystem, a quota
WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


# A file changed this recently may change again within the same timestamp tick (coarse kernel
# clocks), which its stamps would not show: its digest is not remembered yet.
RACY_SECONDS = 2.0


def _digest_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "difflite" / "digests"


def checked_sha256(path: Path) -> str:
    """sha256_file, remembered per file by its identity and change stamps (device, inode, size,
    mtime and ctime in ns: any write to the file changes ctime), so that a model checked once is
    not read whole again at every start (1.6 s for SD 1.5 at fp16). The record is best-effort:
    where the cache folder cannot be written, the file is hashed every time."""
    return _remembered(path, "sha256", sha256_file, lambda value: isinstance(value, str))


def _remembered(path: Path, field: str, compute, valid):
    """compute(path), or what it gave before for this file as it is now (same stamps) where
    valid(that value): the record of the file under the digest cache, one JSON object per file,
    `field` among its keys."""
    st = path.stat()
    stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    record = _digest_cache_dir() / f"{key}.json"
    cached = {}
    with contextlib.suppress(BadInput):
        cached = read_json(record, what="digest record")
        cached = cached if isinstance(cached, dict) and cached.get("stamp") == stamp else {}
    if field in cached and valid(cached[field]):
        return cached[field]
    value = compute(path)
    if time.time_ns() - st.st_ctime_ns < RACY_SECONDS * 1e9:
        return value
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        temp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps({**cached, "path": str(path.resolve()), "stamp": stamp, field: value}))
        os.replace(temp, record)
    return value


def check_model_file(path: Path) -> None:
    """difflite.folder.validate's checks of a component file (structure, graph, difflite ops),
    remembered like its digest: a file that passed them is not read again until it changes."""
    from difflite.folder import validate

    def run_checks(p: Path) -> int:
        validate.read_checked(p)
        return validate.CHECKS_VERSION

    _remembered(path, "model_checks", run_checks, lambda value: value == validate.CHECKS_VERSION)


def json_text(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def check_writable_folder(folder) -> None:
    """Fail before any work when `folder` could not be created or written into."""
    check_can_write(Path(folder), Path(folder), "cannot write the output folder")


def check_can_write(target: Path, folder: Path, failure: str) -> None:
    """Fail when `folder` (which is to hold `target`) could not be created or written into: its
    first existing ancestor is a file, or read-only (os.access says so for a read-only filesystem
    even to root). The message: "TARGET: FAILURE (why)"."""
    for place in (folder, *folder.parents):
        if place.exists():
            if not place.is_dir():
                raise BadInput(f"{target}: {failure} ({place} is not a folder)")
            if not os.access(place, os.W_OK | os.X_OK):
                raise BadInput(f"{target}: {failure} ({place} is not writable)")
            return


STAGING_PREFIX = ".difflite-staging-"  # then the writing process's pid


def sweep_stale_staging(folder: Path) -> list[Path]:
    """Staging folders in `folder` that a killed convert left (their pid no longer runs): removed.
    Those of running processes, and names without a pid, are left alone."""
    from difflite.core.procmem import process_running

    removed = []
    for staging in folder.glob(STAGING_PREFIX + "*"):
        pid = staging.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if staging.is_dir() and pid.isdigit() and not process_running(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
    return removed


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
            sweep_stale_staging(self.folder)
            self.staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=self.folder))
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
            if isinstance(exc, OSError) and exc.errno in WRITE_ERRORS:
                on = f": {exc.filename}" if exc.filename else ""
                raise BadInput(f"{self.folder}: cannot write the output folder ({exc.strerror}{on})") from exc
        return False


def read_manifest(folder) -> dict:
    folder = Path(folder)
    path = folder / MANIFEST
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"{folder}: not a folder (give the output folder that `difflite convert` wrote)")
    if not folder.is_dir():
        raise BadInput(f"{folder}: no such folder")
    if not os.path.lexists(path):
        raise BadInput(f"{folder}: not a difflite output folder (no {MANIFEST})")
    manifest = read_json(path, what="manifest")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadInput(f"{path}: not a difflite manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BadInput(f"{path}: format version {manifest.get('format_version')} is not supported "
                       f"(this difflite reads {FORMAT_VERSION})")
    check_structure(path, manifest)
    return manifest


def check_structure(path: Path, manifest: dict) -> None:
    """The fields every command relies on, so that a damaged manifest is a BadInput naming the
    field rather than a KeyError."""
    for key in ("source", "options", "components"):
        if not isinstance(manifest.get(key), dict):
            raise BadInput(f"{path}: '{key}' is missing or not an object")
    if manifest["options"].get("precision") not in ("fp32", "fp16"):
        raise BadInput(f"{path}: options.precision {manifest['options'].get('precision')!r} is not fp32 or fp16")
    for name, entry in manifest["components"].items():
        if not isinstance(entry, dict):
            raise BadInput(f"{path}: component '{name}' is not an object")
        file = entry.get("file")
        # a bare name: the manifest may only point inside its own folder
        if not isinstance(file, str) or not file or Path(file).name != file:
            raise BadInput(f"{path}: component '{name}' has no valid 'file' (got {file!r})")
        if not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("bytes"), int):
            raise BadInput(f"{path}: component '{name}' has no 'sha256' and 'bytes' of its file")
        for kind in ("inputs", "outputs"):
            tensors = entry.get(kind)
            if not isinstance(tensors, list) or not all(
                    isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("shape"), list)
                    for t in tensors):
                raise BadInput(f"{path}: component '{name}' has no valid '{kind}' (name and shape of each tensor)")


def check_component_files(folder, manifest: dict, names=None, check_models: bool = True) -> None:
    """Every component file (or those in `names`) is present and is the file the manifest
    describes: its size, then its sha256 (checked_sha256: hashed once per change of the file). A
    file changed since the conversion is refused before anything loads it. `check_models`: each
    file's structure, graph and difflite ops are checked too (difflite.folder.validate), since a
    manifest vouches for whatever file it was written for: a hostile file never reaches an
    interpreter."""
    folder = Path(folder)
    for name, entry in manifest["components"].items():
        if names is not None and name not in names:
            continue
        path = folder / entry["file"]
        if not path.is_file():
            raise BadInput(f"{path}: missing (the output folder is incomplete: convert again)")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise BadInput(f"{path}: {size} bytes, but the manifest says {entry['bytes']}: the file changed "
                           f"since the conversion (convert again)")
        try:
            digest = checked_sha256(path)
        except OSError as exc:
            raise BadInput(f"{path}: cannot read ({exc.strerror or exc})") from exc
        if digest != entry["sha256"]:
            raise BadInput(f"{path}: sha256 differs from the manifest's: the file changed since the "
                           f"conversion (convert again)")
        if check_models:
            check_model_file(path)


def read_report(folder) -> dict:
    path = Path(folder) / REPORT
    return read_json(path, what="report") if path.is_file() else {}
