#!/bin/bash
# A/B of a kernel change on the lent GPU, side by side in one run: runs a benchmark command
# alternately in a baseline tree (a tarball of the commit before, e.g. `git archive HEAD`) and in
# this tree, ROUNDS times each (interleaved, so drift hits both alike). The command is run with
# $OUT_JSON set to a per-run JSON path (e.g. "python3 benchmarks/gpu_ablation.py --cases GroupNorm
# --out \$OUT_JSON"). Source benchmarks/device_setup.sh first.
#
#   lab/gpu_ab.sh BASE.tar "COMMAND" [ROUNDS]
#
# Output: $OUT/ab_{base,new}_<round>.{json,txt}. PYTHONPATH is /tmp/site (device_setup.sh's wheels) and the tree.
base_tar=$1
cmd=$2
rounds=${3:-2}
out=${OUT:-/tmp/ab}
[ -f "$base_tar" ] && [ -n "$cmd" ] || { echo "usage: gpu_ab.sh BASE.tar \"COMMAND\" [ROUNDS]" >&2; exit 2; }
mkdir -p "$out" /tmp/ab_base
tar -xf "$base_tar" -C /tmp/ab_base
new=$PWD
for r in $(seq 1 "$rounds"); do
  for side in base new; do
    dir=$new; [ "$side" = base ] && dir=/tmp/ab_base
    (cd "$dir" && OUT_JSON="$out/ab_${side}_$r.json" PYTHONPATH="/tmp/site:$dir" bash -c "$cmd") \
      > "$out/ab_${side}_$r.txt" 2>&1
    echo "== $side round $r (rc $?)"; tail -n "${TAIL:-12}" "$out/ab_${side}_$r.txt"
  done
done
