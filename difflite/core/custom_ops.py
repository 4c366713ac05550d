"""The difflite custom-op contract (DESIGN §2): the only place these names and attributes are
spelled in Python. The ONNX passes emit these ops in the ONNX domain `difflite`; the TFLite writer
emits them as CUSTOM operators whose custom_code is `difflite.<Name>` and whose custom_options
are a FlexBuffer map of the same attributes."""

from __future__ import annotations

from dataclasses import dataclass

DOMAIN = "difflite"
DOMAIN_VERSION = 1


@dataclass(frozen=True)
class Attr:
    name: str
    kind: type  # int, float, str or bool
    default: object
    choices: tuple = ()


@dataclass(frozen=True)
class CustomOp:
    name: str  # the ONNX op_type in DOMAIN
    inputs: tuple[str, ...]
    attrs: tuple[Attr, ...]
    fuse_kind: str  # the --fuse keyword that enables it

    @property
    def custom_code(self) -> str:
        return f"{DOMAIN}.{self.name}"

    def options(self, given: dict) -> dict:
        """Complete and validate an attribute dict (defaults filled, types and choices checked)."""
        known = {a.name: a for a in self.attrs}
        unknown = set(given) - set(known)
        if unknown:
            raise ValueError(f"{self.custom_code}: unknown attributes {sorted(unknown)}")
        out = {}
        for a in self.attrs:
            value = given.get(a.name, a.default)
            if isinstance(value, bytes):
                value = value.decode()
            value = a.kind(value)
            if a.choices and value not in a.choices:
                raise ValueError(f"{self.custom_code}: {a.name}={value!r} not in {a.choices}")
            out[a.name] = value
        return out


APPROXIMATIONS = ("erf", "tanh", "sigmoid")

GROUP_NORM = CustomOp(
    "GroupNorm", ("x", "gamma", "beta"),
    (Attr("groups", int, 32), Attr("epsilon", float, 1e-5),
     Attr("activation", str, "none", ("none", "silu"))),
    "groupnorm")
GELU = CustomOp("Gelu", ("x",), (Attr("approximate", str, "erf", APPROXIMATIONS),), "gelu")
GEGLU = CustomOp("GeGLU", ("x",), (Attr("approximate", str, "erf", APPROXIMATIONS),), "gelu")
ATTENTION = CustomOp(
    "Attention", ("q", "k", "v"),
    (Attr("heads", int, 1), Attr("scale", float, 1.0), Attr("causal", bool, False),
     Attr("variant", str, "auto", ("auto", "partial_softmax", "flash"))),
    "attention")
# w: [36, Cin, Cout] transformed (U = G g G^T), or the filter itself ([Cout, Cin, 3, 3] in ONNX,
# OHWI in TFLite, stored as any convolution's weight: quantized under --weights), which the
# kernels transform at every call; the rank tells the forms apart.
WINOGRAD_CONV3X3 = CustomOp(
    "WinogradConv3x3", ("x", "w", "bias"),
    (Attr("tile", int, 4, (4,)), Attr("activation", str, "none", ("none",))),
    "winograd")

# A run-time LoRA slot after one linear layer (or 1x1 convolution): y + (x D^T) U^T with the factors
# D [r, K] and U [N, r] set on the op library per slot between calls (difflite_lora_set; scale
# folded into U), features along the channel axis (last in TFLite; axis 1 of a rank-4 ONNX
# tensor). No factors set: exactly y. Not a --fuse kind: every file that needs the op library
# takes it; --no-fuse files write the same sum with builtins and factor inputs (core/lora_slots.py).
LORA = CustomOp("LoRA", ("y", "x"), (Attr("slot", int, 0),), "lora")

ALL = (GROUP_NORM, GELU, GEGLU, ATTENTION, WINOGRAD_CONV3X3, LORA)
BY_NAME = {op.name: op for op in ALL}
BY_CUSTOM_CODE = {op.custom_code: op for op in ALL}
# A LayerNorm over the last axis has no op of its own: difflite/passes/layer_norm.py writes it as a
# GroupNorm with groups=1 on x reshaped to [M, C, 1] (ONNX layout; [M, 1, C] in TFLite).
LAYER_NORM_KIND = "layernorm"
FUSE_KINDS = ("gelu", "groupnorm", LAYER_NORM_KIND, "attention", "winograd")


def group_norm_kind(x_shape, groups: int) -> str:
    """The --fuse kind of a difflite.GroupNorm whose x (ONNX layout) has `x_shape`: "layernorm"
    for groups=1 on [M, C, 1] (one group of one position per row: exactly a LayerNorm over C),
    otherwise "groupnorm"."""
    if groups == 1 and x_shape is not None and len(x_shape) == 3 and x_shape[2] == 1:
        return LAYER_NORM_KIND
    return GROUP_NORM.fuse_kind
