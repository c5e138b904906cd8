"""The published figures (``published.toml``) and external checks (``validate.toml``) as data."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any

from kvcargo.errors import KvcargoError


@cache
def load(name: str) -> dict[str, Any]:
    """One of this folder's TOML files, parsed once per process."""
    return tomllib.loads(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"))


def groups(name: str) -> dict[str, str]:
    """A file's check groups: name → title, in file order."""
    return dict(load(name)["groups"])


def chosen_groups(name: str, only: Iterable[str] | None) -> list[str]:
    """The groups asked for (all by default); an unknown one is an error naming the choices."""
    known = groups(name)
    wanted = list(only) if only else list(known)
    for g in wanted:
        if g not in known:
            raise KvcargoError(f"unknown group {g!r}; valid choices: {', '.join(known)}")
    return wanted
