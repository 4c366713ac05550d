"""The package's shape: one import name when installed, and the import directions of DESIGN.md §1
(pyproject's [tool.importlinter] contracts, checked by import-linter)."""

import shutil
import subprocess
import sys

from support import ROOT

# import-linter's `lint-imports`, run by this interpreter whatever PATH holds
LINT_IMPORTS = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
                "--no-cache"]


def test_install_adds_only_the_difflite_package(tmp_path):
    """`pip install .` puts one top-level module into site-packages: difflite (plus its metadata and
    the console script)."""
    source, target = tmp_path / "source", tmp_path / "site"  # a copy: building writes build/ beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "difflite", source / "difflite", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, text=True, cwd=tmp_path)
    entries = {p.name for p in target.iterdir()}
    metadata = {name for name in entries if name.endswith(".dist-info")}
    assert metadata == {"difflite-0.1.0.dist-info"}
    assert entries - metadata - {"bin"} == {"difflite"}
    top_level = (target / "difflite-0.1.0.dist-info" / "top_level.txt")
    assert not top_level.exists() or top_level.read_text().split() == ["difflite"]
    installed = {str(p.relative_to(target / "difflite")) for p in (target / "difflite").rglob("*") if p.is_file()}
    assert {"core/device_profiles.json", "runtime/accelerator_probe.tflite", "cli.py", "__main__.py"} <= installed
    run = subprocess.run([sys.executable, "-c", "import difflite.cli, sys; print(difflite.cli.__file__)"],
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(target / "difflite" / "cli.py")


def test_import_contracts_hold():
    """import-linter's layers, forbidden and acyclic-siblings contracts (pyproject.toml)."""
    run = subprocess.run(LINT_IMPORTS, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_a_broken_contract_is_reported(tmp_path):
    """The check can fail: a runtime module importing the compiler breaks the runtime's contract."""
    config = (ROOT / "pyproject.toml").read_text()
    probe = tmp_path / "pyproject.toml"
    probe.write_text(config)
    package = tmp_path / "difflite"
    subprocess.run(["cp", "-r", str(ROOT / "difflite"), str(package)], check=True)
    (package / "runtime" / "offender.py").write_text("from difflite.compiler import convert  # noqa\n")
    run = subprocess.run(LINT_IMPORTS, cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert run.returncode != 0
    assert "difflite.runtime.offender -> difflite.compiler.convert" in run.stdout
