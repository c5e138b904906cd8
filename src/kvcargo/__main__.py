"""``python -m kvcargo`` = the ``kvcargo`` command."""

from kvcargo.cli import main

main()
