"""Where a process's host memory goes while it loads and runs one component of a folder on the
OpenCL backend, as `difflite generate` does: a fresh process per component, its /proc status
(VmRSS split into RssAnon: heap and stacks, the process's own; RssFile: mapped files' pages,
libraries and the model's; RssShmem) and its GPU memory (nvidia-smi, where there is one) read
after each stage:

  start        Python, numpy and difflite imported
  delegate     the op library loaded and its OpenCL context made (load_delegate)
  interpreter  LiteRT's interpreter over the file, the delegate applied: the op library's claim
               and Prepare (the plan, the programs built, the weights uploaded)
  prepared     allocate_tensors
  ran          one call on seeded inputs
  trimmed      glibc's malloc_trim(0): what of RssAnon was freed memory the allocator kept
  released     the interpreter and the delegate dropped

and, at each stage, the six mappings holding the most resident memory (smaps' Rss by path).

    source benchmarks/device_setup.sh
    python benchmarks/host_memory_stages.py OUT [--components unet,vae_decoder] [--save FILE]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headline import folder_arguments, machine

PARTS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")

# argv: the model's path, the precision. Prints one JSON object: stage -> parts (MiB).
CHILD = r"""
import ctypes, gc, json, sys
import numpy as np
from difflite.core.procmem import nvidia_smi_mb, read_status
from difflite.runtime.component import delegate_for
from difflite.folder.schema import SIGNATURE_KEY
stages = {}
def mapped_files(top=6):
    # Rss per mapped file (smaps), the largest first: which file's pages RssFile holds
    rss, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else "[anon]"
            elif head and head[0] == "Rss:":
                rss[name] = rss.get(name, 0) + int(head[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(rss.items(), key=lambda kv: -kv[1])[:top]}
def note(stage):
    status = read_status()
    stages[stage] = {key: round(status.get(key, 0.0), 1) for key in PARTS}
    stages[stage]["gpu"] = nvidia_smi_mb()
    stages[stage]["mappings"] = mapped_files()
note("start")
from ai_edge_litert.interpreter import Interpreter
delegate = delegate_for("opencl", sys.argv[2])
note("delegate")
interpreter = Interpreter(model_path=sys.argv[1], experimental_delegates=[delegate])
note("interpreter")
interpreter.allocate_tensors()
note("prepared")
runner = interpreter.get_signature_runner(SIGNATURE_KEY)
rng = np.random.default_rng(0)
feeds = {}
for name, d in runner.get_input_details().items():
    feeds[name] = (np.full(d["shape"], 1, d["dtype"]) if np.issubdtype(d["dtype"], np.integer)
                   else rng.standard_normal(d["shape"]).astype(d["dtype"]))
runner(**feeds)
note("ran")
ctypes.CDLL("libc.so.6").malloc_trim(0)
note("trimmed")
del runner, interpreter, delegate
gc.collect()
note("released")
print(json.dumps(stages))
""".replace("PARTS", repr(PARTS))


def stages_of(path: Path, precision: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), precision], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{path}: exited {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser, args, manifest, names = folder_arguments(__doc__.split("\n\n")[0])
    precision = manifest["options"]["precision"]  # the delegate's, as generate sets it
    data = {"machine": machine(), "out": str(args.out), "precision": precision,
            "components": {name: stages_of(args.out / manifest["components"][name]["file"], precision)
                           for name in names}}
    if args.save:
        args.save.write_text(json.dumps(data, indent=2) + "\n")
    print("| component | stage | VmRSS | RssAnon | RssFile | RssShmem | GPU |\n|---|---|---|---|---|---|---|")
    for name, stages in data["components"].items():
        for stage, p in stages.items():
            print(f"| {name} | {stage} | {p['VmRSS']} | {p['RssAnon']} | {p['RssFile']} | {p['RssShmem']} | {p['gpu']} |")
    for name, stages in data["components"].items():
        print(f"\n{name}, after prepare, the largest mappings (MiB): {stages['prepared']['mappings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
