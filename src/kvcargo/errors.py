"""The one exception type kvcargo raises for bad input.

Every face (CLI, web, Python API) turns it into a one-line message: exit status 2 on the CLI,
HTTP 4xx on the web. Anything else escaping is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable


class KvcargoError(ValueError):
    """Bad input: an unknown key, an impossible configuration, a malformed file."""


SHOWN_CHARS = 60
"""Longest piece of user input an error message repeats (a 50 KB name is not echoed back)."""


def clip(text: str) -> str:
    """``text`` cut to :data:`SHOWN_CHARS` characters (saying how long it was)."""
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 12]}... ({len(text):,} chars)"


def shown(value: object) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters."""
    return clip(repr(value))


def unknown(kind: str, key: str, valid: Iterable[str]) -> KvcargoError:
    """The standard error for a key that is not in a catalog or a list of choices."""
    choices = ", ".join(sorted(valid))
    return KvcargoError(f"unknown {kind} {shown(key)}; valid choices: {choices}")
