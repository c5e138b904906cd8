"""Elementwise arithmetic on one number or a numpy array of them.

The hand-off formulas (:mod:`kvcargo.transfer`, :mod:`kvcargo.linkmodel`) are written once: the
engine applies them to every request's array, the calculator to one hand-off's numbers, and the
latter then never imports numpy (a third of ``kvcargo handoff``'s start-up). On numbers each
helper gives the float the array operation gives in that element.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def is_array(x: object) -> bool:
    """Whether ``x`` is a numpy array, asked without importing numpy (no array exists before
    numpy is imported)."""
    np_ = sys.modules.get("numpy")
    return np_ is not None and isinstance(x, np_.ndarray)


def as_floats(x: Any) -> np.ndarray | float:
    """``x`` in float64: a number as a float, anything else as ``np.asarray`` gives it."""
    if isinstance(x, (int, float)):
        return float(x)
    import numpy as np

    return np.asarray(x, dtype=np.float64)


def zeros_like(x: np.ndarray | float) -> np.ndarray | float:
    """Zeros shaped as ``x`` (``0.0`` for a number)."""
    if is_array(x):
        import numpy as np

        return np.zeros_like(x)
    return 0.0


def maximum(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray | float:
    """``np.maximum(a, b)``; of two numbers, the larger."""
    if is_array(a) or is_array(b):
        import numpy as np

        return np.maximum(a, b)
    return max(a, b)


def minimum(a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray | float:
    """``np.minimum(a, b)``; of two numbers, the smaller."""
    if is_array(a) or is_array(b):
        import numpy as np

        return np.minimum(a, b)
    return min(a, b)
