"""The OpenCL backend as a phone runs it (issue: weights held once, a start in seconds), on PoCL,
whose "device" memory is this host's memory, as a phone's GPU memory is its RAM:

- a model's weights are resident once after loading: the process grows by its weights plus
  intermediates, within a stated bound, measured from /proc in a fresh process;
- float16 weights arrive in half storage bit-exact (and widened exactly in float storage), through
  the tiled kernels (read in place) and the flat ones (packed on the device);
- compiled programs come from the disk cache on the second load; a truncated, bit-flipped or
  foreign entry is rebuilt, never loaded; two processes filling one cache at once leave it whole.

Each measurement runs in a child process (tests/support/runtime_child.py) so that nothing this test
process has loaded counts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from difflite.compiler.tflite.writer import write_tflite

from support import SUPPORT
from support.lowering_helpers import Case, make_model, to_ir
from support.opencl_helpers import OpModel

CHILD = SUPPORT / "runtime_child.py"
WIDTH, LAYERS = 2048, 24  # 24 float16 weights of 2048 x 2048: 192 MiB
# Peak growth of a fresh process loading and running the model, past a warm-up that started
# OpenCL: its weights, intermediates and scratch once, 15% for allocator and driver slack, and
# 48 MiB for the interpreter's own tensors and the programs' code.
SLACK, FIXED_MB = 1.15, 48


def chain_model(path: Path, width: int, layers: int, seed: int = 0) -> Path:
    """x [1, width] through `layers` MatMul + Add, written at fp16 by the project's writer
    (FULLY_CONNECTED on DEQUANTIZE'd float16 weights, 128-byte aligned in the file)."""
    r = np.random.default_rng(seed)
    nodes, inits, value = [], {}, "x"
    for i in range(layers):
        inits[f"w{i}"] = (r.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits[f"b{i}"] = r.standard_normal(width).astype(np.float32) * 0.1
        nodes += [helper.make_node("MatMul", [value, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        value = f"y{i}"
    case = Case(id=f"chain-{width}-{layers}", nodes=nodes, inputs={"x": (1, width)}, outputs=[value], inits=inits)
    write_tflite(to_ir(make_model(case)), precision="fp16", path=path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("runtime-models")
    return {"big": chain_model(folder / "big.tflite", WIDTH, LAYERS),
            "warm": chain_model(folder / "warm.tflite", 64, 2, seed=1)}


def run_child(lib: Path, model: Path, cache: Path | str, warm: Path | None = None, env: dict | None = None,
              **options) -> dict:
    """runtime_child.py with the option cache_dir `cache` (none when ""), in `env` over this
    process's environment less DIFFLITE_PROGRAM_CACHE."""
    args = [sys.executable, str(CHILD), str(lib), str(model), str(cache), str(warm or ""),
            json.dumps({k: str(v) for k, v in options.items()})]
    base = {k: v for k, v in os.environ.items() if k != "DIFFLITE_PROGRAM_CACHE"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env={**base, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.splitlines()[-1]), "stderr": done.stderr}


# --------------------------------------------------------------------------
# Memory


@pytest.mark.parametrize("kernels", ["tiled", "flat"])
@pytest.mark.parametrize("zero_copy", ["auto", "off"])
def test_weights_are_resident_once(opencl_lib, models, tmp_path, zero_copy, kernels):
    """Tiled kernels (GPUs) read the weights as the file stores them: with zero copy their buffers
    are the model file's own pages. Flat kernels (CPUs) pack each weight on the device, one at a
    time, and the upload it was packed from is released."""
    cache = tmp_path / "cache"
    run_child(opencl_lib, models["warm"], cache, kernels=kernels)  # fills the program cache
    got = run_child(opencl_lib, models["big"], cache, warm=models["warm"], zero_copy=zero_copy, kernels=kernels)
    stats = got["stats"]
    model_weights = LAYERS * WIDTH * WIDTH * 2
    weights_mb = stats["weights_bytes"] / 2**20
    planned_mb = (stats["weights_bytes"] + stats["arena_bytes"] + stats["scratch_bytes"]) / 2**20
    assert stats["weights_bytes"] >= model_weights, stats
    growth_mb = got["peak_mb"] - got["baseline_mb"]
    bound_mb = SLACK * planned_mb + FIXED_MB
    grew = {kind: got["after_run"][kind] - got["baseline"][kind] for kind in ("RssAnon", "RssFile")}
    print(f"zero_copy={zero_copy} kernels={kernels}: weights {weights_mb:.0f} MiB, planned {planned_mb:.0f} "
          f"MiB, peak growth {growth_mb:.0f} MiB (bound {bound_mb:.0f}), after a run anon +{grew['RssAnon']:.0f} "
          f"file +{grew['RssFile']:.0f} MiB, zero-copy {stats['weights_zero_copy_bytes'] / 2**20:.0f} MiB, "
          f"model pages released {stats['model_pages_released_bytes'] / 2**20:.0f} MiB")
    assert growth_mb <= bound_mb, got
    np.testing.assert_allclose(got["output_head"], got["reference_head"], rtol=2e-2, atol=2e-2)
    if zero_copy == "off":
        assert stats["weights_zero_copy_bytes"] == 0
    if zero_copy == "off" or kernels == "flat":
        # the model file's pages of every weight were dropped after its copy (whole pages only)
        assert stats["model_pages_released_bytes"] >= 0.99 * model_weights, stats
        # (the file pages that do grow, ~50 MiB, are the kernels' code PoCL loads at the first run)
        assert grew["RssFile"] < 0.5 * model_weights / 2**20, grew
    else:
        # the weights are the file's pages, held once: no anonymous copy beside them
        assert stats["weights_zero_copy_bytes"] >= model_weights, stats
        assert grew["RssFile"] >= 0.95 * model_weights / 2**20, grew
        assert grew["RssAnon"] < 0.25 * model_weights / 2**20, grew


# --------------------------------------------------------------------------
# float16 weights in the device's storage, bit-exact


def identity_fc_model(path: Path, w16: np.ndarray) -> Path:
    """y = I @ W^T: every output row is one column of the float16 weight, exactly."""
    n, k = w16.shape
    m = OpModel()
    x = m.activation("x", (k, k))
    wf = m.activation("w32", w16.shape)
    y = m.activation("y", (k, n))
    m.builtin("DEQUANTIZE", [m.constant("w16", w16)], [wf])
    m.builtin("FULLY_CONNECTED", [x, wf, -1], [y])
    return m.save(path, [x], [y])


def delta_conv_model(path: Path, w16: np.ndarray) -> Path:
    """A 3x3 convolution of one-hot images: batch item c has a single 1 at the centre of channel
    c, so its output at (i, j) is the filter's tap (2 - i, 2 - j) of input channel c, exactly."""
    cout, _, _, cin = w16.shape
    m = OpModel()
    x = m.activation("x", (cin, 3, 3, cin))
    wf = m.activation("w32", w16.shape)
    y = m.activation("y", (cin, 3, 3, cout))
    m.builtin("DEQUANTIZE", [m.constant("w16", w16)], [wf])
    m.builtin("CONV_2D", [x, wf, -1], [y], padding=0, strideW=1, strideH=1, dilationWFactor=1,
              dilationHFactor=1)
    return m.save(path, [x], [y])


@pytest.mark.parametrize("kernels", ["flat", "tiled"])
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_fp16_weights_arrive_bit_exact(opencl_lib, tmp_path, kernels, precision):
    from support.opencl_helpers import opencl_options, run_model

    r = np.random.default_rng(7)
    fc = (r.standard_normal((37, 24)) * 3).astype(np.float16)
    conv = (r.standard_normal((19, 3, 3, 5)) * 3).astype(np.float16)
    options = opencl_options(kernels=kernels, precision=precision)
    (got,), _ = run_model(identity_fc_model(tmp_path / "fc.tflite", fc), opencl_lib,
                          [np.eye(24, dtype=np.float32)], options)
    assert np.array_equal(got, fc.T.astype(np.float32))
    image = np.zeros((5, 3, 3, 5), np.float32)
    image[np.arange(5), 1, 1, np.arange(5)] = 1
    (got,), _ = run_model(delta_conv_model(tmp_path / "conv.tflite", conv), opencl_lib, [image], options)
    want = conv[:, ::-1, ::-1, :].transpose(3, 1, 2, 0).astype(np.float32)  # [cin, i, j, cout]
    assert np.array_equal(got, want)


# --------------------------------------------------------------------------
# The program cache on disk


def entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.clbin"))


def test_program_cache_is_hit_on_the_second_load(opencl_lib, models, tmp_path):
    cache = tmp_path / "cache"
    first = run_child(opencl_lib, models["warm"], cache)["stats"]
    assert first["programs_compiled"] > 0 and first["programs_from_cache"] == 0, first
    assert first["program_cache"] == str(cache)
    assert len(entries(cache)) == first["programs_compiled"]
    second = run_child(opencl_lib, models["warm"], cache)
    assert second["stats"]["programs_compiled"] == 0, second["stats"]
    assert second["stats"]["programs_from_cache"] == first["programs_built"]
    np.testing.assert_array_equal(second["output_head"], run_child(opencl_lib, models["warm"], cache)["output_head"])


def test_program_cache_rebuilds_damaged_and_foreign_entries(opencl_lib, models, tmp_path):
    cache = tmp_path / "cache"
    first = run_child(opencl_lib, models["warm"], cache)
    stored = entries(cache)
    assert len(stored) >= 3, stored
    truncated, flipped, foreign = stored[:3]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40
    flipped.write_bytes(bytes(data))
    foreign.write_bytes(stored[3].read_bytes() if len(stored) > 3 else truncated.read_bytes())
    again = run_child(opencl_lib, models["warm"], cache)
    assert again["stats"]["programs_rejected"] == 3, again
    assert again["stats"]["programs_compiled"] == 3, again
    assert "rebuilding" in again["stderr"]
    np.testing.assert_array_equal(again["output_head"], first["output_head"])
    healed = run_child(opencl_lib, models["warm"], cache)["stats"]
    assert healed["programs_rejected"] == 0 and healed["programs_compiled"] == 0, healed


def test_program_cache_key_follows_the_build_options(opencl_lib, models, tmp_path):
    cache = tmp_path / "cache"
    half = run_child(opencl_lib, models["warm"], cache, precision="fp16")["stats"]
    float_storage = run_child(opencl_lib, models["warm"], cache, precision="fp32")["stats"]
    assert float_storage["programs_compiled"] > 0, float_storage  # other options, other entries
    assert len(entries(cache)) == half["programs_compiled"] + float_storage["programs_compiled"]


def test_program_cache_survives_two_writers(opencl_lib, models, tmp_path):
    cache = tmp_path / "cache"
    args = [[sys.executable, str(CHILD), str(opencl_lib), str(models["warm"]), str(cache), "", "{}"]] * 2
    children = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in args]
    results = [c.communicate(timeout=900) for c in children]
    assert all(c.returncode == 0 for c in children), [r[1][-2000:] for r in results]
    outputs = [json.loads(r[0].splitlines()[-1]) for r in results]
    assert not [p for p in cache.iterdir() if not p.name.endswith(".clbin") and p.name != "key"]  # no temporary left
    after = run_child(opencl_lib, models["warm"], cache)
    assert after["stats"]["programs_rejected"] == 0 and after["stats"]["programs_compiled"] == 0, after
    for out in outputs:
        np.testing.assert_array_equal(out["output_head"], after["output_head"])


def test_cache_dir_off_and_bad_values(opencl_lib, models, tmp_path):
    from ai_edge_litert.interpreter import load_delegate

    got = run_child(opencl_lib, models["warm"], tmp_path / "unused", cache_dir="off")["stats"]
    assert got["program_cache"] == "" and got["programs_from_cache"] == 0
    assert not (tmp_path / "unused").exists()
    for key, value in (("cache_dir", ""), ("zero_copy", "maybe")):
        with pytest.raises(ValueError):
            load_delegate(str(opencl_lib), {"backend": "opencl", key: value})
    with pytest.raises(ValueError):
        load_delegate(str(opencl_lib), {"backend": "cpu", "cache_dir": str(tmp_path)})


def test_default_cache_dir_is_under_the_users_cache(opencl_lib, models, tmp_path):
    env_cache = tmp_path / "xdg"
    stats = run_child(opencl_lib, models["warm"], "", env={"XDG_CACHE_HOME": str(env_cache)})["stats"]
    assert stats["program_cache"] == str(env_cache / "difflite" / "opencl")
    assert len(entries(env_cache / "difflite" / "opencl")) == stats["programs_compiled"] > 0, stats


def test_program_cache_named_by_the_environment(opencl_lib, models, tmp_path):
    """DIFFLITE_PROGRAM_CACHE names the folder for commands that pass no cache_dir (`generate`);
    off, none (nothing in the user's cache folder); an explicit cache_dir wins over it."""
    named = tmp_path / "named"
    first = run_child(opencl_lib, models["warm"], "", env={"DIFFLITE_PROGRAM_CACHE": str(named)})["stats"]
    assert first["program_cache"] == str(named) and len(entries(named)) == first["programs_compiled"] > 0, first
    again = run_child(opencl_lib, models["warm"], "", env={"DIFFLITE_PROGRAM_CACHE": str(named)})["stats"]
    assert again["programs_compiled"] == 0 and again["programs_from_cache"] == first["programs_compiled"], again
    xdg = tmp_path / "xdg"
    off = run_child(opencl_lib, models["warm"], "",
                    env={"DIFFLITE_PROGRAM_CACHE": "off", "XDG_CACHE_HOME": str(xdg)})["stats"]
    assert off["program_cache"] == "" and off["programs_from_cache"] == 0 and not (xdg / "difflite").exists(), off
    explicit = tmp_path / "explicit"
    got = run_child(opencl_lib, models["warm"], str(explicit), env={"DIFFLITE_PROGRAM_CACHE": str(named)})["stats"]
    assert got["program_cache"] == str(explicit) and len(entries(explicit)) == got["programs_compiled"] > 0, got


LOAD_CHILD = """
import os, signal, sys
from difflite.runtime.component import Component
component = Component(sys.argv[1], backend="opencl")  # the delegate writes its stats at load
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
component.close()
"""


def test_stats_files_of_killed_processes_are_swept(opencl_lib, models, tmp_path):
    """A process killed with a component loaded cannot remove its delegate's stats file; the next
    difflite process that loads one removes it, and keeps those of processes still running."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "DIFFLITE_OPLIB": str(opencl_lib)}
    root = Path(__file__).resolve().parent.parent

    def child(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", LOAD_CHILD, str(models["warm"]), mode], cwd=root, env=env,
                              capture_output=True, text=True, timeout=600)

    killed = child("kill")
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = sorted(p.name for p in tmp.glob("difflite-stats-*"))
    assert len(left) == 1 and left[0].endswith(".json"), left
    alive = tmp / f"difflite-stats-{os.getpid()}-7.json"  # this test's process is running
    alive.write_text("{}")
    other = tmp / "difflite-notes.json"
    other.write_text("{}")
    done = child("close")
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("difflite")) == sorted([alive.name, other.name])


def test_loading_and_freeing_a_model_many_times_does_not_grow(opencl_lib, models, tmp_path):
    """benchmarks/load_cycles.py in a fresh process: 40 loads, calls and frees of a model on the
    OpenCL backend; RSS after the last within 10% of after the tenth, and no stats file left."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "DIFFLITE_OPLIB": str(opencl_lib)}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "load_cycles.py"), str(models["warm"]),
                           "--cycles", "40", "--json"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cycles"] == 40 and len(result["rows"]) == 40
    assert result["growth"] <= 0.10, (result["after_10th_mb"], result["after_last_mb"])
    assert result["stats_files_left"] == [] and not list(tmp_path.glob("difflite-stats-*"))
