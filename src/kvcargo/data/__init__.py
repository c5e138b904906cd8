"""The published figures (``published.toml``) and external checks (``validate.toml``) as data."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """One of this folder's TOML files, parsed once per process."""
    return tomllib.loads(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"))
