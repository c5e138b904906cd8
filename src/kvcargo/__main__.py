"""``python -m kvcargo`` = the ``kvcargo`` command."""

from kvcargo.cli import run

run()
