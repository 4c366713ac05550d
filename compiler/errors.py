"""Errors that map to the CLI's exit codes (DESIGN §4)."""


class BadInput(Exception):
    """The user's input cannot be used (exit code 2). The message is one line naming the file,
    the layer or the op at fault."""


class UnsupportedOp(BadInput):
    """An ONNX node the TFLite writer has no lowering for."""

    def __init__(self, op_type: str, node_name: str, detail: str = ""):
        self.op_type = op_type
        self.node_name = node_name
        extra = f": {detail}" if detail else ""
        super().__init__(f"unsupported ONNX op {op_type} at node '{node_name}'{extra}")


class VerificationFailed(Exception):
    """A numerical check or a benchmark target was missed (exit code 1)."""
