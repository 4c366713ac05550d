"""Fit the phone estimate's efficiencies (difflite/runtime/estimate.py) on the H200's measured kernels.

    python benchmarks/estimate_calibration.py [--ops-from OUT] [--write]

Reads the per-op kernel times of SD 1.5 (fp16 storage, FLOAT arithmetic, UNet batch 1, 512x512)
measured on the NVIDIA H200 (benchmarks/results/gpu_profile_sd15_{unet,vae_decoder,text_encoder}_
detail_h200_2026-11.json: "NAME INPUTS->OUTPUT KERNEL" -> ms per invoke, summed over the nodes of
that key) and how many nodes each key has (benchmarks/results/sd15_op_counts_fp16_batch1_2026-11.json;
--ops-from OUT rewrites that file from a converted SD 1.5 folder: `difflite convert preset:sd15 -o OUT
--precision fp16`). Each op's work comes from its key's shapes with the estimator's own functions,
so no .tflite is needed here.

The model on the H200 is the estimator's: max(flops / (peak x eff_compute), bytes / (bandwidth x
eff_memory)) + kernels x 5 us (the fixed cost of a kernel, which OpenCL's event times include: the
H200's smallest kernels take 4-8 us). The fit: an op is compute-bound where its compute term is the
larger; eff_compute[kind] (gemm, attention, memory) = sum of flops / peak over the compute-bound
ops of that kind / their measured time less their kernels' fixed cost; eff_memory = sum of bytes /
bandwidth over the memory-bound ops of every kind / theirs (one memory system; the few gemms that
are memory-bound on the H200 are tiny, so a factor of their own would be ill-determined); a kind
with no compute-bound op takes eff_memory. Each component's ops count as often as a picture calls
it (text encoder 2, UNet 40, VAE decoder 1). A few rounds re-split the ops with the fitted factors.
Prints the factors and the model against the measured kernel sum per component;
--write stores them in difflite/runtime/estimate_calibration.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from difflite.runtime import estimate

RESULTS = ROOT / "benchmarks" / "results"
PROFILES = {c: RESULTS / f"gpu_profile_sd15_{c}_detail_h200_2026-11.json" for c in ("text_encoder", "unet", "vae_decoder")}
OP_COUNTS = RESULTS / "sd15_op_counts_fp16_batch1_2026-11.json"
# The H200 as the model sees it: HBM3e 4.8 TB/s; FP32 without tensor cores ~67 TFLOP/s (NVIDIA's
# OpenCL has no cl_khr_fp16, so fp16 files compute in FLOAT there); launches ~5 us.
H200 = {"name": "NVIDIA H200", "bandwidth_gbps": 4800.0, "fp32_gflops": 67000.0, "launch_overhead_us": 5.0}
MEASURED = "2026-11-29, SD 1.5 preset, fp16 storage, FLOAT arithmetic, UNet batch 1, 512x512, OpenCL event times"
WIDTH = 2  # fp16 storage: activations and weights 2 bytes
CALLS = {"text_encoder": 2, "unet": 40, "vae_decoder": 1}
ROUNDS = 5


def op_key(summary, op) -> str:
    shape = lambda i: "x".join(str(d) for d in summary.tensors[i].shape) if i >= 0 else ""
    return f"{op.name} {','.join(shape(i) for i in op.inputs)}->{shape(op.outputs[0])}"


def count_ops(folder: Path) -> dict:
    """component -> [[key, nodes, custom options]] of the ops that run a kernel (weights folded)."""
    from difflite.folder.output_folder import OutputFolder
    from difflite.folder.validate import read_checked

    out = {}
    for name, entry in OutputFolder.read(folder, check_models=False).components.items():
        summary = read_checked(entry.path)
        _, folded = estimate.weights(summary)
        counts = collections.Counter(
            (op_key(summary, op), json.dumps(op.custom_options or {}, sort_keys=True))
            for index, op in enumerate(summary.ops) if index not in folded and op.name not in estimate.FREE_OPS)
        out[name] = [[key, n, json.loads(options)] for (key, options), n in sorted(counts.items())]
    return out


def measured_by_key(path: Path) -> tuple[dict[str, float], float]:
    """(op key without its kernel name -> ms per invoke, the component's kernel total)."""
    data = json.loads(path.read_text())
    by_key = collections.defaultdict(float)
    for key, ms in data["ops_ms"].items():
        if key.startswith("("):  # (write inputs) / (read outputs): the host's conversions
            continue
        by_key[key.rsplit(" ", 1)[0]] += ms
    return dict(by_key), data["kernel_ms"]


def pairs(op_counts: dict) -> list[tuple[str, estimate.Work, int, float]]:
    """(component, work of one node, nodes, measured ms of all its nodes) for every measured key."""
    rows = []
    for component, path in PROFILES.items():
        measured, _ = measured_by_key(path)
        listed = {key: (n, options) for key, n, options in op_counts[component]}
        missing = sorted(set(measured) - set(listed))
        if missing:
            raise SystemExit(f"{component}: measured ops missing from {OP_COUNTS.name}: {missing[:5]}")
        for key, ms in measured.items():
            n, options = listed[key]
            rows.append((component, estimate.key_work(key, WIDTH, options), n, ms))
    return rows


def fit(rows) -> estimate.Efficiency:
    eff = estimate.Efficiency(dict.fromkeys(estimate.KINDS, 1.0), 1.0)
    peak, bandwidth = H200["fp32_gflops"] * 1e9, H200["bandwidth_gbps"] * 1e9
    for _ in range(ROUNDS):
        ideal = {(k, s): 0.0 for k in estimate.KINDS for s in ("compute", "memory")}
        spent = dict.fromkeys(ideal, 0.0)
        for component, work, n, ms in rows:
            _, by_memory = estimate.kernel_seconds(work, peak / 1e9, bandwidth / 1e9, eff)
            side = "memory" if by_memory else "compute"
            weight = CALLS[component]
            ideal[work.kind, side] += weight * n * (work.nbytes / bandwidth if by_memory else work.flops / peak)
            spent[work.kind, side] += weight * max(ms / 1e3 - launches(work, n), 0.0)
        memory = min(1.0, sum(ideal[k, "memory"] for k in estimate.KINDS) / sum(spent[k, "memory"] for k in estimate.KINDS))
        eff = estimate.Efficiency({k: min(1.0, ideal[k, "compute"] / spent[k, "compute"]) if spent[k, "compute"] else memory
                                   for k in estimate.KINDS}, memory)
    return eff


def launches(work: estimate.Work, nodes: int) -> float:
    """Seconds of the fixed per-kernel cost the H200's event times hold (its smallest kernels take 4-8 us)."""
    return nodes * work.kernels * H200["launch_overhead_us"] * 1e-6


def model_ms(rows, eff: estimate.Efficiency) -> dict[str, dict[str, float]]:
    """Per component and kind: the fitted model's kernel ms per call."""
    out = collections.defaultdict(lambda: collections.defaultdict(float))
    for component, work, n, _ in rows:
        seconds, _ = estimate.kernel_seconds(work, H200["fp32_gflops"], H200["bandwidth_gbps"], eff)
        out[component][work.kind] += (n * seconds + launches(work, n)) * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops-from", type=Path, help="converted SD 1.5 folder (fp16, UNet batch 1) to count ops in")
    parser.add_argument("--write", action="store_true", help="write difflite/runtime/estimate_calibration.json")
    args = parser.parse_args()
    if args.ops_from:
        OP_COUNTS.write_text(json.dumps({"folder": "preset:sd15 --precision fp16 --batch 1 (512x512)",
                                         "components": count_ops(args.ops_from)}, indent=1) + "\n")
        print(f"wrote {OP_COUNTS}")
    op_counts = json.loads(OP_COUNTS.read_text())["components"]
    rows = pairs(op_counts)
    eff = fit(rows)
    modelled = model_ms(rows, eff)
    fit_report = {}
    print(f"{'component':14} {'measured ms':>12} {'model ms':>9} {'model/measured':>15}")
    for component, path in PROFILES.items():
        _, total = measured_by_key(path)
        model = sum(modelled[component].values())
        fit_report[component] = {"measured_kernel_ms": round(total, 3), "model_kernel_ms": round(model, 3),
                                 "ratio": round(model / total, 3),
                                 "by_kind_model_ms": {k: round(v, 3) for k, v in sorted(modelled[component].items())}}
        print(f"{component:14} {total:12.2f} {model:9.2f} {model / total:15.3f}")
    print("efficiency (share of peak):")
    for kind in estimate.KINDS:
        print(f"  {kind:10} compute {eff.compute[kind]:.4f}")
    print(f"  {'all':10} memory  {eff.memory:.4f}")
    if args.write:
        data = {"format": 1, "written_by": "benchmarks/estimate_calibration.py", "device": H200, "measured": MEASURED,
                "calls_weighting": CALLS,
                "efficiency": {"compute": {k: round(eff.compute[k], 5) for k in estimate.KINDS},
                               "memory": round(eff.memory, 5)},
                "fit": fit_report}
        estimate.CALIBRATION_FILE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {estimate.CALIBRATION_FILE}")


if __name__ == "__main__":
    main()
