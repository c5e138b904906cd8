"""Compilation of the engine's kernels with numba (the ``kvcargo[fast]`` extra), when it pays.

The engine is written once, in a numba-compatible subset of Python. Every kernel starts as the
plain function; a run whose estimated work is large enough calls :func:`use_compiled`, which
imports numba, wraps every kernel in a cached dispatcher and puts the dispatchers where the plain
functions were (the names each module imported), so from then on the whole process runs
compiled. Small runs never import numba: importing it and loading the compiled engine from its
on-disk cache costs about a second, while 800 requests run in about 0.2 s as plain Python. The
two paths give bit-identical results.

``KVCARGO_JIT=0`` never compiles, ``KVCARGO_JIT=1`` compiles for every run (the test suite runs
both ways); unset, the work decides.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable)

MODE = os.environ.get("KVCARGO_JIT", "auto")
AVAILABLE: bool = MODE != "0" and importlib.util.find_spec("numba") is not None
"""True when numba is installed and not disabled."""

COMPILE_FROM_WORK = 4_000
"""Estimated work (requests × parts per hand-off) from which a run compiles: importing numba and
loading the cached engine costs about as much as this many requests as plain Python (measured
with benchmarks/bench.py on the default scenario)."""

_plain: list[tuple[types.FunctionType, bool]] = []
_dispatchers: dict[int, Any] = {}
_work_done = 0.0


def kernel(fn: F | None = None, *, inline: bool = False) -> F:
    """Mark ``fn`` as a kernel: plain Python until the process compiles (see module docstring).

    ``inline=True`` splices a small helper into its compiled callers: a compiled call that passes
    the state arrays costs reference counting, which dominates helpers of a few lines.
    """
    if fn is None:
        return lambda f: kernel(f, inline=inline)  # type: ignore[return-value]
    own = _own_copy(fn)
    if compiled():
        return _dispatcher(own, inline)
    _plain.append((own, inline))
    return own  # type: ignore[return-value]


def compiled() -> bool:
    """Whether this process runs the kernels compiled."""
    return bool(_dispatchers)


def use_compiled(work: float) -> bool:
    """Called before a job of ``work`` (requests × parts per hand-off): compile the kernels now if
    this job, together with the work this process ran before, pays for it. Whether they are
    compiled."""
    global _work_done
    _work_done += work
    return expect_work(_work_done)


def expect_work(work: float) -> bool:
    """A caller about to run many jobs (a capacity search) announces their total work: compile
    now if it pays, rather than after the first few jobs ran slowly. Whether they are compiled."""
    if not compiled() and AVAILABLE and (MODE == "1" or work >= COMPILE_FROM_WORK):
        _compile_all()
    return compiled()


def _own_copy(fn: Callable) -> types.FunctionType:
    """A distinct function object with the same code, so that replacing it never touches a module
    that defines the function for other uses (``cost.roofline`` stays a plain function)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return copy


def _dispatcher(fn: types.FunctionType, inline: bool) -> Any:
    """numba's cached dispatcher of ``fn``: no Python objects, IEEE floats.

    ``error_model="numpy"``: a division needs no zero check (the engine never divides by zero;
    results are the same IEEE floats, so compiled and plain runs stay bit-identical).
    """
    import numba

    return numba.njit(cache=True, nogil=True, error_model="numpy", inline="always" if inline else "never")(fn)


def _compile_all() -> None:
    """Wrap every kernel and rebind, in every loaded kvcargo module, each name bound to a plain
    kernel to its dispatcher (numba resolves a kernel's callees from its module's names)."""
    for fn, inline in _plain:
        _dispatchers[id(fn)] = _dispatcher(fn, inline)
    if not _cache_is_warm():
        print("kvcargo: compiling the simulation engine with numba, once after installing or upgrading "
              "(about a minute); later runs load it from numba's cache", file=sys.stderr, flush=True)
    for name, module in list(sys.modules.items()):
        if name == "kvcargo" or name.startswith("kvcargo."):
            for attr, value in list(vars(module).items()):
                if isinstance(value, types.FunctionType) and id(value) in _dispatchers:
                    setattr(module, attr, _dispatchers[id(value)])


def _cache_is_warm() -> bool:
    """Whether numba's on-disk cache holds an entry for every standalone kernel that is at least
    as new as its source (otherwise the first call compiles)."""
    for fn, inline in _plain:
        if inline:
            continue
        index = Path(_dispatchers[id(fn)]._cache._cache_file._index_path)
        if not index.exists() or index.stat().st_mtime < Path(fn.__code__.co_filename).stat().st_mtime:
            return False
    return True
