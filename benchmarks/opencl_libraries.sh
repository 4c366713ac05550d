# Which shared libraries a process maps, and how much of each is resident, once the op library has
# made its OpenCL context (difflite.runtime.component.delegate_for), and who asked for them: the
# OpenCL ICD files the loader reads, the loader's own library, and LD_DEBUG=files' record of each
# library's first requester. For host memory that is not the model's (notebook §78).
#
#   source benchmarks/device_setup.sh; bash benchmarks/opencl_libraries.sh
echo "== OCL_ICD_VENDORS=${OCL_ICD_VENDORS:-} OCL_ICD_FILENAMES=${OCL_ICD_FILENAMES:-}"
for d in /etc/OpenCL/vendors "${OCL_ICD_VENDORS:-/nonexistent}"; do
  [ -d "$d" ] && for f in "$d"/*.icd; do echo "$f: $(cat "$f")"; done
done
echo "== libOpenCL.so.1 resolves to: $(ldconfig -p | grep 'libOpenCL.so.1 ' | head -2)"
CHILD='
import re, sys
from difflite.runtime.component import delegate_for
d = delegate_for("opencl", "fp16")
rss = {}
path = None
for line in open("/proc/self/smaps"):
    head = line.split()
    if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
        path = head[5] if len(head) > 5 else "[anon]"
    elif head[0] == "Rss:":
        rss[path] = rss.get(path, 0) + int(head[1])
for p, kb in sorted(rss.items(), key=lambda kv: -kv[1])[:16]:
    print(f"{kb / 1024:8.1f} MiB  {p}")
'
python3 -c "$CHILD"
echo "== first requester of each LLVM / clang / pocl / mesa library (LD_DEBUG=files)"
LD_DEBUG=files python3 -c "$CHILD" 2>&1 >/dev/null | grep -E "file=.*(LLVM|clang|pocl|mesa|OpenCL|nvidia-opencl)" \
  | grep -E "needed by|dynamically loaded by" | head -20
