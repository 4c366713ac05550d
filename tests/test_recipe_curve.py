"""benchmarks/recipe_curve.py: the MB / SNR curve along an int4 mix recipe's order, and the
truncated recipes it converts, read back by convert's own recipe reader."""

import json
import math

import pytest

from benchmarks import recipe_curve
from difflite.compiler import weight_recipe


def layer(name, shape, int4_db, int8_db, width="int4", **extra):
    return {"name": name, "digest": name * 4, "shape": shape, "width": width,
            "int4_error_db": int4_db, "int8_error_db": int8_db, "bytes": 0, **extra}


@pytest.fixture
def recipe():
    return {"format": weight_recipe.FORMAT, "component": "unet", "width": "int4", "block": 32,
            "layers": [layer("a", [512, 512], -20.0, -40.0, "int8"),        # saves the most per byte
                       layer("b", [2048, 512], -25.0, -45.0),
                       layer("c", [512, 512], -50.0, -70.0),                 # saves the least
                       layer("fixed", [64, 3, 3, 4], None, -60.0, "int8", fixed="int4 blocks do not tile")]}


def test_the_curve_orders_by_error_saved_per_byte_and_adds_the_errors(recipe):
    assert [entry["name"] for entry in recipe_curve.order(recipe)] == ["a", "b", "c"]
    rows = recipe_curve.curve(recipe)
    assert [r["k"] for r in rows] == [0, 1, 2, 3] and [r["int8_layers"] for r in rows] == [1, 2, 3, 4]
    assert all(x["mib"] < y["mib"] for x, y in zip(rows, rows[1:]))
    int8 = lambda shape: weight_recipe.stored_bytes(shape, "int8", 32, "fp16")  # noqa: E731
    assert rows[-1]["mib"] == round(sum(int8(s) for s in ([512, 512], [2048, 512], [512, 512], [64, 3, 3, 4])) / 2**20, 2)
    first = 10 ** -2 + 10 ** -2.5 + 10 ** -5 + 10 ** -6
    last = 10 ** -4 + 10 ** -4.5 + 10 ** -7 + 10 ** -6
    assert rows[0]["predicted_snr_db"] == round(-10 * math.log10(first), 2)
    assert rows[-1]["predicted_snr_db"] == round(-10 * math.log10(last), 2)
    assert recipe_curve.recipe_step(recipe) == 1


def test_a_truncated_recipe_is_one_convert_reads(recipe, tmp_path):
    step = recipe_curve.truncated(recipe, 2)
    path = tmp_path / "step.json"
    path.write_text(json.dumps(weight_recipe.file_document({"unet": step})))
    read = weight_recipe.read(path)["unet"]
    assert {entry["name"]: entry["width"] for entry in read["layers"]} == {
        "a": "int8", "b": "int8", "c": "int4", "fixed": "int8"}
    assert recipe["layers"][1]["width"] == "int4"  # the original is left as it was
    assert recipe_curve.parse_steps("0,recipe,all", recipe) == [0, 1, 3]
    with pytest.raises(SystemExit):
        recipe_curve.parse_steps("4", recipe)
