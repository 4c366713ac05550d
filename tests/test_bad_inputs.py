"""The bad-input corpus (issue 16): every command against missing, empty, unreadable and
wrong-kind paths; damaged checkpoints, .tflite files and manifests; configs and sizes difflite
cannot take; absurd option values; an output that is a file, read-only or on a full filesystem;
an op library that is missing, no shared library or for another machine; JSON files nested
hundreds of thousands of levels deep or larger than difflite reads, and token ids beyond int32 or
the text encoder's vocabulary (issue 35).

Each case runs the real command line in a subprocess and must fail cleanly: exit code 2 (bad
input; exit 1, a failed verification, is test_convert_cli.py's), one `difflite: error:` line
naming the culprit as the last line of stderr (before it only convert's `[difflite]` progress and
LiteRT's INFO line), no traceback, no signal, and nothing written: the case's folder, and the
shared conversion where it reads it, are byte-identical afterwards (an absent output stays
absent).

The cases share one tiny conversion and run two at a time (most of their cost is starting Python
and importing torch). The read-only and full filesystems are small tmpfs mounts (the tests run as
root, which ignores permission bits; "unreadable" runs the command without root's
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, through util-linux's setpriv)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import ROOT, hostile_images

CLI = (sys.executable, "-m", "difflite")
SIZE = ("--height", "32", "--width", "32")
WORKERS = 2  # the machine's cores: each case is one mostly single-threaded process
WITHOUT_ROOT_READS = ("setpriv", "--inh-caps=-dac_override,-dac_read_search",
                      "--bounding-set=-dac_override,-dac_read_search")
# An op library for another machine than this one (ELF e_machine, and the name difflite gives it)
FOREIGN_MACHINE = (62, "x86-64") if platform.machine().lower() in ("aarch64", "arm64") else (183, "aarch64")
UNET_WEIGHT = "model.diffusion_model.input_blocks.0.0.weight"
TORCH_SEEDS_END = 2**64
EXIT_BAD_INPUT = 2
DEEP_JSON = "[" * 200_000  # far past CPython's recursion limit (json.loads: RecursionError near 1000)
NESTED = "nested more than"
TOKEN_TABLE_ROWS = 1024  # preset:tiny's text encoder vocabulary


# ---------------------------------------------------------------------------------------------
# Inputs, written by hand


def safetensors_bytes(tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict | None = None) -> bytes:
    """A .safetensors file: 8-byte header length, JSON header, data. tensors: name -> (dtype,
    shape, raw bytes); metadata: the header's __metadata__ (str -> str)."""
    header, data = ({"__metadata__": metadata} if metadata else {}), b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def one_unet_weight(dtype: str = "F32") -> bytes:
    return safetensors_bytes({UNET_WEIGHT: (dtype, [2, 2], bytes(16))})


def lora_with_metadata(metadata: str) -> bytes:
    """A diffusers-layout LoRA file whose lora_adapter_metadata is `metadata`."""
    return safetensors_bytes({"unet.conv_in.lora_A.weight": ("F32", [2, 2], bytes(16))},
                             {"lora_adapter_metadata": metadata})


def elf_library(machine: int) -> bytes:
    """The first bytes of a 64-bit little-endian ELF shared object for `machine`."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    return ident + (3).to_bytes(2, "little") + machine.to_bytes(2, "little") + bytes(44) + bytes(4096)


UNET_CONFIG = {"_class_name": "UNet2DConditionModel", "block_out_channels": [32, 64], "layers_per_block": 1,
               "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
               "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 32,
               "attention_head_dim": 8, "norm_num_groups": 8, "sample_size": 8}


def diffusers_folder(folder: Path, unet: dict | None = None, index: dict | None = None) -> Path:
    """The layout of a diffusers Stable Diffusion folder: configs, a tokenizer and a weight file
    per model (with no tensors: the cases fail on the configs, before weights are read)."""
    model_index = {"_class_name": "StableDiffusionPipeline", "text_encoder": ["transformers", "CLIPTextModel"],
                   "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
                   "tokenizer": ["transformers", "CLIPTokenizer"], "scheduler": ["diffusers", "PNDMScheduler"],
                   **(index or {})}
    write(folder / "model_index.json", json.dumps(model_index))
    configs = {"text_encoder": {}, "unet": unet or UNET_CONFIG, "vae": {}}
    for name, config in configs.items():
        write(folder / name / "config.json", json.dumps(config))
        write(folder / name / "diffusion_pytorch_model.safetensors", safetensors_bytes({}))
    write(folder / "scheduler" / "scheduler_config.json", json.dumps({"_class_name": "PNDMScheduler"}))
    write(folder / "tokenizer" / "vocab.json", "{}")
    write(folder / "tokenizer" / "merges.txt", "")
    return folder


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def truncate_to_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def unreadable(path: Path) -> Path:
    path.chmod(0)
    return path


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_manifest(folder: Path, change: Callable[[dict], None]) -> None:
    edit_json(folder / "manifest.json", change)


def larger_than_read(path: Path) -> None:
    """`path` as a sparse file one byte larger than difflite reads for a JSON file (no disk blocks)."""
    from difflite.core.jsonfile import MAX_BYTES

    with open(path, "wb") as sparse:
        sparse.truncate(MAX_BYTES + 1)


def first_token_id(token_id: int) -> Callable[[Path], None]:
    """A change of an output folder: its tokenizer.json gives the first vocabulary token `token_id`."""
    def change(out: Path) -> None:
        def renumber(pipeline: dict) -> None:
            vocab = pipeline["model"]["vocab"]
            vocab[next(iter(vocab))] = token_id
        edit_json(out / "tokenizer" / "tokenizer.json", renumber)
    return change


def retyped_sample(model: Path, tensor_type: int, target: Path | None = None) -> bytes:
    """The UNet `model` with its `sample` input's stored type set to `tensor_type`, written to
    `target` (default: in place)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    flat = schema.ModelT.InitFromPackedBuf(bytearray(model.read_bytes()), 0)
    subgraph = flat.subgraphs[0]
    subgraph.tensors[subgraph.inputs[0]].type = tensor_type
    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(flat.Pack(builder), file_identifier=b"TFL3")
    data = bytes(builder.Output())
    (target or model).write_bytes(data)
    return data


def int8_sample_unet(folder: Path) -> None:
    """unet.tflite with its `sample` input stored as int8, and the manifest describing the new
    file (its sha256 and size): a file the manifest vouches for that LiteRT cannot run."""
    from ai_edge_litert import schema_py_generated as schema

    data = retyped_sample(folder / "unet.tflite", schema.TensorType.INT8)
    edit_manifest(folder, lambda manifest: manifest["components"]["unet"].update(
        sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)))


NO_TFLITE_TYPE = 99

LORA_LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"  # a Linear [32, 32] of preset:tiny
NAN_VAE_WEIGHT = "decoder.conv_out.weight"


def kohya_lora(value: float) -> bytes:
    """A kohya LoRA of rank 4 on preset:tiny's LORA_LAYER, every value `value` (no alpha: a factor
    of 1), so the merge adds scale * 4 * value**2 to each weight."""
    key = "lora_unet_" + LORA_LAYER.replace(".", "_")
    values = struct.pack("<f", value) * 128
    return safetensors_bytes({f"{key}.lora_down.weight": ("F32", [4, 32], values),
                              f"{key}.lora_up.weight": ("F32", [32, 4], values)})


def vae_with_a_nan(folder: Path) -> None:
    """preset:tiny's VAE as a diffusers vae folder, one weight of it NaN."""
    import torch
    from diffusers import AutoencoderKL

    from difflite.compiler.presets import preset_configs

    vae = AutoencoderKL.from_config(preset_configs("tiny")["vae"])
    with torch.no_grad():
        vae.get_parameter(NAN_VAE_WEIGHT)[0, 0, 0, 0] = float("nan")
    vae.save_pretrained(folder)


# ---------------------------------------------------------------------------------------------
# The shared inputs: one conversion, two small filesystems


class Corpus:
    """The folder of the module's inputs: the tiny conversion (made in the background, waited for
    by the cases that read it), a read-only and a full tmpfs, and a folder per case."""

    def __init__(self, base: Path):
        self.base = base
        self.out = base / "out"
        self.ro = base / "ro"
        self.full = base / "full"
        self.mounted: list[Path] = []
        self._lock = threading.Lock()
        self._converted = False
        self._log = base / "convert.log"
        with open(self._log, "w") as log:  # a file, not a pipe nobody reads while it runs
            self._conversion = subprocess.Popen(
                [*CLI, "convert", "preset:tiny", "-o", str(self.out), *SIZE, "--no-fuse", "--json"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)

    def converted(self) -> Path:
        with self._lock:
            if not self._converted:
                self._conversion.wait(timeout=600)
                assert self._conversion.returncode == 0, \
                    f"the tiny conversion failed:\n{self._log.read_text()[-3000:]}"
                self._converted = True
        return self.out

    def copy_of_out(self, folder: Path) -> Path:
        return Path(shutil.copytree(self.converted(), folder / "out"))

    def placeholders(self, case_id: str) -> dict[str, str]:
        return {"t": str(self.base / "cases" / case_id), "ro": str(self.ro), "full": str(self.full),
                "id": case_id, "out": str(self.out), "build": str(self.base / "oplib-build")}

    def mount(self, folder: Path, size: str) -> None:
        folder.mkdir()
        run = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True, check=False)
        if run.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs at {folder} ({run.stderr.strip()}): the read-only and "
                        f"full-filesystem cases need root and mount")
        self.mounted.append(folder)

    def make_read_only(self) -> None:
        """A tmpfs remounted read-only, holding an existing output folder (a user's file in it)."""
        self.mount(self.ro, "1m")
        write(self.ro / "existing" / "notes.txt", "a user's file")
        subprocess.run(["mount", "-o", "remount,ro", str(self.ro)], check=True)
        try:
            (self.ro / "probe").write_text("x")
        except OSError as exc:
            assert exc.errno == errno.EROFS, exc
        else:
            pytest.fail(f"{self.ro}: remounted read-only but still writable")

    def make_full(self, case_ids) -> None:
        """A full tmpfs with an empty folder per case (made before it filled up)."""
        self.mount(self.full, "1m")
        for case_id in case_ids:
            (self.full / case_id).mkdir()
        with open(self.full / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(bytes(1 << 16))
                    filler.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        try:
            (self.full / "probe").write_bytes(bytes(4096))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        else:
            pytest.fail(f"{self.full}: filled up but still takes 4 KiB")
        (self.full / "probe").unlink()

    def close(self) -> None:
        if self._conversion.poll() is None:
            self._conversion.kill()
            self._conversion.wait()
        for folder in reversed(self.mounted):
            subprocess.run(["umount", str(folder)], check=False)


# ---------------------------------------------------------------------------------------------
# The cases


@dataclass(frozen=True)
class Case:
    """One command line and what its failure must say. Strings may hold placeholders: {t} this
    case's own folder (made empty; `prepare` fills it), {out} the shared tiny conversion, {ro} and
    {full} the read-only and the full filesystem, {id} the case's id, {build} an op library build
    folder that is up to date (no CMake runs)."""
    id: str
    args: tuple[str, ...]
    culprit: tuple[str, ...]  # each in the error line
    prepare: Callable[[Path, Corpus], object] | None = None
    env: dict = field(default_factory=dict)
    watch: tuple[str, ...] = ()  # besides {t} (and {out} where the command names it): unchanged
    without_root_reads: bool = False

    @property
    def reads_out(self) -> bool:
        return any("{out}" in a for a in self.args)

    def watched(self) -> tuple[str, ...]:
        return ("{t}", *(("{out}",) if self.reads_out else ()), *self.watch)


def case(id, args, *culprit, **kwargs) -> Case:
    return Case(id, tuple(args.split()) if isinstance(args, str) else tuple(args), culprit, **kwargs)


def _(build: Callable[[Path], object]) -> Callable[[Path, Corpus], object]:
    """A prepare step that needs only the case's folder."""
    return lambda folder, corpus: build(folder)


def damaged_out(change: Callable[[Path], object]) -> Callable[[Path, Corpus], object]:
    """A copy of the tiny conversion at {t}/out, changed by `change(folder)`."""
    return lambda folder, corpus: change(corpus.copy_of_out(folder))


def fake_built_library(folder: Path) -> None:
    """An op library build folder whose library is newer than every source: `oplib build` takes
    it as up to date and runs no CMake (64 KiB, so that copying it fills a full disk)."""
    write(folder / "libdifflite_delegate.so", elf_library(62) + bytes(1 << 16))


OPLIBS = {
    "missing": ("{t}/nothing.so", "no such file", None),
    "not-a-library": ("{t}/notes.so", "not a shared library", lambda f: write(f / "notes.so", "a text file\n")),
    "for-another-machine": ("{t}/foreign.so", f"built for {FOREIGN_MACHINE[1]}",
                            lambda f: write(f / "foreign.so", elf_library(FOREIGN_MACHINE[0]))),
}


def oplib_cases(command: str, args: str) -> list[Case]:
    return [case(f"{command}-oplib-{kind}", args, path, reason, prepare=_(make) if make else None,
                 env={"DIFFLITE_OPLIB": path})
            for kind, (path, reason, make) in OPLIBS.items()]


CONVERT = [
    # paths: the model (the missing and empty folder cases are in test_convert_cli.py)
    case("convert-model-empty-file", "convert {t}/model.safetensors -o {t}/OUT", "{t}/model.safetensors",
         "cannot read checkpoint", prepare=_(lambda f: write(f / "model.safetensors", b""))),
    case("convert-model-unreadable", "convert {t}/model.safetensors -o {t}/OUT", "{t}/model.safetensors",
         "Permission denied", prepare=_(lambda f: unreadable(write(f / "model.safetensors", one_unet_weight()))),
         without_root_reads=True),
    case("convert-model-wrong-kind", "convert {t}/model.txt -o {t}/OUT", "{t}/model.txt",
         "not a diffusers folder, .safetensors or .ckpt", prepare=_(lambda f: write(f / "model.txt", "hello"))),
    # checkpoints
    case("convert-checkpoint-truncated", "convert {t}/model.safetensors -o {t}/OUT", "{t}/model.safetensors",
         "cannot read checkpoint",
         prepare=_(lambda f: truncate_to_half(write(f / "model.safetensors", one_unet_weight())))),
    case("convert-checkpoint-bit-flipped", "convert {t}/model.safetensors -o {t}/OUT", "{t}/model.safetensors",
         "cannot read checkpoint",
         prepare=_(lambda f: flip_bit(write(f / "model.safetensors", one_unet_weight()), offset=5))),
    case("convert-checkpoint-integer-weights", "convert {t}/model.safetensors -o {t}/OUT",
         "{t}/model.safetensors", UNET_WEIGHT, "int32",
         prepare=_(lambda f: write(f / "model.safetensors", one_unet_weight("I32")))),
    # configs
    case("convert-config-unknown-block", "convert {t}/sd -o {t}/OUT", "{t}/sd/unet", "MagicDownBlock2D",
         prepare=_(lambda f: diffusers_folder(f / "sd", unet={
             **UNET_CONFIG, "down_block_types": ["MagicDownBlock2D", "DownBlock2D"]}))),
    case("convert-config-custom-attention-class", "convert {t}/sd -o {t}/OUT", "{t}/sd/model_index.json",
         "UNetWithCustomAttnProcessor",
         prepare=_(lambda f: diffusers_folder(f / "sd", index={
             "unet": ["my_attention", "UNetWithCustomAttnProcessor"]}))),
    # JSON nested past the parser's recursion: a model folder's files, a recipe, a profile, a LoRA's metadata
    case("convert-model-index-nested-deep", "convert {t}/sd -o {t}/OUT", "{t}/sd/model_index.json", NESTED,
         prepare=_(lambda f: write(diffusers_folder(f / "sd") / "model_index.json", DEEP_JSON))),
    case("convert-unet-config-nested-deep", "convert {t}/sd -o {t}/OUT", "{t}/sd/unet/config.json", NESTED,
         prepare=_(lambda f: write(diffusers_folder(f / "sd") / "unet" / "config.json", DEEP_JSON))),
    case("convert-scheduler-config-nested-deep", "convert {t}/sd -o {t}/OUT", "{t}/sd/scheduler/scheduler_config.json",
         NESTED, prepare=_(lambda f: write(diffusers_folder(f / "sd") / "scheduler" / "scheduler_config.json",
                                           DEEP_JSON))),
    case("convert-tokenizer-vocab-nested-deep", "convert {t}/sd -o {t}/OUT", "{t}/sd/tokenizer/vocab.json", NESTED,
         prepare=_(lambda f: write(diffusers_folder(f / "sd") / "tokenizer" / "vocab.json", DEEP_JSON))),
    case("convert-weights-recipe-nested-deep", "convert preset:tiny -o {t}/OUT --weights int8 --weights-recipe "
         "{t}/recipe.json", "{t}/recipe.json", NESTED, prepare=_(lambda f: write(f / "recipe.json", DEEP_JSON))),
    case("convert-device-profile-nested-deep", "convert preset:tiny -o {t}/OUT --device-profile {t}/gpu.json",
         "{t}/gpu.json", NESTED, prepare=_(lambda f: write(f / "gpu.json", DEEP_JSON))),
    case("convert-lora-metadata-nested-deep", "convert preset:tiny -o {t}/OUT --lora {t}/lora.safetensors",
         "{t}/lora.safetensors", "lora_adapter_metadata", NESTED,
         prepare=_(lambda f: write(f / "lora.safetensors", lora_with_metadata(DEEP_JSON)))),
    # sizes
    case("convert-height-the-unet-cannot-take", "convert preset:tiny -o {t}/OUT --height 40 --width 32",
         "height 40", "multiple of 16"),
    case("convert-size-no-tensor-can-hold", "convert preset:tiny -o {t}/OUT --height 65536 --width 65536",
         "--height 65536 --width 65536", "more than a tensor may hold"),
    # options
    case("convert-winograd-budget-infinite", ["convert", "preset:tiny", "-o", "{t}/OUT", "--winograd-budget-mb",
                                              "inf"], "--winograd-budget-mb inf"),
    case("convert-export-cache-is-a-file", "convert preset:tiny -o {t}/OUT --export-cache {t}/cache",
         "{t}/cache", "is a file", prepare=_(lambda f: write(f / "cache", "a file"))),
    # LoRA scales past +-1000, LoRA values and merges that are not finite, weights float16 cannot hold, a VAE
    # that is not finite: refused, naming the file and the layer
    *(case(f"convert-lora-scale-{name}", ["convert", "preset:tiny", "-o", "{t}/OUT", "--lora",
                                          f"{{t}}/lora.safetensors:{scale}"],
           f"--lora {{t}}/lora.safetensors:{scale}", "must be a finite number from -1000 to 1000",
           prepare=_(lambda f: write(f / "lora.safetensors", kohya_lora(0.1)))) for name, scale in (
        ("nan", "nan"), ("infinite", "-inf"), ("1e30", "1e30"), ("1e9", "1e9"), ("just-past-the-bound", "1000.5"))),
    *(case(f"convert-lora-values-{name}", "convert preset:tiny -o {t}/OUT --lora {t}/lora.safetensors",
           "{t}/lora.safetensors", "lora_down.weight holds NaN or infinite values",
           prepare=_(lambda f, value=value: write(f / "lora.safetensors", kohya_lora(value))))
      for name, value in (("nan", float("nan")), ("infinite", float("inf")))),
    case("convert-lora-merge-overflows", "convert preset:tiny -o {t}/OUT --lora {t}/lora.safetensors",
         "{t}/lora.safetensors", f"unet.{LORA_LAYER}.weight", "1024 of its 1024 values are NaN or infinite",
         prepare=_(lambda f: write(f / "lora.safetensors", kohya_lora(1e20)))),
    case("convert-lora-overflows-float16", ["convert", "preset:tiny", "-o", "{t}/OUT", *SIZE, "--components", "unet",
                                            "--precision", "fp16", "--lora", "{t}/lora.safetensors:1000"],
         f"layer unet.{LORA_LAYER}:", "stored as float16", "the LoRA {t}/lora.safetensors merged at scale 1000",
         prepare=_(lambda f: write(f / "lora.safetensors", kohya_lora(10.0)))),
    case("convert-vae-not-finite", "convert preset:tiny -o {t}/OUT --vae {t}/vae", "{t}/vae",
         f"VAE parameter {NAN_VAE_WEIGHT}", "1 of its", prepare=_(lambda f: vae_with_a_nan(f / "vae"))),
    # the output
    case("convert-out-is-a-file", "convert preset:tiny -o {t}/OUT", "{t}/OUT", "is a file",
         prepare=_(lambda f: write(f / "OUT", "a file"))),
    case("convert-out-read-only", "convert preset:tiny -o {ro}/existing", "{ro}/existing", "not writable",
         watch=("{ro}/existing",)),
    case("convert-out-on-a-full-disk", ["convert", "preset:tiny", "-o", "{full}/{id}/OUT", *SIZE],
         "{full}/{id}/OUT", "No space left on device", watch=("{full}/{id}",)),
]

INSPECT = [
    case("inspect-missing", "inspect {t}/nothing.tflite", "{t}/nothing.tflite", "no such file"),
    case("inspect-empty-file", "inspect {t}/empty.tflite", "{t}/empty.tflite", "empty file",
         prepare=_(lambda f: write(f / "empty.tflite", b""))),
    case("inspect-unreadable", "inspect {t}/model.tflite", "{t}/model.tflite", "not readable",
         prepare=lambda f, corpus: unreadable(Path(shutil.copy(corpus.converted() / "unet.tflite",
                                                               f / "model.tflite"))),
         without_root_reads=True),
    case("inspect-wrong-kind", "inspect {t}/model.safetensors", "{t}/model.safetensors", "not a .tflite model",
         prepare=_(lambda f: write(f / "model.safetensors", one_unet_weight()))),
    case("inspect-tflite-bit-flipped", "inspect {t}/unet.tflite", "{t}/unet.tflite",
         prepare=lambda f, corpus: flip_bit(Path(shutil.copy(corpus.converted() / "unet.tflite", f)), 0, 6)),
    case("inspect-tflite-unknown-dtype", "inspect {t}/unet.tflite", "{t}/unet.tflite", "'sample'",
         "no TFLite type", prepare=lambda f, corpus: retyped_sample(corpus.converted() / "unet.tflite",
                                                                   NO_TFLITE_TYPE, f / "unet.tflite")),
    case("inspect-manifest-not-an-object", "inspect {t}/out", "{t}/out/manifest.json", "not a difflite manifest",
         prepare=damaged_out(lambda out: write(out / "manifest.json", "[]"))),
    case("inspect-manifest-nested-deep", "inspect {t}/out", "{t}/out/manifest.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "manifest.json", DEEP_JSON))),
    case("inspect-manifest-larger-than-read", "inspect {t}/out", "{t}/out/manifest.json", "bytes, larger than",
         prepare=damaged_out(lambda out: larger_than_read(out / "manifest.json"))),
    case("inspect-manifest-from-the-future", "inspect {t}/out", "{t}/out/manifest.json", "format version 2",
         prepare=damaged_out(lambda out: edit_manifest(out, lambda m: m.update(format_version=2)))),
    case("inspect-tflite-changed-since-conversion", "inspect {t}/out", "{t}/out/unet.tflite", "sha256",
         prepare=damaged_out(lambda out: flip_bit(out / "unet.tflite", (out / "unet.tflite").stat().st_size // 2))),
]

VERIFY = [
    case("verify-missing", "verify {t}/nowhere", "{t}/nowhere", "no such folder"),
    case("verify-out-is-a-file", "verify {t}/model.tflite", "{t}/model.tflite", "not a folder",
         prepare=_(lambda f: write(f / "model.tflite", b"TFL3"))),
    case("verify-unreadable-manifest", "verify {t}/out", "{t}/out/manifest.json", "Permission denied",
         prepare=damaged_out(lambda out: unreadable(out / "manifest.json")), without_root_reads=True),
    case("verify-manifest-nested-deep", "verify {t}/out", "{t}/out/manifest.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "manifest.json", DEEP_JSON))),
    case("verify-tflite-truncated", "verify {t}/out", "{t}/out/unet.tflite", "bytes, but the manifest says",
         prepare=damaged_out(lambda out: truncate_to_half(out / "unet.tflite"))),
    case("verify-seeds-beyond-torch", f"verify {{out}} --seeds 0,{TORCH_SEEDS_END}", "--seeds",
         str(TORCH_SEEDS_END)),
    case("verify-opencl-oplib-for-another-machine", "verify {out} --backend opencl", "{t}/foreign.so",
         "DIFFLITE_OPLIB", f"built for {FOREIGN_MACHINE[1]}",
         prepare=_(lambda f: write(f / "foreign.so", elf_library(FOREIGN_MACHINE[0]))),
         env={"DIFFLITE_OPLIB": "{t}/foreign.so"}),
]

GENERATE_ONE = "generate {out} prompt -o {t}/x.png"
GENERATE = [
    case("generate-empty-folder", "generate {t}/empty prompt -o {t}/x.png", "{t}/empty", "no manifest.json",
         prepare=_(lambda f: (f / "empty").mkdir())),
    case("generate-out-is-a-file", "generate {t}/notes.txt prompt -o {t}/x.png", "{t}/notes.txt",
         "not a folder", prepare=_(lambda f: write(f / "notes.txt", "hello"))),
    case("generate-unreadable-manifest", "generate {t}/out prompt -o {t}/x.png", "{t}/out/manifest.json",
         "Permission denied", prepare=damaged_out(lambda out: unreadable(out / "manifest.json")),
         without_root_reads=True),
    case("generate-manifest-truncated", "generate {t}/out prompt -o {t}/x.png", "{t}/out/manifest.json",
         "not valid JSON", prepare=damaged_out(lambda out: truncate_to_half(out / "manifest.json"))),
    case("generate-manifest-without-file-name", "generate {t}/out prompt -o {t}/x.png", "{t}/out/manifest.json",
         "'unet'", "'file'",
         prepare=damaged_out(lambda out: edit_manifest(out, lambda m: m["components"]["unet"].pop("file")))),
    case("generate-manifest-nested-deep", "generate {t}/out prompt -o {t}/x.png", "{t}/out/manifest.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "manifest.json", DEEP_JSON))),
    case("generate-scheduler-config-nested-deep", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/scheduler/scheduler_config.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "scheduler" / "scheduler_config.json", DEEP_JSON))),
    case("generate-tokenizer-pipeline-nested-deep", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/tokenizer/tokenizer.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "tokenizer" / "tokenizer.json", DEEP_JSON))),
    case("generate-special-tokens-nested-deep", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/tokenizer/special_tokens_map.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "tokenizer" / "special_tokens_map.json", DEEP_JSON))),
    case("generate-scheduler-config-larger-than-read", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/scheduler/scheduler_config.json", "bytes, larger than",
         prepare=damaged_out(lambda out: larger_than_read(out / "scheduler" / "scheduler_config.json"))),
    # token ids the text encoder cannot look up
    case("generate-token-id-beyond-uint32", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/tokenizer/tokenizer.json", str(2**40), "is no int32 id", prepare=damaged_out(first_token_id(2**40))),
    case("generate-token-id-beyond-int32", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/tokenizer/tokenizer.json", str(2**31 + 5), "is no int32 id",
         prepare=damaged_out(first_token_id(2**31 + 5))),
    case("generate-token-id-beyond-the-vocabulary", "generate {t}/out prompt -o {t}/x.png",
         "{t}/out/tokenizer/tokenizer.json", str(TOKEN_TABLE_ROWS), f"vocabulary ({TOKEN_TABLE_ROWS} tokens)",
         prepare=damaged_out(first_token_id(TOKEN_TABLE_ROWS))),
    case("generate-tflite-truncated", "generate {t}/out prompt -o {t}/x.png", "{t}/out/unet.tflite",
         "bytes, but the manifest says", prepare=damaged_out(lambda out: truncate_to_half(out / "unet.tflite"))),
    case("generate-tflite-bit-flipped", "generate {t}/out prompt -o {t}/x.png", "{t}/out/vae_decoder.tflite",
         "sha256", prepare=damaged_out(lambda out: flip_bit(out / "vae_decoder.tflite", 1000, 3))),
    case("generate-tflite-wrong-dtype", "generate {t}/out prompt -o {t}/x.png", "{t}/out/unet.tflite", "INT8",
         prepare=damaged_out(int8_sample_unet)),
    # absurd and non-finite options
    case("generate-steps-beyond-training", f"{GENERATE_ONE} --steps 1001", "--steps 1001",
         "num_train_timesteps"),
    case("generate-guidance-nan", f"{GENERATE_ONE} --guidance nan", "--guidance nan"),
    case("generate-guidance-overflowing", f"{GENERATE_ONE} --guidance 1e39", "--guidance 1e+39"),
    case("generate-strength-nan", f"{GENERATE_ONE} --strength nan", "--strength nan"),
    case("generate-seed-beyond-torch", f"{GENERATE_ONE} --seed {TORCH_SEEDS_END}", f"--seed {TORCH_SEEDS_END}"),
    # the picture
    case("generate-output-is-a-folder", "generate {out} prompt -o {t}", "{t}", "is a directory"),
    case("generate-output-read-only", "generate {out} prompt -o {ro}/x.png", "{ro}/x.png", "not writable",
         watch=("{ro}",)),
    case("generate-output-on-a-full-disk", "generate {out} prompt -o {full}/{id}/x.png --steps 1",
         "{full}/{id}/x.png", "No space left on device", watch=("{full}/{id}",)),
    *oplib_cases("generate", "generate {out} prompt -o {t}/x.png --steps 1 --backend opencl"),
    # hostile and damaged pictures, refused before any pixel is decoded (or by the decoder, in one line)
    *(case(f"generate-init-image-{name}", f"{GENERATE_ONE} --init-image {{t}}/{file}",
           f"--init-image {{t}}/{file}", reason, prepare=_(lambda f, file=file, make=make: write(f / file, make())))
      for name, file, reason, make in (
          ("decompression-bomb", "bomb.png", "100000 x 100000 pixels", hostile_images.decompression_bomb),
          ("decompression-bomb-bmp", "bomb.bmp", "more than the 64 Mpx",
           lambda: hostile_images.bmp_header(20_000, 10_000)),
          ("ztxt-bomb", "text.png", "expands past 1 MiB", hostile_images.ztxt_bomb),
          ("itxt-bomb", "xmp.png", "expands past 1 MiB", hostile_images.itxt_bomb),
          ("many-text-chunks", "notes.png", "more than 32 PNG text chunks",
           lambda: hostile_images.many_text_chunks(1000)),
          ("garbage", "noise.png", "past the end of the file", hostile_images.garbage),
          ("truncated-png", "cut.png", "past the end of the file",
           lambda: hostile_images.truncated(hostile_images.png(64, 64, pixels=bytes(193 * 64)))),
          ("truncated-jpeg", "cut.jpg", "truncated", lambda: hostile_images.truncated(hostile_images.jpeg(64, 64))),
          ("not-an-image", "notes.txt", "cannot identify", lambda: "hello"))),
    case("generate-init-image-oversized-file", f"{GENERATE_ONE} --init-image {{t}}/big.png",
         "--init-image {t}/big.png", "65.0 MiB, more than the 64 MiB",
         prepare=_(lambda f: hostile_images.oversized(f / "big.png", 65 * 2**20))),
    case("generate-init-image-missing", f"{GENERATE_ONE} --init-image {{t}}/nothing.png",
         "--init-image {t}/nothing.png", "no such image file"),
]

BENCH_ONE = "bench {out} --runs 1 --warmup 0"
BENCH = [
    case("bench-out-is-a-file", "bench {t}/notes.txt", "{t}/notes.txt", "not a folder",
         prepare=_(lambda f: write(f / "notes.txt", "hello"))),
    case("bench-unreadable-manifest", "bench {t}/out", "{t}/out/manifest.json", "Permission denied",
         prepare=damaged_out(lambda out: unreadable(out / "manifest.json")), without_root_reads=True),
    case("bench-manifest-nested-deep", "bench {t}/out", "{t}/out/manifest.json", NESTED,
         prepare=damaged_out(lambda out: write(out / "manifest.json", DEEP_JSON))),
    case("bench-tflite-changed-since-conversion", "bench {t}/out", "{t}/out/text_encoder.tflite", "sha256",
         prepare=damaged_out(lambda out: flip_bit(out / "text_encoder.tflite", 2000, 1))),
    case("bench-guidance-nan", f"{BENCH_ONE} --guidance nan", "--guidance nan"),
    case("bench-seed-negative", f"{BENCH_ONE} --seed -1", "--seed -1"),
    case("bench-steps-absurd", f"{BENCH_ONE} --steps 1000000000", "--steps 1000000000"),
    case("bench-threads-absurd", f"{BENCH_ONE} --threads 100000", "--threads 100000"),
    case("bench-save-read-only", f"{BENCH_ONE} --save {{ro}}/results.json", "--save {ro}/results.json",
         "not writable", watch=("{ro}",)),
    case("bench-save-on-a-full-disk", f"{BENCH_ONE} --save {{full}}/{{id}}/results.json",
         "{full}/{id}/results.json", "No space left on device", watch=("{full}/{id}",)),
    *oplib_cases("bench", "bench {out} --backend opencl --runs 1 --warmup 0"),
]

OPLIB = [
    case("oplib-out-is-a-file", "oplib build -o {t}/lib", "{t}/lib", "is a file",
         prepare=_(lambda f: write(f / "lib", "a file"))),
    case("oplib-out-read-only", "oplib build -o {ro}/lib", "{ro}/lib", "not writable", watch=("{ro}",),
         env={"DIFFLITE_OPLIB_BUILD_DIR": "{build}"}),
    case("oplib-out-on-a-full-disk", "oplib build -o {full}/{id}/lib", "{full}/{id}/lib",
         "No space left on device", watch=("{full}/{id}",), env={"DIFFLITE_OPLIB_BUILD_DIR": "{build}"}),
    case("oplib-android-ndk-missing", "oplib build --target android-arm64", "{t}/no-ndk",
         "android.toolchain.cmake", env={"ANDROID_NDK_HOME": "{t}/no-ndk"}),
]

CASES = [*CONVERT, *INSPECT, *VERIFY, *GENERATE, *BENCH, *OPLIB]


# ---------------------------------------------------------------------------------------------
# Running them


@dataclass
class Outcome:
    result: subprocess.CompletedProcess | None = None
    changed: list[str] = field(default_factory=list)  # watched paths that differ afterwards
    error: Exception | None = None  # a case that could not even be set up


def snapshot(path: Path) -> dict[str, str] | None:
    """None for an absent path; else every file under it (a file: itself) -> sha256, every
    folder -> "folder"."""
    if not os.path.lexists(path):
        return None
    if not path.is_dir():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    entries = {".": "folder"}
    for item in sorted(path.rglob("*")):
        relative = str(item.relative_to(path))
        entries[relative] = "folder" if item.is_dir() else hashlib.sha256(item.read_bytes()).hexdigest()
    return entries


def run_case(case: Case, corpus: Corpus) -> Outcome:
    try:
        values = corpus.placeholders(case.id)
        folder = Path(values["t"])
        folder.mkdir(parents=True)
        if case.prepare is not None:
            case.prepare(folder, corpus)
        if case.reads_out:
            corpus.converted()
        watched = [Path(w.format(**values)) for w in case.watched()]
        before = [snapshot(w) for w in watched]
        prefix = WITHOUT_ROOT_READS if case.without_root_reads else ()
        if prefix and shutil.which(prefix[0]) is None:
            raise RuntimeError(f"{prefix[0]} (util-linux) is needed to run a command that root's "
                               f"permissions cannot bypass")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **{k: v.format(**values) for k, v in case.env.items()}}
        result = subprocess.run([*prefix, *CLI, *(a.format(**values) for a in case.args)], capture_output=True,
                                text=True, cwd=ROOT, env=env, timeout=300, check=False)
        changed = [str(w) for w, old in zip(watched, before) if snapshot(w) != old]
        return Outcome(result, changed)
    except Exception as exc:  # reported by the case's own test
        return Outcome(error=exc)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    shared = Corpus(tmp_path_factory.mktemp("bad-inputs"))
    try:
        shared.make_read_only()
        fake_built_library(shared.base / "oplib-build")
        shared.make_full(c.id for c in CASES if "{full}" in " ".join((*c.args, *c.watch)))
        yield shared
    finally:
        shared.close()


@pytest.fixture(scope="module")
def outcomes(request, corpus) -> dict[str, Outcome]:
    """The selected cases, run WORKERS at a time: those that do not read the conversion first,
    while it is being made."""
    selected = {item.callspec.id for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    todo = sorted((c for c in CASES if c.id in selected), key=lambda c: c.reads_out)
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {c.id: pool.submit(run_case, c, corpus) for c in todo}
        return {case_id: future.result() for case_id, future in futures.items()}


# What may come before the error line: convert's progress, and LiteRT's own "INFO: Created
# TensorFlow Lite XNNPACK delegate for CPU." when an interpreter is made (TF_CPP_MIN_LOG_LEVEL does
# not silence it).
CHATTER = ("[difflite] ", "INFO: ")


def error_line(case: Case, result: subprocess.CompletedProcess) -> str:
    """The one error line: the last line of stderr, every other line chatter."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    others = [line for line in lines[:-1] if not line.startswith(CHATTER)]
    assert lines and not others, f"{case.id}: more than one line on stderr:\n{result.stderr}"
    assert lines[-1].startswith("difflite: error: "), f"{case.id}: {lines[-1]!r}"
    return lines[-1]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fails_cleanly(case, corpus, outcomes):
    outcome = outcomes[case.id]
    if outcome.error is not None:
        raise outcome.error
    result = outcome.result
    assert result.returncode >= 0, f"killed by signal {-result.returncode}:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == EXIT_BAD_INPUT, result.stderr[-3000:]
    line = error_line(case, result)
    values = corpus.placeholders(case.id)
    for needle in case.culprit:
        assert needle.format(**values) in line, (needle.format(**values), line)
    assert not outcome.changed, f"written or changed: {outcome.changed}"


def test_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


def test_generate_takes_prompts_in_any_bytes(corpus, tmp_path):
    """A prompt and a negative prompt whose bytes are not UTF-8 (a shell script's, a file's),
    control characters among them, make the picture: each undecodable byte is read as U+FFFD, so
    the picture is the one the prompts with U+FFFD written out make."""
    out = corpus.converted()

    def generate(prompt: bytes, negative: bytes, picture: Path) -> dict:
        result = subprocess.run([*CLI, "generate", str(out), prompt, "--negative-prompt", negative, "-o", str(picture),
                                 "--steps", "1", "--backend", "cpu", "--json"], capture_output=True, cwd=ROOT,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=300, check=False)
        stderr = result.stderr.decode(errors="replace")
        assert result.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
        return json.loads(result.stdout)["settings"]

    settings = generate(b"caf\xe9 au lait \xff\xfe\x07", b"\xc3\x28 blurry\x1b[0m", tmp_path / "bytes.png")
    assert settings["prompt"] == "caf\ufffd au lait \ufffd\ufffd\x07"
    assert settings["negative_prompt"] == "\ufffd( blurry\x1b[0m"
    generate(settings["prompt"].encode(), settings["negative_prompt"].encode(), tmp_path / "replaced.png")
    assert (tmp_path / "bytes.png").read_bytes() == (tmp_path / "replaced.png").read_bytes()


PIPELINE_IDS = {  # each place a tokenizers-library pipeline names a token id -> where the message says it is
    "added": ({"added_tokens": [{"id": 9, "content": "<|endoftext|>"}]}, "added token '<|endoftext|>'"),
    "roberta": ({"post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 9], "cls": ["<s>", 0]}},
                "the post-processor's sep token"),
    "template": ({"post_processor": {"type": "Sequence", "processors": [
        {"type": "TemplateProcessing", "special_tokens": {"<s>": {"id": "<s>", "ids": [0, 9], "tokens": []}}}]}},
        "the post-processor's special token '<s>'"),
    "padding": ({"padding": {"pad_id": 9}}, "padding"),
    "unigram": ({"model": {"type": "Unigram", "vocab": [["a", 0.0]] * 10}}, "the last of 10 tokens"),
}


@pytest.mark.parametrize("place", PIPELINE_IDS)
def test_every_token_id_of_a_pipeline_is_checked(place, tmp_path):
    from difflite.core.errors import BadInput
    from difflite.folder.tokenizer import check_token_ids

    pipeline, where = PIPELINE_IDS[place]
    check_token_ids(tmp_path, {"model": {"vocab": {"a": 0}}, **pipeline}, vocabulary=10)
    with pytest.raises(BadInput) as error:
        check_token_ids(tmp_path, {"model": {"vocab": {"a": 0}}, **pipeline}, vocabulary=9)
    assert str(error.value) == f"{tmp_path}: token id 9 of {where} is beyond the text encoder's vocabulary (9 tokens)"


@pytest.mark.parametrize("text, cleaned", [
    ("caf\udce9", "caf\ufffd"),  # argv's byte 0xe9, as Python escapes it
    (b"caf\xe9 \xf0\x9f\x98", "caf\ufffd \ufffd"),  # a truncated 4-byte sequence is one U+FFFD
    ("lone \ud800 surrogate", "lone \ufffd\ufffd\ufffd surrogate"),  # from Python, not from bytes
    ("nul\x00 bell\x07 \u00e9", "nul\x00 bell\x07 \u00e9"),
])
def test_prompts_in_any_bytes_become_text(text, cleaned):
    from difflite.folder.tokenizer import clean_prompt

    assert clean_prompt(text) == cleaned


def test_component_digests_are_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """checked_sha256 hashes a model once per change: a second start reads the record, and a
    same-size change to the file (a flipped byte) is hashed again and seen."""
    import time

    from difflite.folder import manifest

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "m.tflite"
    model.write_bytes(bytes(range(256)) * 64)
    time.sleep(manifest.RACY_SECONDS + 0.1)  # older than the racy window: its digest is recorded
    first = manifest.checked_sha256(model)
    assert first == manifest.sha256_file(model)
    hashed = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda path: hashed.append(path) or real(path))
    assert manifest.checked_sha256(model) == first and hashed == []  # from the record
    data = bytearray(model.read_bytes())
    data[100] ^= 0x01
    model.write_bytes(bytes(data))
    assert manifest.checked_sha256(model) != first and hashed == [model]


def test_a_failed_op_library_build_is_one_line_and_a_log(tmp_path):
    """`oplib build` (and every command that builds the library on demand) reports a failed
    CMake step in one line, the first error, and keeps the whole output in the build folder."""
    from difflite.runtime import oplib

    log = tmp_path / "build" / oplib.BUILD_LOG
    with pytest.raises(oplib.BuildFailed) as failed:
        oplib.run("configuring", ["cmake", "-S", str(tmp_path / "no-sources"), "-B", str(tmp_path / "build")], log)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("configuring the op library failed (exit 1): CMake Error")
    assert "no-sources" in message and str(log) in message
    assert "no-sources" in log.read_text() and log.read_text().startswith("$ cmake -S")


def test_a_build_after_a_failed_configure_configures_again(tmp_path, monkeypatch):
    """A configure that failed (a missing package) leaves no CMake cache behind: once the cause is
    gone, the next build configures again instead of failing with "No rule to make target"."""
    from difflite.runtime import oplib

    source, build_dir = tmp_path / "src", tmp_path / "build"
    source.mkdir()
    (source / "lib.c").write_text("int difflite_probe(void) { return 1; }\n")
    cmake = "cmake_minimum_required(VERSION 3.16)\nproject(probe C)\n"
    (source / "CMakeLists.txt").write_text(cmake + 'message(FATAL_ERROR "a package is missing")\n')
    monkeypatch.setattr(oplib, "SOURCE", source)
    with pytest.raises(oplib.BuildFailed, match="configuring the op library failed"):
        oplib.build(build_dir=build_dir)
    assert not (build_dir / "CMakeCache.txt").exists()
    (source / "CMakeLists.txt").write_text(cmake + "add_library(difflite_delegate SHARED lib.c)\n")
    assert oplib.build(build_dir=build_dir) == build_dir / oplib.LIBRARY_NAME
    assert (build_dir / oplib.LIBRARY_NAME).is_file()
