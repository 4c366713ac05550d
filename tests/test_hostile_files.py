"""Hostile .tflite files (issue 16, item 3): the corpus of tests/support/hostile_tflite.py (a seed model
with every difflite op, mutated: offsets and sizes past the end of the file or wrapping around,
shapes that overflow an element count, indices out of range, cycles, two writers, constants
written, custom options of the wrong types or values, custom-op tensors of the wrong count, rank,
dtype or shape; plus seeded byte-level damage) against every reader:

* `difflite inspect FILE` and `difflite verify OUT` (OUT: a folder whose manifest vouches for the
  hostile file) exit 2 with one `difflite: error:` line naming the file: no traceback, no signal,
  and verify says so before importing torch. All cases through the functions those commands call
  (in this process); a sample through the real command lines.
* the op library's delegate, both backends (CPU; OpenCL on PoCL), in child processes (a crash
  fails its case, not pytest): the model does not load, or the difflite node it names is refused
  with its reason; it never runs a model it was meant to refuse.

tests/test_sanitizers.py runs the same delegate cases against the library built with ASan/UBSan.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support import ROOT
from support import hostile_tflite as hostile
from support.oplib_helpers import build_oplib

CLI = (sys.executable, "-m", "difflite")
RANDOM = 60
CASES = hostile.CASES + hostile.random_cases(RANDOM)
BY_ID = {c.id: c for c in CASES}
# Through the real command lines (the rest through the same functions, in this process): one of
# each kind of damage, and some random ones.
CLI_SAMPLE = ["buffer-offset-wraps", "constant-buffer-short", "op-input-index-out-of-range",
              "input-shape-wraps-to-zero", "large-custom-options-wrap", "truncated-half", "cycle",
              "two-writers", "op-writes-a-constant", "groupnorm-groups-as-string", "attention-heads-zero",
              "options-not-a-flexbuffer", "winograd-w-rank-2", "geglu-odd-last-dim",
              "dequantize-axis-out-of-range", "signature-index-out-of-range", "random-000", "random-001",
              "random-002"]
EXIT_BAD_INPUT = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return hostile.write_corpus(tmp_path_factory.mktemp("hostile"), CASES)


def test_case_ids_are_unique_and_the_sample_exists():
    assert len(BY_ID) == len(CASES)
    assert set(CLI_SAMPLE) <= set(BY_ID)


def test_the_seed_runs_on_both_backends(corpus):
    """The mutations start from a model both backends run (so a refusal is the mutation's)."""
    lib = build_oplib()
    for backend in ("cpu", "opencl"):
        outcome = hostile.run_children(lib, backend, corpus, ["seed"])["seed"]
        assert outcome.stage == "ran", (backend, outcome)
        assert "not delegating" not in outcome.stderr, (backend, outcome.stderr)


# ---------------------------------------------------------------------------------------------
# inspect and verify


def one_line_naming(message: str, path: Path) -> None:
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_readers_refuse(case, corpus):
    """What `inspect` and the folder check of verify / generate / bench call: BadInput, one line
    naming the file, for every designed case; for random damage that or a clean summary."""
    from difflite.core.errors import BadInput
    from difflite.folder.validate import read_checked
    from difflite.runtime.inspect import describe_model

    path = corpus / f"{case.id}.tflite"
    for reader in (describe_model, read_checked):
        try:
            reader(path)
        except BadInput as exc:
            one_line_naming(str(exc), path)
        else:
            assert case.tools == "any", f"{reader.__name__} accepted {case.id}"


def out_folder(folder: Path, model: bytes) -> Path:
    """An output folder whose manifest vouches for `model` as its UNet (size and sha256 right)."""
    folder.mkdir(parents=True)
    (folder / "unet.tflite").write_bytes(model)
    manifest = {
        "format": "difflite-output", "format_version": 1,
        "source": {"model": "preset:tiny", "sha256": "0" * 64},
        "options": {"precision": "fp32", "height": 32, "width": 32, "batch": 1, "seed": 0},
        "components": {"unet": {"file": "unet.tflite", "sha256": hashlib.sha256(model).hexdigest(),
                                "bytes": len(model), "inputs": [{"name": "x", "shape": [1, 4, 4, 8]}],
                                "outputs": [{"name": "y", "shape": [1, 16, 8]}],
                                "custom_ops": ["difflite.GroupNorm"]}},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # A poisoned torch import: verify must refuse the file before it loads any model.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": f"{cwd}{os.pathsep}{ROOT}"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.fixture(scope="module")
def cli_results(corpus, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, subprocess.CompletedProcess]]:
    base = tmp_path_factory.mktemp("hostile-cli")
    poison = base / "poison"
    poison.mkdir()
    (poison / "torch.py").write_text("raise ImportError('verify imported torch before checking its files')\n")
    jobs = {}
    for case_id in CLI_SAMPLE:
        model = corpus / f"{case_id}.tflite"
        jobs[("inspect", case_id)] = (model, ("inspect", str(model)))
        if BY_ID[case_id].tools == "bad":  # a file verify might accept would go on to load torch
            folder = out_folder(base / case_id, model.read_bytes())
            jobs[("verify", case_id)] = (folder / "unet.tflite", ("verify", str(folder)))
    with ThreadPoolExecutor(2) as pool:
        futures = {key: (path, pool.submit(run_cli, *args, cwd=poison)) for key, (path, args) in jobs.items()}
        return {key: (path, future.result()) for key, (path, future) in futures.items()}


CLI_JOBS = [("inspect", c) for c in CLI_SAMPLE] + [("verify", c) for c in CLI_SAMPLE if BY_ID[c].tools == "bad"]


@pytest.mark.parametrize("command,case_id", CLI_JOBS, ids=[f"{c}-{i}" for c, i in CLI_JOBS])
def test_command_line_refuses(command, case_id, cli_results):
    path, result = cli_results[(command, case_id)]
    assert result.returncode >= 0, f"killed by signal {-result.returncode}:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if BY_ID[case_id].tools == "any" and result.returncode == 0:
        return
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("INFO: ")]
    assert len(lines) == 1 and lines[0].startswith(f"difflite: error: {path}: "), result.stderr


def test_a_folder_check_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """check_component_files checks each model once per change of its file, like its digest."""
    from difflite.core.errors import BadInput
    from difflite.folder import manifest, validate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = out_folder(tmp_path / "out", hostile.seed_bytes())
    man = manifest.read_manifest(folder)
    calls = []
    real = validate.read_checked
    monkeypatch.setattr(validate, "read_checked", lambda path: calls.append(path) or real(path))
    monkeypatch.setattr(manifest, "RACY_SECONDS", 0.0)
    manifest.check_component_files(folder, man)
    manifest.check_component_files(folder, man)
    assert len(calls) == 1
    hostile_model = hostile.CASES[0].make(hostile.seed_model())
    folder = out_folder(tmp_path / "out2", hostile_model)
    with pytest.raises(BadInput, match="unet.tflite"):
        manifest.check_component_files(folder, manifest.read_manifest(folder))


# ---------------------------------------------------------------------------------------------
# The delegate


DELEGATE_CASES = [c for c in CASES if c.delegate != "tflite"]
TFLITE_CASES = [c for c in CASES if c.delegate == "tflite"]


@pytest.fixture(scope="module")
def delegate_outcomes(corpus) -> dict[str, dict[str, hostile.Outcome]]:
    lib = build_oplib()
    ids = [c.id for c in DELEGATE_CASES]
    return {backend: hostile.run_children(lib, backend, corpus, ids) for backend in ("cpu", "opencl")}


@pytest.mark.parametrize("case", TFLITE_CASES, ids=[c.id for c in TFLITE_CASES])
def test_runtime_refuses_what_tflite_would_read_out_of_bounds(case, corpus, tmp_path, monkeypatch):
    """Files TFLite's loader takes although they point outside themselves: the runtime (what
    generate, bench and verify load models with) refuses them before an interpreter exists."""
    from difflite.core.errors import BadInput
    from difflite.folder.output_folder import ComponentEntry
    from difflite.runtime import component as runtime

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    made = []
    monkeypatch.setattr(runtime.Component, "_load", lambda self, *args: made.append(args))
    path = corpus / f"{case.id}.tflite"
    with pytest.raises(BadInput) as refused:
        runtime.Component(ComponentEntry(path.stem, path, custom_ops=("difflite.GroupNorm",)))
    one_line_naming(str(refused.value), path)
    assert made == []


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
@pytest.mark.parametrize("case", DELEGATE_CASES, ids=[c.id for c in DELEGATE_CASES])
def test_delegate_refuses_or_fails_cleanly(case, backend, delegate_outcomes):
    outcome = delegate_outcomes[backend][case.id]
    problems = hostile.delegate_problems(case, backend, outcome)
    assert not problems, "\n".join(problems)
