"""The one exception type kvcargo raises for bad input.

Every face (CLI, web, Python API) turns it into a one-line message: exit status 2 on the CLI,
HTTP 4xx on the web. Anything else escaping is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable


class KvcargoError(ValueError):
    """Bad input: an unknown key, an impossible configuration, a malformed file."""


def unknown(kind: str, key: str, valid: Iterable[str]) -> KvcargoError:
    """The standard error for a key that is not in a catalog or a list of choices."""
    choices = ", ".join(sorted(valid))
    return KvcargoError(f"unknown {kind} {key!r}; valid choices: {choices}")
