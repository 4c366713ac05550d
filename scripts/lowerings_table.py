#!/usr/bin/env python3
"""DESIGN.md's table of what each ONNX lowering accepts and refuses, made from the code.

Every registered ONNX op type (difflite/compiler/tflite/ops, LOWERINGS) with the refusals its lowering can
raise: the messages of `ctx.unsupported(...)` in the lowering function and in the functions of its
module that it calls, read from the source (formatted parts shown as {...}). A user who reads a
refusal finds here whether it is about the graph's form (a constant that another export would
give) or a feature the writer lacks (a newer difflite).

    python scripts/lowerings_table.py                 # print the table
    python scripts/lowerings_table.py --write-design  # put it into DESIGN.md between its markers
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BEGIN, END = "<!-- lowerings:begin -->", "<!-- lowerings:end -->"


def message_text(node: ast.AST) -> str:
    """A message argument as the reader sees it: constants kept, formatted parts as {...}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return message_text(node.left) + message_text(node.right)
    return "{...}"


def module_refusals(path: Path) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Per module-level function: its own refusal messages, and the names it calls."""
    tree = ast.parse(path.read_text())
    messages: dict[str, list[str]] = {}
    calls: dict[str, set[str]] = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        own, called = [], set()
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr == "unsupported" and node.args:
                own.append(message_text(node.args[0]))
            elif isinstance(node.func, ast.Name):
                called.add(node.func.id)
        messages[fn.name], calls[fn.name] = own, called
    return messages, calls


def refusals_of(fn) -> list[str]:
    messages, calls = module_refusals(Path(inspect.getsourcefile(fn)))
    seen, todo, found = set(), [fn.__name__], []
    while todo:
        name = todo.pop(0)
        if name in seen or name not in messages:
            continue
        seen.add(name)
        found += [m for m in messages[name] if m not in found]
        todo += sorted(calls[name])
    return found


def table() -> str:
    from difflite.compiler.tflite.ops import LOWERINGS

    by_fn = defaultdict(list)
    for (domain, op_type), fn in LOWERINGS.items():
        by_fn[fn].append(f"{domain}:{op_type}" if domain else op_type)
    rows = ["| ONNX op types | lowering | refused when (the message's words; {...}: the values) |", "|---|---|---|"]
    for fn, ops in sorted(by_fn.items(), key=lambda item: sorted(item[1])[0].lower()):
        where = f"`{Path(inspect.getsourcefile(fn)).name}:{fn.__name__}`"
        refused = "; ".join(m.replace("|", "\\|") for m in refusals_of(fn)) or "-"
        rows.append(f"| {', '.join(sorted(ops))} | {where} | {refused} |")
    return "\n".join(rows) + "\n"


def write_design(design: Path) -> bool:
    text = design.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + table() + text[end:]
    if new != text:
        design.write_text(new)
    return new != text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-design", action="store_true", help="Update DESIGN.md between its markers.")
    args = parser.parse_args()
    if args.write_design:
        print("DESIGN.md updated" if write_design(ROOT / "DESIGN.md") else "DESIGN.md already up to date")
    else:
        print(table(), end="")


if __name__ == "__main__":
    main()
