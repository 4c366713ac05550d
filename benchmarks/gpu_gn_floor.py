"""Where gn_coop's time goes: the library's cooperative GroupNorm kernel ("exchange": every
work-group gathers every sibling's partial sums) against the same kernel with its exchange compiled
out ("floor": every slice normalised by its own sums: wrong output, timing only), over block widths
(groups a block: row stretches of 160 B to whole rows), work-groups per compute unit and work-group
limits, with a same-size copy as the ceiling. The exchange's row minus the floor is what it costs;
the floor against the copy is what the access pattern, reductions and launch cost.

    python benchmarks/gpu_gn_floor.py [--shapes 1x4096x320,2x4096x320] [--runs 20]

Writes benchmarks/results/gpu_gn_floor_<device>.json (or $OUT/...) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_out import write_result  # noqa: E402
from gpu_ablation import measure, same_size_copy_bandwidth  # noqa: E402
from gpu_kernels_harness.launch import (COOP_MAX_GATHER, CoopPlan, Runner, ceil_div, cl_source,  # noqa: E402
                                         gn_coop_plan)
from gpu_kernels_harness.unfused import Unfused  # noqa: E402

FLOOR_OPTION = "-DGN_FLOOR_EXPERIMENT=1"
EXCHANGE_CALL = "  if (K > 1) {\n    gn_exchange("


class FloorRunner(Runner):
    """A Runner whose group_norm programs built with FLOOR_OPTION skip gn_coop's exchange."""

    def program(self, path: Path, options: str = ""):
        if FLOOR_OPTION not in options:
            return super().program(path, options)
        key = (str(path), options)
        if key not in self._programs:
            src = cl_source(path)
            if EXCHANGE_CALL not in src:
                raise SystemExit("gn_coop's exchange call not found: update EXCHANGE_CALL")
            import pyopencl as cl
            head, kernel = src.split("__kernel void gn_coop(")
            src = head + "__kernel void gn_coop(" + kernel.replace(EXCHANGE_CALL, "  if (0) {\n    gn_exchange(")
            self._programs[key] = cl.Program(self.ctx, src).build(
                options=f"{self.base_options} {options}".split())
        return self._programs[key]


class FloorPlan(CoopPlan):
    def options(self) -> str:
        return super().options() + " " + FLOOR_OPTION


def plan_for(n: int, groups: int, spatial: int, cg: int, gpw: int, limit: int, cus: int, per_cu: int,
             floats: int) -> CoopPlan:
    """PlanCoop's arithmetic with the block width given (gpw groups in float4 columns), no cap on slices."""
    lx = gpw * cg // 4
    ly = max(1, min(limit // lx, spatial))
    k = max(1, min(ceil_div(cus * per_cu, n * (groups // gpw)), spatial))
    rows = ceil_div(spatial, k)
    per_item = ceil_div(rows, ly)
    chunks = ceil_div(per_item, max(1, floats // 4))
    return CoopPlan(4, lx, ly, gpw, ceil_div(per_item, chunks), ceil_div(spatial, rows), rows, chunks)


def sweep(r: FloorRunner, u: Unfused, shape, groups: int, runs: int) -> dict:
    n, spatial, c = shape
    cg = c // groups
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, c).astype(np.float32)
    xb, gb, bb, y = r.upload(x), r.upload(gamma), r.upload(beta), r.empty(shape)
    moved = 4 * 2 * x.size
    library = gn_coop_plan(n, groups, spatial, cg, min(128, r.max_wg), r.compute_units)
    rows = []
    for gpw in [d for d in range(1, groups + 1) if groups % d == 0 and (d * cg) % 8 == 0]:
        for limit in (128, 256):
            for per_cu in (2, 3, 4):
                plan = plan_for(n, groups, spatial, cg, gpw, limit, r.compute_units, per_cu, 32)
                if plan.lx * plan.ly > min(limit, r.max_wg) or plan.lx > limit:
                    continue
                variants = [("floor", FloorPlan(**plan.__dict__))]
                if plan.k * gpw <= COOP_MAX_GATHER * plan.lx * plan.ly:  # PlanCoop's gather limit
                    variants.insert(0, ("exchange", plan))
                for variant, p in variants:
                    if r.max_work_group(r.kernel("group_norm", "gn_coop", p.options())) < p.lx * p.ly:
                        continue
                    chain = measure(lambda p=p: r.group_norm(xb, gb, bb, y, shape, groups, 1e-5, True,
                                                             plan="coop", coop=p), runs, 3, r.queue)[0]
                    rows.append({"gpw": gpw, "row_bytes": gpw * cg * 4, "limit": limit, "per_cu": per_cu,
                                 "plan": plan.__dict__, "library_plan": plan == library,
                                 "variant": variant, "us": chain * 1e6,
                                 "gbs": moved / chain / 1e9})
    copy = same_size_copy_bandwidth(r, u, moved, runs, 3)
    for row in rows:
        row["of_same_size_copy"] = row["gbs"] * 1e9 / copy
    return {"shape": list(shape), "groups": groups, "same_size_copy_gbs": copy / 1e9,
            "copy_us": moved / copy * 1e6, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x4096x320,2x4096x320", help="comma-separated NxSxC shapes")
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    r = FloorRunner()
    u = Unfused(r)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    results = [sweep(r, u, s, args.groups, args.runs) for s in shapes]
    device = r.device.name.strip()
    for res in results:
        print(f"\n{device}: gn_coop at {res['shape']}, {res['groups']} groups; same-size copy "
              f"{res['copy_us']:.1f} us ({res['same_size_copy_gbs']:.0f} GB/s)")
        print("| groups a block (row bytes) | limit | per CU | lx x ly, k, items x chunks | variant | us | of copy |")
        print("|---|---|---|---|---|---|---|")
        for row in res["rows"]:
            p = row["plan"]
            mark = " (library)" if row["library_plan"] else ""
            print(f"| {row['gpw']} ({row['row_bytes']} B){mark} | {row['limit']} | {row['per_cu']} | {p['lx']}x{p['ly']}, "
                  f"{p['k']}, {p['items']}x{p['chunks']} | {row['variant']} | {row['us']:.1f} | "
                  f"{row['of_same_size_copy']:.0%} |")
    print("\nBest of each variant:")
    for res in results:
        for variant in ("exchange", "floor"):
            rows = [row for row in res["rows"] if row["variant"] == variant]
            if rows:
                best = min(rows, key=lambda row: row["us"])
                lib = [row for row in rows if row["library_plan"]]
                lib_text = f"; library plan {lib[0]['us']:.1f} us ({lib[0]['of_same_size_copy']:.0%})" if lib else ""
                print(f"{res['shape']} {variant}: {best['us']:.1f} us ({best['of_same_size_copy']:.0%}) at "
                      f"{best['gpw']} groups, limit {best['limit']}, {best['per_cu']} a CU{lib_text}")
    write_result("gpu_gn_floor", device, {"device": device, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
