"""`difflite bench`: on the host against the tiny preset (fused and --no-fuse), and over adb
against a fake `adb` (tests/support/fake_adb.py) whose device runs a fake benchmark_model
(tests/support/fake_benchmark_model.py) that prints benchmark_model's log. No phone is needed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from difflite.runtime import adb as adb_module
from difflite.folder.output_folder import ComponentEntry, OutputFolder, TensorSpec
from difflite.runtime.bench import BenchOptions, load_runner, pipeline_plan

from support import ROOT, SUPPORT
from support.cli import difflite_command, run_difflite

SIZE = ["--height", "32", "--width", "48"]  # small and non-square: quick to time
SERIAL = "FAKE0123"
DEVICE_TMP = "/data/local/tmp"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20
# --plot needs matplotlib; without it the plot checks become a check of the clear error.
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def difflite(*args, check=True, env=None, path=None) -> subprocess.CompletedProcess:
    if path is not None:  # a PATH without adb: run `python -m difflite` with this interpreter
        return run_difflite(*args, check=check, env={**(env or {}), "PATH": path},
                            command=[sys.executable, "-m", "difflite"])
    return run_difflite(*args, check=check, env=env)


def bad_input(result: subprocess.CompletedProcess, *phrases: str) -> str:
    """Exit 2 with one `difflite: error:` line that contains every phrase."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("difflite: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    return line


@pytest.fixture(scope="module")
def outs(tmp_path_factory) -> dict[str, Path]:
    """The tiny preset converted twice, in parallel: fused (the default) with the three pipeline
    components, and --no-fuse with the UNet only (to keep the module quick)."""
    base = tmp_path_factory.mktemp("bench")
    folders = {"fused": base / "fused", "nofuse": base / "nofuse"}
    extra = {"fused": [], "nofuse": ["--no-fuse", "--components", "unet"]}
    processes = {k: subprocess.Popen([*difflite_command(), "convert", "preset:tiny", "-o", str(folder), *SIZE,
                                      *extra[k], "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
                 for k, folder in folders.items()}
    for kind, process in processes.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, f"convert ({kind}) failed:\n{stdout}\n{stderr}"
    return folders


# ---------------------------------------------------------------------------------------------
# host


def test_host_bench_json_and_plot(outs, tmp_path):
    plot = tmp_path / "bench.png"
    plot_args = ["--plot", plot] if HAS_MATPLOTLIB else []
    result = difflite("bench", outs["fused"], "--runs", 3, "--warmup", 1, "--steps", 2, "--json", *plot_args)
    data = json.loads(result.stdout)  # --json: nothing else on stdout
    assert data["mode"] == "host" and data["backend"] == "cpu" and data["runs"] == 3
    manifest = json.loads((outs["fused"] / "manifest.json").read_text())
    assert data["fuse"] == manifest["options"]["fuse"] and data["fuse"], "fused by default"
    assert data["source"] == "preset:tiny"
    assert list(data["components"]) == ["text_encoder", "unet", "vae_decoder"]
    for name, r in data["components"].items():
        assert r["runs"] == 3 and r["warmup"] == 1, name
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"], name
        assert r["min_ms"] <= r["mean_ms"] <= r["max_ms"] and r["first_ms"] > 0 and r["load_ms"] > 0
        assert r["custom_ops"], f"{name}: the fused preset has difflite custom ops"
    pipeline = data["pipeline"]
    # guidance on (7.5 by default), batch-1 text encoder and UNet: 2 + 2 x steps + 1 calls
    assert pipeline["guidance"] is True and pipeline["steps"] == 2
    assert pipeline["calls"] == {"text_encoder": 2, "unet": 4, "vae_decoder": 1}
    assert pipeline["measured_calls"] == pipeline["calls"]
    expected = sum(data["components"][n]["median_ms"] * c for n, c in pipeline["calls"].items())
    assert pipeline["sum_of_medians_ms"] == pytest.approx(expected)
    assert pipeline["measured_ms"] > 0
    assert any("negative prompt" in note for note in pipeline["notes"])
    assert any("batch-1 UNet" in note for note in pipeline["notes"])
    assert {c["calls_per_image"] for c in data["components"].values()} == {2, 4, 1}
    for name, r in data["components"].items():
        check_measured_memory(r, name)
        assert r["device"] is None, f"{name}: backend cpu allocates nothing on a device"
    check_measured_memory(pipeline["memory"], "pipeline")
    check_peak_over_everything(data)
    if not HAS_MATPLOTLIB:
        bad_input(difflite("bench", outs["fused"], "--plot", plot, check=False), "pip install matplotlib")
        return
    assert data["plot"] == str(plot)
    blob = plot.read_bytes()
    assert blob.startswith(PNG_SIGNATURE) and len(blob) > 2000
    assert b"IEND" in blob[-16:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.png"], "no temporary file is left behind"


def check_measured_memory(r: dict, name: str) -> None:
    """What bench measured from /proc across one component (or the pipeline run) is consistent:
    the peak covers the baseline and the resident set after loading, and the peaks of the
    anonymous and file-backed parts fit in the peak resident set (they can peak at different
    moments, and the kernel's counters are approximate: a little slack)."""
    assert r["peak_reset"] is True, f"{name}: Linux lets a process reset its own VmHWM"
    assert 0 < r["baseline_rss_mb"] <= r["peak_rss_mb"], (name, r)
    assert r["peak_anon_mb"] > 0 and r["peak_file_mb"] > 0 and r["peak_shmem_mb"] >= 0, (name, r)
    slack = max(8.0, 0.05 * r["peak_rss_mb"])
    assert r["peak_anon_mb"] + r["peak_file_mb"] <= r["peak_rss_mb"] + slack, (name, r)
    assert r["samples"] >= 2, (name, r)
    if "load_ms" in r:
        assert r["load_ms"] > 0 and r["first_ms"] > 0, (name, r)
        assert r["after_load_rss_mb"] <= r["peak_rss_mb"] + slack, (name, r)
        assert r["after_load_anon_mb"] <= r["peak_anon_mb"] and r["after_load_file_mb"] <= r["peak_file_mb"], (name, r)


def check_peak_over_everything(data: dict) -> None:
    peaks = [r["peak_rss_mb"] for r in data["components"].values()]
    if data["pipeline"].get("memory"):
        peaks.append(data["pipeline"]["memory"]["peak_rss_mb"])
    assert data["peak_rss_mb"] == max(peaks) > 10


def test_host_bench_opencl_reports_device_memory(outs, tmp_path):
    saved = tmp_path / "opencl.json"
    result = difflite("bench", outs["fused"], "--backend", "opencl", "--runs", 2, "--warmup", 1, "--steps", 1,
                      "--json", "--save", saved)
    data = json.loads(result.stdout)
    assert json.loads(saved.read_text()) == data and data["backend"] == "opencl"
    for name, r in data["components"].items():
        check_measured_memory(r, name)
        device, stats = r["device"], r["device"]["stats"]
        assert device["weights_mb"] > 0 and device["intermediates_mb"] > 0, (name, device)
        assert device["weights_mb"] * MIB == stats["weights_bytes"], (name, device)
        assert device["intermediates_mb"] * MIB == stats["arena_bytes"], (name, device)
        assert device["scratch_mb"] * MIB == stats["scratch_held_bytes"], (name, device)
        assert device["scratch_lent_mb"] * MIB == stats["scratch_lent_bytes"], (name, device)
        assert device["total_mb"] == pytest.approx(device["weights_mb"] + device["intermediates_mb"]
                                                   + device["scratch_mb"])
        assert stats["nodes_claimed"] == stats["nodes_total"] > 0, (name, stats)
        if shutil.which("nvidia-smi") is None:
            assert device["nvidia_smi_mb"] is None
    pipeline = data["pipeline"]
    assert pipeline["measured_ms"] > 0 and pipeline["measured_calls"] == pipeline["calls"]
    check_measured_memory(pipeline["memory"], "pipeline")
    # every component stays loaded for the pipeline run: it starts from at least the last one's footprint
    last = data["components"]["vae_decoder"]
    assert pipeline["memory"]["baseline_rss_mb"] >= last["after_load_rss_mb"] - max(8.0, 0.05 * last["peak_rss_mb"])
    check_peak_over_everything(data)


def test_load_runner_allocates_tensors_while_loading(outs, tmp_path):
    """The OpenCL backend writes stats_path once its partitions are prepared (weights uploaded),
    which happens at allocate_tensors: so load_ms covers it, not the first call."""
    entry = OutputFolder.read(outs["fused"]).components["vae_decoder"]
    stats_path = tmp_path / "stats.json"
    runner = load_runner(entry, BenchOptions(backend="opencl", precision="fp32"), stats_path)
    assert runner is not None and stats_path.is_file(), "the delegate had not prepared by the end of the load"
    assert json.loads(stats_path.read_text())["weights_bytes"] > 0


def test_host_bench_no_fuse_table(outs):
    result = difflite("bench", outs["nofuse"], "--runs", 2, "--warmup", 1, "--steps", 1)
    for text in ("unet", "median ms", "calls/image", "peak RSS", "text_encoder, vae_decoder not benchmarked",
                 "load ms", "first ms", "peak MB (anon/file)", "device MB"):
        assert text in result.stdout, text
    row = next(line for line in result.stdout.splitlines() if "unet" in line and "│" in line)
    assert re.search(r"\b\d[\d.]* \([\d.]+/[\d.]+\)", row), row
    assert "measured end to end" not in result.stdout


def test_host_bench_subset_without_guidance(outs):
    result = difflite("bench", outs["nofuse"], "--components", "unet", "--runs", 2, "--warmup", 0,
                      "--steps", 3, "--guidance", 1, "--json")
    data = json.loads(result.stdout)
    assert list(data["components"]) == ["unet"] and data["fuse"] == []
    unet = data["components"]["unet"]
    assert unet["custom_ops"] == [] and unet["calls_per_image"] == 3
    pipeline = data["pipeline"]
    assert pipeline["guidance"] is False and pipeline["calls"]["unet"] == 3
    assert pipeline["measured_ms"] is None and pipeline["sum_of_medians_ms"] is None
    assert any("not benchmarked" in note for note in pipeline["notes"])


def test_host_bench_bad_input(outs, tmp_path):
    bad_input(difflite("bench", tmp_path / "missing", check=False), "missing", "no such folder")
    bad_input(difflite("bench", tmp_path, check=False), "no manifest.json")
    bad_input(difflite("bench", outs["fused"], "--components", "vae_encoder", check=False),
              "vae_encoder", "not in this output folder")
    bad_input(difflite("bench", outs["fused"], "--runs", 0, check=False), "--runs")
    bad_input(difflite("bench", outs["fused"], "--plot", tmp_path / "plot.jpg", check=False), ".png")
    bad_input(difflite("bench", outs["fused"], "--plot", tmp_path / "nowhere" / "p.png", check=False), "does not exist")
    bad_input(difflite("bench", outs["fused"], "--tflite-gpu", check=False), "--adb")
    bad_input(difflite("bench", outs["fused"], "--math", "fp32", check=False), "--math fp32",
              "--backend opencl only")


def test_pipeline_plan_batch2_unet():
    def manifest(te_batch, unet_batch):
        def entry(name, spec):
            return ComponentEntry(name, Path(f"{name}.tflite"), inputs=(spec,))
        return {"text_encoder": entry("text_encoder", TensorSpec("input_ids", (te_batch, 77), "int32")),
                "unet": entry("unet", TensorSpec("sample", (unet_batch, 8, 8, 4), "float32", "NHWC")),
                "vae_decoder": entry("vae_decoder", TensorSpec("latent", (1, 8, 8, 4), "float32", "NHWC"))}

    plan = pipeline_plan(manifest(1, 2), steps=25, guided=True)
    assert plan["calls"] == {"text_encoder": 2, "unet": 25, "vae_decoder": 1}
    assert any("both guidance passes in one call" in n for n in plan["notes"])
    plan = pipeline_plan(manifest(1, 2), steps=25, guided=False)
    assert plan["calls"] == {"text_encoder": 1, "unet": 25, "vae_decoder": 1}
    assert any("--batch 1" in n for n in plan["notes"])
    plan = pipeline_plan(manifest(2, 1), steps=10, guided=True)
    assert plan["calls"] == {"text_encoder": 1, "unet": 20, "vae_decoder": 1}


# ---------------------------------------------------------------------------------------------
# benchmark_model's output

NEW_STYLE = """\
INFO: STARTING!
INFO: Graph: [/data/local/tmp/difflite/unet.tflite]
INFO: EXTERNAL delegate created.
INFO: Replacing 468 out of 470 node(s) with delegate (TfLiteDelegate) node, yielding 2 partitions for subgraph 0.
INFO: The input model file size (MB): 4.51237
INFO: Initialized session in 43.1ms.
INFO: Running benchmark for at least 3 iterations and at least 0 seconds but terminate if exceeding 3600 seconds.
INFO: count=3 first=21645 curr=13488 min=13351 max=21645 avg=16161.3 std=3850 p5=13351 median=13488 p95=21645

INFO: Running benchmark for at least 7 iterations and at least 0 seconds but terminate if exceeding 3600 seconds.
INFO: count=7 first=13504 curr=13520 min=13396 max=14139 avg=13596.3 std=152 p5=13396 median=13510 p95=14139

INFO: Inference timings in us: Init: 43123, First inference: 21645, Warmup (avg): 16161.3, Inference (avg): 13596.3
INFO: Note: as the benchmark tool itself affects memory footprint, the following is only APPROXIMATE.
INFO: Memory footprint delta from the start of the tool (MB): init=6.42188 overall=8.67188
INFO: Overall peak memory footprint (MB) via periodic monitoring: 12.3457
"""

OLD_STYLE = ("Loaded model ./m.tflite\r\nInitialized session in 17.187ms.\r\n"
             "count=1 curr=3512391\r\n\r\n"
             "count=50 first=2990275 curr=2913402 min=2727568 max=3189954 avg=2.95034e+06 std=109798\r\n\r\n"
             "I tflite  : Inference timings in us: Init: 17187, First inference: 3512391, "
             "Warmup (avg): 3.51239e+06, Inference (avg): 2.95034e+06\r\n"
             "Peak memory footprint (MB): init=4.21094 overall=46.0859\r\n")


def test_parse_benchmark_model_new_style():
    r = adb_module.parse_benchmark_model(NEW_STYLE)
    assert (r.init_ms, r.first_ms, r.warmup_avg_ms, r.avg_ms) == pytest.approx((43.123, 21.645, 16.1613, 13.5963))
    assert r.runs == 7  # the timed runs' line, not the warm-up's
    assert (r.min_ms, r.max_ms, r.median_ms, r.std_ms) == pytest.approx((13.396, 14.139, 13.510, 0.152))
    assert (r.memory_init_mb, r.memory_overall_mb, r.memory_peak_mb) == pytest.approx((6.42188, 8.67188, 12.3457))
    assert r.initialized_ms == pytest.approx(43.1)
    assert r.delegations == [{"delegate": "TfLiteDelegate", "nodes": 468, "of": 470, "partitions": 2}]


def test_parse_benchmark_model_old_style():
    r = adb_module.parse_benchmark_model(OLD_STYLE)
    assert r.avg_ms == pytest.approx(2950.34) and r.warmup_avg_ms == pytest.approx(3512.39)
    assert r.runs == 50 and r.median_ms is None
    assert r.initialized_ms == pytest.approx(17.187) and r.init_ms == pytest.approx(17.187)
    assert (r.min_ms, r.max_ms) == pytest.approx((2727.568, 3189.954))
    assert (r.memory_init_mb, r.memory_overall_mb, r.memory_peak_mb) == (pytest.approx(4.21094),
                                                                        pytest.approx(46.0859), None)
    with pytest.raises(ValueError, match="Inference timings"):
        adb_module.parse_benchmark_model("ERROR: Could not open 'x.tflite'.\nERROR: Benchmarking failed.\n")


def test_benchmark_command_quotes_the_delegate_options():
    command = adb_module.benchmark_command(
        "/data/local/tmp/benchmark_model", "/data/local/tmp/d/unet.tflite", 10, 2, threads=4,
        delegate_path="/data/local/tmp/d/libdifflite_delegate.so",
        delegate_options={"backend": "opencl", "precision": "fp16"}, value_ranges={"input_ids": (0, 49407)})
    assert "--external_delegate_options='backend:opencl;precision:fp16'" in command
    assert "--num_runs=10" in command and "--warmup_runs=2" in command and "--num_threads=4" in command
    assert "--input_layer_value_range=input_ids,0,49407" in command
    assert "--report_peak_memory_footprint=true" in command
    assert command.endswith("2>&1")


# ---------------------------------------------------------------------------------------------
# over adb, against the fake adb


def elf_header(machine: int) -> bytes:
    """The first bytes of a 64-bit little-endian ELF shared object for `machine`."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    return ident + (3).to_bytes(2, "little") + machine.to_bytes(2, "little") + bytes(44)


class FakeDevice:
    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "device"
        self.bin = tmp_path / "bin"
        self.log = tmp_path / "adb.log"
        self.bin.mkdir()
        (self.root / DEVICE_TMP.strip("/")).mkdir(parents=True)
        adb = self.bin / "adb"
        adb.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SUPPORT / "fake_adb.py"}" "$@"\n')
        adb.chmod(0o755)
        self.benchmark_model = self.local(f"{DEVICE_TMP}/benchmark_model")
        self.benchmark_model.write_text(f"#!{sys.executable}\n" + (SUPPORT / "fake_benchmark_model.py").read_text())
        self.benchmark_model.chmod(0o755)
        self.library = tmp_path / "android" / "libdifflite_delegate.so"
        self.library.parent.mkdir()
        self.library.write_bytes(elf_header(183) + b"aarch64 op library stand-in")
        self.env = {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                    "FAKE_ADB_ROOT": str(self.root), "FAKE_ADB_DEVICES": f"{SERIAL}:device,OFFLINE7:unauthorized",
                    "FAKE_ADB_LOG": str(self.log)}

    def local(self, device_path: str) -> Path:
        return self.root / device_path.lstrip("/")

    def shell_commands(self) -> list[str]:
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c[3] for c in calls if c[:3] == ["-s", SERIAL, "shell"]]

    def bench(self, out, *args, check=True, env=None):
        return difflite("bench", out, "--adb", SERIAL, *args, check=check, env={**self.env, **(env or {})})


@pytest.fixture
def device(tmp_path) -> FakeDevice:
    return FakeDevice(tmp_path)


def test_adb_bench_fused_opencl(outs, device, tmp_path):
    plot, saved = tmp_path / "phone.png", tmp_path / "phone.json"
    result = device.bench(outs["fused"], "--oplib", device.library, "--backend", "opencl", "--precision", "fp16",
                          "--runs", 7, "--warmup", 3, "--steps", 5, "--json", "--save", saved,
                          *(["--plot", plot] if HAS_MATPLOTLIB else []))
    data = json.loads(result.stdout)
    assert json.loads(saved.read_text()) == data
    assert data["mode"] == "adb" and data["backend"] == "opencl" and data["precision"] == "fp16"
    folder = f"{DEVICE_TMP}/difflite"
    on_device = device.local(folder)
    for name in ("text_encoder.tflite", "unet.tflite", "vae_decoder.tflite"):
        assert (on_device / name).read_bytes() == (outs["fused"] / name).read_bytes(), name
    assert (on_device / "libdifflite_delegate.so").read_bytes() == device.library.read_bytes()
    assert set(data["device"]["pushed"].values()) == {"pushed"}
    assert data["device"]["model"] == "Fake Pixel" and data["device"]["abi"] == "arm64-v8a"
    commands = [c for c in device.shell_commands() if "--graph=" in c]
    assert len(commands) == 3
    for c in commands:
        assert f"--external_delegate_path={folder}/libdifflite_delegate.so" in c
        name = re.search(r"--graph=\S*/(\w+)\.tflite", c).group(1)
        assert (f"--external_delegate_options='backend:opencl;precision:fp16;stats_path:{folder}/stats_{name}.json;"
                f"cache_dir:{folder}/program_cache'") in c
        assert "--num_runs=7" in c and "--warmup_runs=3" in c and "--min_secs=0" in c
        assert "--report_peak_memory_footprint=true" in c
    te_command = next(c for c in commands if "text_encoder.tflite" in c)
    vocab = len(json.loads((outs["fused"] / "tokenizer" / "vocab.json").read_text()))
    assert f"--input_layer_value_range=input_ids,0,{vocab - 1}" in te_command
    for name, r in data["components"].items():
        size = (outs["fused"] / f"{name}.tflite").stat().st_size
        base_ms = (1000 + size // 100) / 1e3   # what the fake benchmark_model prints
        assert r["median_from"] == "median" and r["median_ms"] == pytest.approx(base_ms + 0.005)
        assert r["mean_ms"] == pytest.approx(base_ms + 0.010)
        assert (r["min_ms"], r["max_ms"]) == pytest.approx((base_ms - 0.040, base_ms + 0.090))
        # what the fake prints, in benchmark_model's format: "Initialized session in X ms", the
        # "Inference timings in us: Init: ..." line and the periodic peak memory
        assert r["first_ms"] == pytest.approx(2 * base_ms)
        assert r["load_ms"] == pytest.approx((100000 + size // 1000) / 1e3)
        assert r["runs"] == 7 and r["peak_mb"] == pytest.approx(40 + size / MIB, abs=1e-4)
        assert (r["memory_init_mb"], r["memory_overall_mb"]) == pytest.approx((6.42188, 38.5))
        assert r["delegations"][0]["delegate"] == "TfLiteDelegate"
        # what the op library reported on the phone (stats_path), read back with adb
        memory, stats = r["device"], r["device"]["stats"]
        assert stats["storage"] == "float16" and stats["arithmetic"] == "float16", stats
        assert stats["arena_bytes"] == size // 8 and stats["device"] == "QUALCOMM Adreno(TM) 740", stats
        assert memory["intermediates_mb"] == pytest.approx(size // 8 / MIB)
        assert memory["weights_mb"] == pytest.approx(size / MIB)
        assert memory["scratch_mb"] == pytest.approx(size // 16 / MIB)
        assert memory["total_mb"] == pytest.approx((size // 8 + size + size // 16) / MIB)
    assert data["peak_rss_mb"] == max(r["peak_mb"] for r in data["components"].values())
    pipeline = data["pipeline"]
    assert pipeline["calls"] == {"text_encoder": 2, "unet": 10, "vae_decoder": 1}
    assert pipeline["measured_ms"] is None
    assert pipeline["sum_of_medians_ms"] == pytest.approx(
        sum(data["components"][n]["median_ms"] * c for n, c in pipeline["calls"].items()))
    assert plot.read_bytes().startswith(PNG_SIGNATURE) or not HAS_MATPLOTLIB
    # a second run finds the files on the device unchanged and pushes nothing
    again = json.loads(device.bench(outs["fused"], "--oplib", device.library, "--runs", 2, "--json").stdout)
    assert set(again["device"]["pushed"].values()) == {"unchanged"}


def test_adb_bench_builtins_only_old_benchmark_model(outs, device):
    """--no-fuse with backend cpu needs no op library; an older benchmark_model prints no median."""
    result = device.bench(outs["nofuse"], "--runs", 4, "--device-dir", "/data/local/tmp/other",
                          env={"FAKE_BM_STYLE": "old"})
    assert "unet" in result.stdout and "no estimate" in result.stdout and "Fake Pixel" in result.stdout
    assert not device.local("/data/local/tmp/other/libdifflite_delegate.so").exists()
    commands = [c for c in device.shell_commands() if "--graph=" in c]
    assert commands and not any("--external_delegate" in c for c in commands)
    data = json.loads(device.bench(outs["nofuse"], "--runs", 4, "--device-dir", "/data/local/tmp/other",
                                   "--components", "unet", "--json", env={"FAKE_BM_STYLE": "old"}).stdout)
    assert data["device"]["pushed"] == {"/data/local/tmp/other/unet.tflite": "unchanged"}
    unet = data["components"]["unet"]
    assert unet["median_from"] == "avg" and unet["median_ms"] == unet["mean_ms"]
    assert unet["memory_overall_mb"] == pytest.approx(138.809) and unet["peak_mb"] is None
    assert unet["load_ms"] == pytest.approx((100000 + (outs["nofuse"] / "unet.tflite").stat().st_size // 1000) / 1e3)
    assert unet["device"] is None and data["peak_rss_mb"] is None


def test_adb_bench_precision_defaults_to_the_conversions(outs, device, tmp_path):
    """No --precision: the delegate runs at the manifest's precision (an fp16 conversion gets
    precision:fp16, i.e. half storage on OpenCL); --precision overrides it."""
    out16 = tmp_path / "fp16"
    subprocess.run([*difflite_command(), "convert", "preset:tiny", "-o", str(out16), *SIZE, "--no-fuse",
                    "--components", "unet", "--precision", "fp16"], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    for args, want in (([], "fp16"), (["--precision", "fp32"], "fp32")):
        data = json.loads(device.bench(out16, "--oplib", device.library, "--backend", "opencl", *args,
                                       "--runs", 2, "--json").stdout)
        assert data["precision"] == want, data
        commands = [c for c in device.shell_commands() if "--graph=" in c]
        assert f"precision:{want};stats_path:" in commands[-1], commands[-1]
    data = json.loads(device.bench(out16, "--oplib", device.library, "--backend", "opencl",
                                   "--math", "fp32", "--runs", 2, "--json").stdout)
    assert data["precision"] == "fp16" and data["math"] == "fp32", data
    assert data["components"]["unet"]["device"]["stats"]["arithmetic"] == "float32", data
    command = [c for c in device.shell_commands() if "--graph=" in c][-1]
    assert "--external_delegate_options='backend:opencl;precision:fp16;math:fp32;stats_path:" in command, command
    table = device.bench(out16, "--oplib", device.library, "--backend", "opencl", "--runs", 2).stdout
    assert "the op library on the phone (stats_path):" in table, table
    assert re.search(r"unet: QUALCOMM Adreno\(TM\) 740 .*storage float16, arithmetic float16", table), table
    data = json.loads(device.bench(outs["nofuse"], "--oplib", device.library, "--backend", "opencl",
                                   "--runs", 2, "--json").stdout)
    assert data["precision"] == "fp32", data


def test_adb_bench_tflite_gpu_baseline(outs, device):
    data = json.loads(device.bench(outs["nofuse"], "--tflite-gpu", "--precision", "fp16", "--runs", 2,
                                   "--json").stdout)
    assert data["device"]["delegate"] == "tflite-gpu"
    commands = [c for c in device.shell_commands() if "--graph=" in c]
    assert all("--use_gpu=true" in c and "--gpu_precision_loss_allowed=true" in c for c in commands)
    assert not any("--external_delegate_path" in c for c in commands)
    bad_input(device.bench(outs["fused"], "--tflite-gpu", check=False), "custom ops", "--no-fuse")


def test_adb_bench_errors(outs, device, tmp_path):
    fused, lib = outs["fused"], ["--oplib", device.library]
    bad_input(difflite("bench", fused, "--adb", SERIAL, *lib, check=False, path=str(tmp_path / "empty")),
              "adb is not on PATH")
    bad_input(difflite("bench", fused, "--adb", "NOSUCH9", *lib, check=False, env=device.env),
              "NOSUCH9", "not listed by `adb devices`", SERIAL)
    bad_input(difflite("bench", fused, "--adb", "OFFLINE7", *lib, check=False, env=device.env),
              "OFFLINE7", "unauthorized")
    bad_input(device.bench(fused, "--oplib", tmp_path / "nothing.so", check=False),
              "difflite oplib build --target android-arm64", "ANDROID_NDK_HOME")
    host_library = tmp_path / "host.so"
    host_library.write_bytes(elf_header(62))
    bad_input(device.bench(fused, "--oplib", host_library, check=False), "x86-64", "not an arm64")
    bad_input(device.bench(fused, *lib, "--benchmark-model", "/data/local/tmp/bm_missing", check=False),
              "/data/local/tmp/bm_missing", "android_aarch64_benchmark_model", "--benchmark-model")
    bad_input(device.bench(fused, *lib, check=False, env={"FAKE_ADB_FAIL_PUSH": "1"}),
              "adb push", "No space left on device")
    bad_input(device.bench(fused, *lib, "--backend", "opencl", check=False, env={"FAKE_BM_FAIL": "1"}),
              "benchmark_model failed on text_encoder.tflite", "no OpenCL platform")
    device.benchmark_model.unlink()
    bad_input(device.bench(fused, *lib, check=False), "benchmark_model is missing", DEVICE_TMP + "/benchmark_model")
