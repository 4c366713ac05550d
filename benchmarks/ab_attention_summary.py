"""Prints, per gpu_profile JSON (benchmarks/gpu_generic_ab.sh's output), the whole component's
kernel and wall ms and the attention kernels' ms summed by kernel label.

    python benchmarks/ab_attention_summary.py OUT/gpu_profile_unet_generic_*.json
"""
import json
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    data = json.load(open(path))
    by_label = defaultdict(float)
    for key, ms in data["ops_ms"].items():
        if key.startswith("difflite.Attention"):
            by_label[key.rsplit(" ", 1)[-1]] += ms
    labels = ", ".join(f"{label} {ms:.2f}" for label, ms in sorted(by_label.items()))
    print(f"{path.rsplit('/', 1)[-1]}: kernels {data['kernel_ms']:.2f} ms, wall {data['wall_ms_median']:.2f} ms; "
          f"attention {sum(by_label.values()):.2f} ms ({labels})")
