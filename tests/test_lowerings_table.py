"""DESIGN.md's table of what each lowering accepts and refuses is the code's (scripts/lowerings_table.py)."""


from scripts import lowerings_table

from support import ROOT


def test_design_lists_every_lowering_and_its_refusals():
    design = (ROOT / "DESIGN.md").read_text()
    start = design.index(lowerings_table.BEGIN) + len(lowerings_table.BEGIN)
    block = design[start:design.index(lowerings_table.END)]
    assert block == "\n" + lowerings_table.table(), "DESIGN.md is stale: run scripts/lowerings_table.py --write-design"
    from difflite.compiler.tflite.ops import LOWERINGS

    assert all(f"{op_type}" in block for _, op_type in LOWERINGS)
    assert "convolution weights must be constant" in block  # a refusal read from conv.py's source


def test_refusals_follow_the_module_functions_a_lowering_calls():
    from difflite.compiler.tflite.ops.resize import lower_resize

    refusals = lowerings_table.refusals_of(lower_resize)
    assert any(m.startswith("Resize mode=") for m in refusals)  # raised in a helper, not lower_resize
    assert len(refusals) == len(set(refusals)) >= 5
