"""Optional compilation of the engine's kernels with numba (the ``kvcargo[fast]`` extra).

The engine is written once, in a numba-compatible subset of Python. With numba installed the
kernels are compiled (and cached on disk); without it, or with ``KVCARGO_JIT=0``, the very same
functions run as plain Python and give bit-identical results, only slower.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

F = TypeVar("F", bound=Callable)


COMPILED_SOURCES = (
    "engine/*.py", "workload/*.py", "cost.py", "calibrated.py", "stats.py", "metrics.py", "_jit.py",
)
"""The sources compiled code is built from: the modules that define kernels, the cost model the
engine inlines, and the modules whose constants kernels read (numba freezes them in)."""


def _cache_dir(base: str | None) -> str:
    """A numba cache directory named after a hash of :data:`COMPILED_SOURCES`.

    numba checks a cached kernel against its own source file only; a kernel that inlines a
    helper from another module (the engine inlines the cost model's roofline) or reads its
    constants would keep stale machine code after that module changed.
    """
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for pattern in COMPILED_SOURCES for p in package.glob(pattern)):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return str(Path(base or package / "__pycache__" / "numba") / digest.hexdigest()[:16])


try:
    if os.environ.get("KVCARGO_JIT", "1") == "0":
        raise ImportError("disabled by KVCARGO_JIT=0")
    import numba as _numba

    _numba.config.CACHE_DIR = _cache_dir(_numba.config.CACHE_DIR)
except ImportError:
    _numba = None

ENABLED: bool = _numba is not None
"""True when the engine runs compiled."""


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
