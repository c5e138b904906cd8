"""Optional compilation of the engine's kernels with numba (the ``kvcargo[fast]`` extra).

The engine is written once, in a numba-compatible subset of Python. With numba installed the
kernels are compiled (and cached on disk); without it, or with ``KVCARGO_JIT=0``, the very same
functions run as plain Python and give bit-identical results, only slower.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

F = TypeVar("F", bound=Callable)

try:
    if os.environ.get("KVCARGO_JIT", "1") == "0":
        raise ImportError("disabled by KVCARGO_JIT=0")
    import numba as _numba
except ImportError:
    _numba = None

ENABLED: bool = _numba is not None
"""True when the engine runs compiled."""


KERNEL_SOURCES = ("engine/*.py", "workload/draws.py", "cost.py", "calibrated.py", "aiconfigurator_import.py",
                  "stats.py", "metrics.py", "_jit.py")
"""The files whose code or constants compiled kernels contain (kernels and what they inline)."""


def _cache_dir() -> str:
    """Where compiled kernels are cached: one folder per version of the kernels' sources.

    numba invalidates a cached kernel only when the file defining it changes, not when a kernel
    it inlines (the engine inlines the cost model's) or a constant it reads does, so after an
    edit of ``cost.py`` the engine would otherwise keep running the old cost model.
    """
    root = Path(__file__).resolve().parent
    digest = hashlib.sha1()
    for path in sorted(p for pattern in KERNEL_SOURCES for p in root.glob(pattern)):
        digest.update(path.read_bytes())
    for base in (root / "__pycache__", Path(tempfile.gettempdir())):
        folder = base / f"kvcargo-numba-{digest.hexdigest()[:16]}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return str(folder)
        except OSError:
            continue
    return ""


if _numba is not None and not _numba.config.CACHE_DIR:
    _numba.config.CACHE_DIR = _cache_dir()


def kernel(fn: F | None = None, *, inline: bool = False) -> F:
    """Compile ``fn`` with numba (no Python objects, IEEE floats, cached) when available.

    ``error_model="numpy"``: a division needs no zero check (the engine never divides by zero;
    results are the same IEEE floats, so compiled and plain runs stay bit-identical).

    ``inline=True`` splices a small helper into its callers: a compiled call that passes the
    state arrays costs reference counting, which dominates helpers of a few lines.
    """
    if fn is None:
        return lambda f: kernel(f, inline=inline)  # type: ignore[return-value]
    if _numba is None:
        return fn
    return _numba.njit(cache=True, nogil=True, error_model="numpy", inline="always" if inline else "never")(fn)
