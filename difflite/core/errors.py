"""Errors that map to the CLI's exit codes (DESIGN §4)."""


class BadInput(Exception):
    """The user's input cannot be used (exit code 2). The message is one line naming the file,
    the layer or the op at fault."""


class UnsupportedOp(BadInput):
    """An ONNX node the TFLite writer has no lowering for."""

    def __init__(self, op_type: str, node_name: str, detail: str = "", output: str | None = None):
        self.op_type = op_type
        self.node_name = node_name
        self.output = output  # the node's first output: what names a node exporters left unnamed
        self.detail = detail
        where = f"node '{node_name}'" if node_name else "an unnamed node"
        if output:
            where += f" (output '{output}')"
        extra = f": {detail}" if detail else ""
        super().__init__(f"unsupported ONNX op {op_type} at {where}{extra}")


class VerificationFailed(Exception):
    """A numerical check or a benchmark target was missed (exit code 1)."""
