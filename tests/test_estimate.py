"""`difflite inspect OUT --estimate PROFILE` (difflite/runtime/estimate.py): per-op work, the H200
calibration, SD 1.5 on the S23 Ultra's Adreno 740 against the paper's 11.5 s, the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT
from support.cli import run_difflite

from difflite.core.profiles import load_profile
from difflite.folder.reader import OpInfo, TensorInfo, TFLiteSummary
from difflite.runtime import estimate
from difflite.runtime.estimate import Operand, op_work

RESULTS = ROOT / "benchmarks" / "results"
OP_COUNTS = RESULTS / "sd15_op_counts_fp16_batch1_2026-11.json"
H200_PROFILES = {c: RESULTS / f"gpu_profile_sd15_{c}_detail_h200_2026-11.json" for c in ("text_encoder", "unet", "vae_decoder")}
PAPER_SECONDS = 11.5  # SD 1.4, 512x512, 20 guided steps, Samsung S23 Ultra GPU (Adreno 740)


def f16(*shape):
    return Operand(shape, 2)


# ---- FLOPs and bytes of single ops, against hand-computed values ----

def test_fully_connected_flops_and_bytes():
    work = op_work("FULLY_CONNECTED", [f16(1, 77, 768), f16(3072, 768), f16(3072)], f16(1, 77, 3072))
    assert work.kind == "gemm"
    assert work.flops == 363_331_584  # 2 x 77 x 768 x 3072
    assert work.nbytes == 2 * (77 * 768 + 3072 * 768 + 3072 + 77 * 3072)


def test_conv_flops_direct_and_1x1():
    assert op_work("CONV_2D", [f16(1, 8, 8, 4), f16(16, 3, 3, 4), f16(16)], f16(1, 8, 8, 16)).flops == 73_728
    # 1x1, stride 2 (the output's size counts): 2 x 4x4 x 32 x 64
    assert op_work("CONV_2D", [f16(1, 8, 8, 64), f16(32, 1, 1, 64), None], f16(1, 4, 4, 32)).flops == 65_536


def test_attention_flops_without_the_score_matrix_bytes():
    q, kv = f16(2, 64, 320), f16(2, 77, 320)
    work = op_work("difflite.Attention", [q, kv, kv], f16(2, 64, 320), {"heads": 8})
    # q k^T and p v: 2 x 2 x 64 x 77 x 320 each; softmax 5 x 2 x 8 x 64 x 77
    assert work.flops == 6_307_840 + 6_307_840 + 394_240
    assert work.kind == "attention" and work.kernels == 2
    assert work.nbytes == 2 * (2 * 64 * 320 * 2 + 2 * 2 * 77 * 320)  # q, out, k, v: no 64 x 77 scores


def test_winograd_flops_and_scratch():
    work = op_work("difflite.WinogradConv3x3", [f16(1, 16, 16, 64), f16(36, 64, 128), f16(128)], f16(1, 16, 16, 128))
    tiles = 16  # (16 / 4) x (16 / 4)
    gemm = 2 * 36 * tiles * 64 * 128  # 9,437,184: the 36 transformed GEMMs
    transforms = tiles * (64 * 864 + 128 * 480)  # dense B^T d B per input channel, A^T m A per output channel
    assert work.flops == gemm + transforms == 11_304_960
    operands = 2 * (16 * 16 * 64 + 36 * 64 * 128 + 128 + 16 * 16 * 128)
    assert work.nbytes == operands + 2 * 2 * 36 * tiles * (64 + 128)  # V and M through scratch
    # the filter form transforms its 3x3 filter at every call
    filtered = op_work("difflite.WinogradConv3x3", [f16(1, 16, 16, 64), f16(128, 3, 3, 64), f16(128)], f16(1, 16, 16, 128))
    assert filtered.flops == work.flops + 324 * 64 * 128


def test_memory_ops_and_free_ops():
    add = op_work("ADD", [f16(1, 64, 64, 320), f16(1, 1, 1, 320)], f16(1, 64, 64, 320))
    assert add.kind == "memory" and add.flops == 64 * 64 * 320
    assert add.nbytes == 2 * (2 * 64 * 64 * 320 + 320)
    assert op_work("RESHAPE", [f16(2, 3), f16(2)], f16(3, 2)) is None
    gather = op_work("GATHER", [f16(49408, 768), Operand((77,), 4)], f16(77, 768))
    assert gather.nbytes == 77 * 768 * 2 + 77 * 4 + 77 * 768 * 2  # the rows, not the table


def _summary(tensors, ops):
    return TFLiteSummary("x.tflite", 0, tensors, ops, [0], [ops[-1].outputs[0]])


def test_int8_and_int4_weights_count_as_stored():
    n, k, rows = 640, 320, 4096
    act = TensorInfo("x", (1, rows, k), "float32", rows * k * 4, False)
    out = TensorInfo("y", (1, rows, n), "float32", rows * n * 4, False)
    # int8: INT8 [N, K] + DEQUANTIZE -> FULLY_CONNECTED
    int8 = _summary([act, TensorInfo("w", (n, k), "int8", n * k, True), TensorInfo("wf", (n, k), "float32", 0, False), out],
                    [OpInfo("DEQUANTIZE", [1], [2]), OpInfo("FULLY_CONNECTED", [0, 2, -1], [3])])
    (fc,) = estimate.model_work(int8, 2)
    assert fc.nbytes == 2 * rows * k + n * k + 2 * rows * n
    # int4 in blocks of 32: INT4 [N*K/32, 1, 1, 32] + DEQUANTIZE, MUL by float16 block scales, RESHAPE
    blocks = n * k // 32
    int4 = _summary([act, TensorInfo("q", (blocks, 1, 1, 32), "int4", n * k // 2, True),
                     TensorInfo("d", (blocks, 1, 1, 32), "float32", 0, False),
                     TensorInfo("s", (blocks, 1, 1, 1), "float16", blocks * 2, True),
                     TensorInfo("m", (blocks, 1, 1, 32), "float32", 0, False),
                     TensorInfo("shape", (2,), "int32", 8, True),
                     TensorInfo("w", (n, k), "float32", 0, False), out],
                    [OpInfo("DEQUANTIZE", [1], [2]), OpInfo("MUL", [2, 3], [4]), OpInfo("RESHAPE", [4, 5], [6]),
                     OpInfo("FULLY_CONNECTED", [0, 6, -1], [7])])
    works = estimate.model_work(int4, 2)
    assert [w.name for w in works] == ["FULLY_CONNECTED"]  # the weight chain folds into the weights
    assert works[0].nbytes == 2 * rows * k + (n * k // 2 + blocks * 2 + 8) + 2 * rows * n
    assert works[0].flops == 2 * rows * n * k


# ---- the H200 calibration and SD 1.5 ----

def _sd15_works() -> dict[str, list]:
    """SD 1.5's ops (fp16, UNet batch 1, 512x512) rebuilt from the profiled keys and their node counts."""
    counts = json.loads(OP_COUNTS.read_text())["components"]
    return {component: [work for key, n, options in rows for work in [estimate.key_work(key, 2, options)] * n if work]
            for component, rows in counts.items()}


def test_calibration_reproduces_the_h200_kernel_totals():
    """The fitted model prices the measured keys within: UNet 5%, VAE decoder 15% (its VAE attention
    runs at 2% of peak, the UNet's at 10%: one factor for both), text encoder a factor 3 (77-row GEMMs
    leave the H200 idle; 0.07% of the H200's picture), the picture-weighted total 5%."""
    eff, data = estimate.load_calibration()
    device = data["device"]
    works = _sd15_works()
    model, measured = {}, {}
    for component, path in H200_PROFILES.items():
        measured[component] = json.loads(path.read_text())["kernel_ms"]
        model[component] = 1e3 * sum(estimate.kernel_seconds(w, device["fp32_gflops"], device["bandwidth_gbps"], eff)[0]
                                     + w.kernels * device["launch_overhead_us"] * 1e-6 for w in works[component])
        # the fit priced the measured keys; a few listed ops have none (a CAST, the timestep's slices)
        assert model[component] == pytest.approx(data["fit"][component]["model_kernel_ms"], rel=0.01)
    ratio = {c: model[c] / measured[c] for c in model}
    assert 0.95 < ratio["unet"] < 1.05
    assert 0.85 < ratio["vae_decoder"] < 1.15
    assert 1 / 3 < ratio["text_encoder"] < 3
    weights = {"text_encoder": 2, "unet": 40, "vae_decoder": 1}
    picture = sum(weights[c] * model[c] for c in model) / sum(weights[c] * measured[c] for c in model)
    assert 0.95 < picture < 1.05
    assert 0 < eff.memory <= 1 and all(0 < v <= 1 for v in eff.compute.values())


def test_sd15_on_adreno_740_within_2x_of_the_paper():
    est = estimate.picture_estimate(_sd15_works(), load_profile("adreno-740"), "fp16", 1, estimate.load_calibration()[0])
    assert est["components"]["unet"]["calls"] == 40 and est["components"]["text_encoder"]["calls"] == 2
    assert PAPER_SECONDS / 2 <= est["picture_seconds"] <= PAPER_SECONDS * 2
    assert est["components"]["unet"]["gflop_per_call"] == pytest.approx(682.5, rel=0.01)


def test_calls_per_picture():
    assert estimate.calls_per_picture("unet", 2) == 20 and estimate.calls_per_picture("unet", 1) == 40
    assert estimate.calls_per_picture("controlnet_0", 2) == 20
    assert estimate.calls_per_picture("vae_decoder", 2) == 1 and estimate.calls_per_picture("vae_encoder", 1) == 0


# ---- the command line on a tiny folder ----

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("estimate") / "tiny"
    run_difflite("convert", "preset:tiny", "-o", out, "--height", "64", "--width", "64", check=True)
    return out


def test_cli_estimate_text_and_json(tiny, tmp_path):
    text = run_difflite("inspect", tiny, "--estimate", "adreno-740", check=True).stdout
    assert "estimate" in text and "picture" in text and "calibrated on the NVIDIA H200" in text
    data = json.loads(run_difflite("inspect", tiny, "--estimate", "adreno-740", "--json", check=True).stdout)
    assert data["estimate"] is True and data["profile"] == "adreno-740" and "estimate" in data["note"]
    assert set(data["components"]) == {"text_encoder", "unet", "vae_decoder"}
    unet = data["components"]["unet"]
    assert unet["calls"] == 20 * 2 // data["unet_batch"]
    assert unet["seconds_per_picture"] == pytest.approx(unet["ms_per_call"] * unet["calls"] / 1e3, abs=1e-3)
    assert data["picture_seconds"] == pytest.approx(sum(c["seconds_per_picture"] for c in data["components"].values()), abs=0.01)
    assert unet["gflop_per_call"] > 0 and 0 <= unet["memory_bound_share"] <= 1
    # a profile .json as --device-profile takes it: half the bandwidth and FLOPs, slower
    profiles = json.loads((ROOT / "difflite" / "core" / "device_profiles.json").read_text())["profiles"]
    slow = dict(profiles["adreno-740"], bandwidth_gbps=32.0, fp16_gflops=3700.0, fp32_gflops=1850.0)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"profiles": {"mine": slow}}))
    mine = json.loads(run_difflite("inspect", tiny, "--estimate", path, "--json", check=True).stdout)
    assert mine["profile"] == "mine" and mine["picture_seconds"] > data["picture_seconds"]


def test_cli_estimate_bad_profile_exits_2_with_one_line(tiny):
    result = run_difflite("inspect", tiny, "--estimate", "adreno-999")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "adreno-999" in lines[0] and "adreno-740" in lines[0]


def test_estimate_imports_no_model_library():
    code = "import sys, difflite.runtime.estimate; print(any(m in sys.modules for m in ('torch', 'onnx')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip() == "False"
