"""Results as plain data: what ``--json`` prints and the web API returns."""

from __future__ import annotations

import math
from typing import Any


def jsonable(x: Any) -> Any:
    """NaN and infinities as null (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x
