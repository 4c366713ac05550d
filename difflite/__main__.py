"""`python -m difflite`: the same command group as the `difflite` console script."""

from difflite.cli import run

run()
