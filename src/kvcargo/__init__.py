"""kvcargo: what it costs to move the KV cache from prefill to decode, and what to do about it.

The top-level names are imported lazily so that ``import kvcargo`` (and the CLI's start-up)
stays cheap: ``SimConfig``, ``simulate``, ``SimResult``, ``handoff`` (the calculator module),
``catalog``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "SimConfig": ("kvcargo.config", "SimConfig"),
    "simulate": ("kvcargo.simulation", "simulate"),
    "SimResult": ("kvcargo.simulation", "SimResult"),
    "KvcargoError": ("kvcargo.errors", "KvcargoError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'kvcargo' has no attribute {name!r}")


__all__ = ["KvcargoError", "SimConfig", "SimResult", "__version__", "simulate"]
