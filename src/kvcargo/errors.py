"""The one exception type kvcargo raises for bad input.

Every face (CLI, web, Python API) turns it into a one-line message: exit status 2 on the CLI,
HTTP 4xx on the web. Anything else escaping is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable


class KvcargoError(ValueError):
    """Bad input: an unknown key, an impossible configuration, a malformed file.

    ``field`` names the configuration parameter a user should change when the message names no
    flag (the web page marks it); ``pool`` ("prefill", "decode", ...) says which pool's own
    parameter (``prefill_<field>``) it is when the configuration sets one.
    """

    def __init__(self, message: str, *, field: str | None = None, pool: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.pool = pool


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
