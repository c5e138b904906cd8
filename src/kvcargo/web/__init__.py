"""``kvcargo ui``: the chapter's interactive page on a local server, backed by the real engine.

``create_app`` (FastAPI, imported lazily so that the simulation workers stay light) serves the
page and its JSON API; see :mod:`kvcargo.web.app` and docs/web.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from kvcargo.web.app import create_app

        return create_app
    raise AttributeError(f"module 'kvcargo.web' has no attribute {name!r}")
