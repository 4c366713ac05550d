"""The typed reader of an output folder: what `difflite convert` wrote, as the runtime, `verify`
and `inspect` read it. One read of manifest.json, checked (difflite.folder.manifest: structure,
format version, each component file's size and sha256 and, unless told otherwise, its graph and
difflite ops), then plain values: nothing downstream indexes the manifest's JSON or rescans a
.tflite for what the manifest already says."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from difflite.core import control, lora
from difflite.core.conditioning import TIMESTEP_COND
from difflite.core.errors import BadInput
from difflite.folder import manifest as manifest_file

QUANTIZED_WIDTHS = ("int8", "int4")
FAMILIES = ("sd", "sdxl")  # the manifest's latent.family: SD 1.x / 2.x (unrecorded) and SDXL


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a component file: "NHWC" layout for rank-4 tensors (the file's),
    else "as_onnx"."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str = "as_onnx"

    @classmethod
    def of(cls, spec: dict) -> TensorSpec:
        return cls(spec["name"], tuple(int(d) for d in spec["shape"]), str(spec.get("dtype", "float32")),
                   str(spec.get("layout", "as_onnx")))

    @property
    def onnx_shape(self) -> tuple[int, ...]:
        """The shape in ONNX / PyTorch layout (NCHW for an NHWC tensor): what the runtime's
        callers pass (ComponentEntry.to_file_layout transposes)."""
        if self.layout == "NHWC" and len(self.shape) == 4:
            n, h, w, c = self.shape
            return (n, c, h, w)
        return self.shape


@dataclass(frozen=True)
class LoraSlot:
    """One layer that takes a LoRA at run time (passes/lora.py): its module as LoRA files name it."""
    slot: int
    module: str
    in_features: int
    out_features: int
    conv: bool


@dataclass(frozen=True)
class LoraSlots:
    """A component's run-time LoRA slots: the form they take in the file (difflite.LoRA ops, or
    factor inputs of max_rank in --no-fuse files) and the largest rank a slot takes."""
    form: str
    max_rank: int
    slots: tuple[LoraSlot, ...]

    @classmethod
    def of(cls, where: str, entry: dict, inputs: tuple[TensorSpec, ...]) -> LoraSlots:
        """The manifest's record, checked (BadInput naming `where`); an "inputs" form's factor
        inputs must be the file's, of their slot's shapes."""
        try:
            form, max_rank = str(entry["form"]), int(entry["max_rank"])
            slots = tuple(LoraSlot(int(s["slot"]), str(s["module"]), int(s["in_features"]), int(s["out_features"]),
                                   bool(s["conv"])) for s in entry["slots"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{where}: 'lora_slots' is not a valid record ({exc})") from exc
        if form not in lora.FORMS or not 1 <= max_rank <= lora.MAX_RANK_LIMIT:
            raise BadInput(f"{where}: 'lora_slots' has form {form!r} and max_rank {max_rank}")
        if [s.slot for s in slots] != list(range(len(slots))) or len({s.module for s in slots}) != len(slots) or \
                any(s.in_features <= 0 or s.out_features <= 0 for s in slots):
            raise BadInput(f"{where}: 'lora_slots' must number its slots from 0, once per module, with positive sizes")
        if form == "inputs":
            given = {spec.name: spec.shape for spec in inputs}
            for s in slots:
                want = {lora.down_input(s.slot): (s.in_features, max_rank),
                        lora.up_input(s.slot): (max_rank, s.out_features)}
                for name, shape in want.items():
                    if given.get(name) != shape:
                        raise BadInput(f"{where}: LoRA slot {s.slot} needs the input {name} {list(shape)}")
        return cls(form, max_rank, slots)


@dataclass(frozen=True)
class ComponentEntry:
    """One component of the folder: its file and what the manifest says of it."""
    name: str
    path: Path
    sha256: str = ""
    bytes: int = 0
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    custom_ops: tuple[str, ...] = ()
    # int8 / int4 constants (`convert --weights`): the op library's CPU kernels read them as stored,
    # where TFLite alone would hold float32 copies (4x an int8 weight, 8x an int4 one)
    quantized_weights: bool = False
    # a ControlNet's control image (convert's conditioning_info): input, channels, height, width,
    # value_range, channel_order; None for the other components
    conditioning: dict | None = field(default=None, compare=False)
    # run-time LoRA slots (convert --lora-slots); None where the component has none
    lora_slots: LoraSlots | None = field(default=None, compare=False)

    @classmethod
    def for_file(cls, path) -> ComponentEntry:
        """A lone .tflite without a manifest: its custom ops and quantized weights read from the
        file itself, its tensors exchanged as the file holds them."""
        from difflite.folder.reader import read_tflite

        path = Path(path)
        if not path.is_file():
            raise BadInput(f"{path}: no such model file")
        summary = read_tflite(path)
        custom_ops = tuple(sorted({op.name for op in summary.custom_ops}))
        quantized = any(t.constant and t.dtype in QUANTIZED_WIDTHS for t in summary.tensors)
        return cls(path.stem, path, custom_ops=custom_ops, quantized_weights=quantized)

    @property
    def file(self) -> str:
        return self.path.name

    def token_vocabulary(self) -> int | None:
        """How many token ids this file can look up (a text encoder: the rows of its token table);
        None where it gathers from no constant table."""
        from difflite.folder.reader import read_tflite

        return read_tflite(self.path).gathered_table_rows()

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def to_file_layout(self, inputs: dict, dtypes: dict | None = None) -> dict[str, np.ndarray]:
        """Inputs in ONNX / PyTorch layout -> as the file takes them: NCHW -> NHWC where the
        manifest says the file's input is NHWC, in `dtypes[name]` (else the manifest's dtype)."""
        feeds = {}
        for name, value in inputs.items():
            value, spec = np.asarray(value), self.input(name)
            if spec is not None and spec.layout == "NHWC":
                value = value.transpose(0, 2, 3, 1)
            dtype = (dtypes or {}).get(name) or (spec.dtype if spec is not None else value.dtype)
            feeds[name] = np.ascontiguousarray(value.astype(dtype))
        return feeds

    def from_file_layout(self, outputs: dict) -> dict[str, np.ndarray]:
        """The file's outputs -> ONNX / PyTorch layout (NHWC -> NCHW where the manifest says NHWC)."""
        nhwc = {spec.name for spec in self.outputs if spec.layout == "NHWC"}
        return {name: value.transpose(0, 3, 1, 2) if name in nhwc else value for name, value in outputs.items()}

    @property
    def batch(self) -> int:
        """The batch of the first input (the UNet's sample: 2 for classifier-free guidance)."""
        return self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1

    @property
    def sample_channels(self) -> int | None:
        """The channels of the UNet's sample input (the latents' 4, or 9 for an inpainting UNet:
        latents, mask, masked picture's latents), read in the file's layout; None without one."""
        spec = self.input("sample")
        if spec is None or len(spec.shape) != 4:
            return None
        return spec.shape[-1] if spec.layout == "NHWC" else spec.shape[1]

    @property
    def control_residuals(self) -> tuple[TensorSpec, ...]:
        """A UNet's ControlNet residual inputs (down_residual_0 .., mid_residual), or a
        ControlNet's residual outputs; () for anything else."""
        tensors = self.outputs if control.controlnet_index(self.name) is not None else self.inputs
        return tuple(spec for spec in tensors if control.is_residual(spec.name))

    @property
    def timestep_cond_dim(self) -> int | None:
        """The width of an LCM-distilled UNet's guidance embedding input, None without one."""
        spec = self.input(TIMESTEP_COND)
        return spec.shape[-1] if spec is not None and spec.shape else None


@dataclass(frozen=True)
class Latent:
    """The latent geometry the UNet was converted for. `unet_channels`: the channels of the UNet's
    sample input, `channels` (the VAE's latents) or 2 x channels + 1 for an inpainting UNet."""
    channels: int
    height: int
    width: int
    image_height: int
    image_width: int
    text_length: int = 77
    unet_channels: int | None = None  # None: the same as channels

    @property
    def inpainting(self) -> bool:
        """The UNet takes the latents, the mask and the masked picture's latents (diffusers'
        StableDiffusionInpaintPipeline with a 9-channel UNet)."""
        return self.unet_channels == inpaint_channels(self.channels)


@dataclass(frozen=True)
class SDXLInfo:
    """An SDXL folder's conditioning (convert's sdxl_latent_info): the width of text_encoder_2's
    projection (the UNet's text_embeds), the number of time ids, and the source pipeline's flags
    (diffusers' defaults for folders that do not record them): zero unconditional embeddings when
    no negative prompt is given, and img2img's aesthetic-score time ids (an SDXL refiner)."""
    text_embeds: int
    time_ids: int
    force_zeros_for_empty_prompt: bool = True
    requires_aesthetics_score: bool = False


def _flag(fields: dict, name: str, default: bool) -> bool:
    value = fields.get(name, default)
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be true or false")
    return value


def inpaint_channels(latent_channels: int) -> int:
    """An inpainting UNet's sample channels: the latents, the mask (1) and the masked picture's latents."""
    return 2 * latent_channels + 1


def unsupported_input_channels(in_channels: int, out_channels: int) -> str | None:
    """Why a UNet of these sample channels is refused (one line, the source's name to be put
    before it), or None for a text-to-image or an inpainting UNet: depth-conditioned and other
    image-conditioned UNets take other inputs."""
    if in_channels in (out_channels, inpaint_channels(out_channels)):
        return None
    return (f"UNet with {in_channels} input channels and {out_channels} output channels is not supported: "
            f"{out_channels} (text-to-image) or {inpaint_channels(out_channels)} (inpainting: latents, mask, "
            f"masked picture's latents)")


@dataclass(frozen=True)
class OutputFolder:
    path: Path
    precision: str  # "fp32" | "fp16": how the weights are stored
    weights: str  # "float" | "int8" | "int4"
    components: dict[str, ComponentEntry]
    source: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    latent_fields: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict, repr=False)  # as written, for reports that echo it

    @classmethod
    def read(cls, folder, names=None, check_models: bool = True, check_files: bool = True) -> OutputFolder:
        """Read and check the folder: BadInput (naming the file and field) for anything damaged,
        changed since the conversion, or hostile. `names`: the components whose files are checked
        (all if None); `check_files` False: none yet (call check_files once they are chosen)."""
        path = Path(folder)
        document = manifest_file.read_manifest(path)
        options = document["options"]
        weights = str(options.get("weights") or "float")
        components = {name: _component(path, name, entry, weights)
                      for name, entry in document["components"].items()}
        result = cls(path, options["precision"], weights, components, document["source"], options,
                     document.get("latent") or {}, document)
        if check_files:
            result.check_files(names, check_models)
        return result

    def check_files(self, names=None, check_models: bool = True) -> None:
        """Each named component's file (all if None) is the one the manifest describes: its size
        and sha256 and, with check_models, its structure, graph and difflite ops."""
        manifest_file.check_component_files(self.path, self.manifest, names, check_models=check_models)

    def component(self, name: str, hint: str = "convert again") -> ComponentEntry:
        """The component `name`, whose file is present; BadInput naming it (and `hint`) if not."""
        entry = self.components.get(name)
        if entry is None or not entry.path.is_file():
            missing = entry.path if entry is not None else self.path / f"{name}.tflite"
            raise BadInput(f"{missing}: missing ({hint})")
        return entry

    @property
    def family(self) -> str:
        """"sdxl" for an SDXL conversion (the manifest's latent.family), else "sd" (SD 1.x / 2.x,
        whose folders do not record it)."""
        return str(self.latent_fields.get("family") or "sd")

    def check_family(self) -> None:
        """BadInput (one line) for a model family this difflite does not know."""
        if self.family not in FAMILIES:
            raise BadInput(f"{self.path / manifest_file.MANIFEST}: unknown model family {self.family!r}")

    @property
    def sdxl(self) -> SDXLInfo | None:
        """What an SDXL folder's manifest says beyond the latent geometry; None for SD 1.x / 2.x."""
        if self.family != "sdxl":
            return None
        fields = self.latent_fields
        try:
            return SDXLInfo(int(fields["text_embeds"]), int(fields["time_ids"]),
                            _flag(fields, "force_zeros_for_empty_prompt", True),
                            _flag(fields, "requires_aesthetics_score", False))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{self.path / manifest_file.MANIFEST}: no usable SDXL 'latent' fields ({exc})") from exc

    @property
    def controlnets(self) -> list[ComponentEntry]:
        """The ControlNet components, controlnet_0, controlnet_1, ... in order (convert --controlnet)."""
        found = [(control.controlnet_index(name), entry) for name, entry in self.components.items()]
        return [entry for _, entry in sorted(((i, e) for i, e in found if i is not None), key=lambda f: f[0])]

    @property
    def control_residual_names(self) -> tuple[str, ...]:
        """The residual inputs of the folder's UNet (the sum of the ControlNets' outputs of the same
        names, each scaled); () for a UNet converted without ControlNets."""
        unet = self.components.get("unet")
        return tuple(spec.name for spec in unet.control_residuals) if unet is not None else ()

    @property
    def latent(self) -> Latent:
        fields = self.latent_fields
        unet = self.components.get("unet")
        try:
            channels = int(fields["channels"])
            # the UNet file's own input says it (folders written before the manifest recorded
            # "unet_channels" too); a folder without a UNet: the manifest's word
            unet_channels = unet.sample_channels if unet is not None else None
            if unet_channels is None:
                unet_channels = int(fields.get("unet_channels", channels))
            return Latent(channels, int(fields["height"]), int(fields["width"]),
                          int(fields["image_height"]), int(fields["image_width"]), int(fields.get("text_length", 77)),
                          unet_channels)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{self.path / manifest_file.MANIFEST}: no usable 'latent' geometry ({exc})") from exc


def _component(folder: Path, name: str, entry: dict, weights: str) -> ComponentEntry:
    # Folders written before the manifest recorded "quantized_weights" per component: every
    # component of an int8 / int4 conversion holds quantized layers.
    quantized = entry.get("quantized_weights", weights in QUANTIZED_WIDTHS)
    conditioning = entry.get("conditioning")
    inputs = tuple(TensorSpec.of(s) for s in entry["inputs"])
    slots = entry.get("lora_slots")
    if slots is not None:
        slots = LoraSlots.of(f"{folder / manifest_file.MANIFEST}: component '{name}'", slots, inputs)
    return ComponentEntry(name, folder / entry["file"], entry["sha256"], entry["bytes"], inputs,
                          tuple(TensorSpec.of(s) for s in entry["outputs"]),
                          tuple(entry.get("custom_ops") or ()), bool(quantized),
                          dict(conditioning) if isinstance(conditioning, dict) else None, slots)
