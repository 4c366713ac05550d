"""The model file's pages of the weights the OpenCL backend copies to the device leave the process
after the upload (custom_ops/delegate/opencl/weights.cc: each constant's whole pages as it is
written, then ReleaseAgain over runs of neighbouring constants, their shared pages too).

Why a second pass: a page cache of large folios (Linux 6.x) maps a whole folio, up to 2 MiB, on a
fault, so reading a small constant after its neighbours were released maps them back (on the
2-core host, 154 MiB of an SD 1.5 int4 UNet's 533 came back so; on an H200 ~440 MiB of SDXL's int4
UNet). The test makes that deterministic on any kernel: a child process maps the model (LiteRT's
interpreter), reads every page of it, then prepares it with the weights copied (zero_copy=off) and
counts, from /proc/self/pagemap, the pages of the weights' segment still mapped.

OpenCL missing is a failure with the reason, never a skip.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ai_edge_litert import schema_py_generated as schema

from support.cli import convert_side_by_side

CONVERSIONS = {
    "fp32": ["--precision", "fp32"],
    "int4": ["--precision", "fp16", "--weights", "int4"],
}

# argv: model, op library, the weights' first byte in the file. Prints {"pages", "before", "after"}:
# the segment's pages, and how many were mapped after reading them all and after the upload.
CHILD = r"""
import ctypes, json, os, struct, sys
from ai_edge_litert.interpreter import Interpreter, load_delegate
model, library, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
PAGE = os.sysconf("SC_PAGE_SIZE")
options = {"backend": "opencl", "precision": "fp16", "kernels": "tiled", "zero_copy": "off"}
interpreter = Interpreter(model_path=model, experimental_delegates=[load_delegate(library, options)])
real = os.path.realpath(model)
(lo, hi), = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in open("/proc/self/maps")
             if line.rstrip().endswith(real) and int(line.split()[2], 16) == 0]
first = lo + (start + PAGE - 1) // PAGE * PAGE  # the weights' first whole page
pages = (hi - first) // PAGE
def mapped():
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first // PAGE * 8)
        data = f.read(pages * 8)
    return sum(struct.unpack_from("<Q", data, 8 * i)[0] >> 63 for i in range(pages))
for address in range(lo, hi, PAGE):
    ctypes.string_at(address, 1)
before = mapped()
interpreter.allocate_tensors()
print(json.dumps({"pages": pages, "before": before, "after": mapped()}))
"""


@pytest.fixture(scope="module")
def unets(tmp_path_factory):
    base = tmp_path_factory.mktemp("model_pages")
    out = {name: base / name for name in CONVERSIONS}
    convert_side_by_side({name: ["preset:tiny", *flags, "-o", out[name], "--height", 64, "--width", 64,
                                 "--components", "unet", "--weights-layout", "appended"]
                          for name, flags in CONVERSIONS.items()})
    return {name: folder / "unet.tflite" for name, folder in out.items()}


def weights_start(path) -> int:
    """The first byte of the appended weights (every buffer's data lies after the flatbuffer)."""
    model = schema.Model.GetRootAs(path.read_bytes(), 0)
    return min(model.Buffers(i).Offset() for i in range(model.BuffersLength()) if model.Buffers(i).Size())


@pytest.mark.parametrize("weights", CONVERSIONS)
def test_copied_weights_leave_no_page_behind(opencl_lib, unets, weights):
    path = unets[weights]
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(opencl_lib), str(weights_start(path))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts["pages"] > 16 and counts["before"] == counts["pages"], counts  # all read, all mapped
    assert counts["after"] == 0, counts
