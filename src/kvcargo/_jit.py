"""Compilation of the engine's kernels with numba (the ``kvcargo[fast]`` extra), when it pays.

The engine is written once, in a numba-compatible subset of Python. Every kernel starts as the
plain function; before a job, :func:`use_compiled` weighs what it would cost as plain Python
against what compiling costs (:data:`COMPILE_COST_S`). When compiling pays, it imports numba,
wraps every kernel in a cached dispatcher and puts the dispatchers where the plain functions
were (the names each module imported), so from then on the whole process runs compiled. Small
runs never import numba: importing it and loading the compiled engine from its on-disk cache
costs about a second, while 800 requests run in about 0.2 s as plain Python. The paths give
bit-identical results.

``KVCARGO_JIT=0`` never compiles, ``KVCARGO_JIT=1`` compiles for every run, ``KVCARGO_JIT=jit``
too but never uses the ahead-of-time engine (kvcargo.engine.aot); unset, the work decides. The
test suite runs the engine every way.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable)

MODE = os.environ.get("KVCARGO_JIT", "auto")
AVAILABLE: bool = MODE != "0" and importlib.util.find_spec("numba") is not None
"""True when numba is installed and not disabled."""

COMPILED_SOURCES = ".py"
"""The sources compiled code may be built from: every module of the package (files with this
suffix), since kernels are defined in several (the engine, the cost models, statistics), inline
helpers from others and read their constants (numba freezes them in)."""


@cache
def source_digest() -> str:
    """A hash of :data:`COMPILED_SOURCES`, once per set of sources (the numba cache folder and the
    ahead-of-time engine's key both name their compiled code after it): hashed again only when a
    source's modification time or size changed (the files' stamps key it in kvcargo's cache)."""
    from kvcargo import cachefiles

    package = os.path.dirname(__file__)
    names = []
    for root, dirs, files in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # bytecode: hundreds of files, none a source
        folder = root[len(package) + 1:].split(os.sep) if root != package else []
        names += [[*folder, f] for f in files if f.endswith(COMPILED_SOURCES)]
    names.sort()
    paths = [os.path.join(package, *parts) for parts in names]
    return cachefiles.cached("source-digest", cachefiles.stamp(paths),
                             lambda: _hash_sources(["/".join(parts) for parts in names], paths))


def _hash_sources(names: list[str], paths: list[str]) -> str:
    """sha256 over each source's name (relative, with ``/``) and its bytes, in order."""
    import hashlib

    digest = hashlib.sha256()
    for name, path in zip(names, paths):
        digest.update(name.encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _cache_dir(base: str | None) -> str:
    """A numba cache directory named after :func:`source_digest`.

    numba checks a cached kernel against its own source file only; a kernel that inlines a
    helper from another module (the engine inlines the cost model's roofline) or reads its
    constants would keep stale machine code after that module changed.
    """
    package = Path(__file__).parent
    return str(Path(base or package / "__pycache__" / "numba") / source_digest()[:16])


COMPILE_COST_S = 1.0
"""Seconds that importing numba and loading compiled kernels from its cache cost a process
(measured on this project's 2-core machine: numba's import ~0.4 s, its typing registries and
the cached code ~0.5 s): compiling pays once the plain Python it replaces would take longer."""

_plain: list[tuple[types.FunctionType, bool]] = []
_plain_ids: set[int] = set()
_unrefcounted: set[int] = set()
_dispatchers: dict[int, Any] = {}
_plain_s_done = 0.0
_notice = False
_cache_set = False


def kernel(fn: F | None = None, *, inline: bool = False, refcounts: bool = True) -> F:
    """Mark ``fn`` as a kernel: plain Python until the process compiles (see module docstring).

    ``inline=True`` splices a small helper into its compiled callers: a compiled call costs more
    than a helper of a few lines does.
    ``refcounts=False`` compiles without numba's reference counting, for a kernel that allocates
    no array: reading an array out of a tuple of arrays otherwise costs an atomic increment and
    decrement each time.
    """
    if fn is None:
        return lambda f: kernel(f, inline=inline, refcounts=refcounts)  # type: ignore[return-value]
    own = _own_copy(fn)
    if not refcounts:
        _unrefcounted.add(id(own))
    _plain.append((own, inline))
    _plain_ids.add(id(own))
    if compiled():  # a module imported after the process compiled
        _dispatchers[id(own)] = _dispatcher(own, inline)
        return _dispatchers[id(own)]
    return own  # type: ignore[return-value]


def compiled() -> bool:
    """Whether this process runs the kernels compiled just in time."""
    return bool(_dispatchers)


def fast(fn: Callable) -> bool:
    """Whether ``fn`` (a kernel as its module binds it now) runs compiled, just in time or
    ahead of time: a caller with a plain-Python alternative (``math.fsum``) uses it otherwise."""
    return id(fn) not in _plain_ids


def current(fn: F) -> F:
    """The kernel ``fn`` (its plain function) as the process runs it now: its dispatcher once
    compiled just in time."""
    return _dispatchers.get(id(fn), fn)


def use_compiled(plain_s: float) -> bool:
    """Called before a job that would take ``plain_s`` seconds as plain Python: compile the
    kernels now if this job, together with what this process ran before, pays for it. Whether
    they are compiled."""
    global _plain_s_done
    _plain_s_done += plain_s
    return expect_work(0.0)


def expect_work(plain_s: float) -> bool:
    """A caller about to run many jobs (a capacity search) announces them: compile now if it
    pays, rather than after the first few ran slowly. Whether the kernels are compiled."""
    if not compiled() and pays(plain_s):
        compile_kernels()
    return compiled()


def pays(plain_s: float) -> bool:
    """Whether compiling pays for ``plain_s`` more seconds of plain Python (beside what this
    process already ran)."""
    return AVAILABLE and (MODE in ("1", "jit") or _plain_s_done + plain_s >= COMPILE_COST_S)


def rebind(*pairs: tuple[object, object]) -> None:
    """For each ``(old, new)``, bind ``new`` wherever a loaded kvcargo module binds ``old``
    (compared by identity), in one pass over the modules."""
    new_of = {id(old): new for old, new in pairs}  # the olds are alive in ``pairs``: ids are theirs
    for name, module in list(sys.modules.items()):
        if name == "kvcargo" or name.startswith("kvcargo."):
            for attr, value in list(vars(module).items()):
                if id(value) in new_of:
                    setattr(module, attr, new_of[id(value)])


def _own_copy(fn: Callable) -> types.FunctionType:
    """A distinct function object with the same code, so that replacing it never touches a module
    that defines the function for other uses (``cost.roofline`` stays a plain function)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__doc__, copy.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return copy


def _numba() -> Any:
    """numba, with its cache directory keyed on the compiled sources (set at the first import)."""
    global _cache_set
    import numba

    if not _cache_set:
        numba.config.CACHE_DIR = _cache_dir(numba.config.CACHE_DIR)
        _cache_set = True
    return numba


def _dispatcher(fn: types.FunctionType, inline: bool) -> Any:
    """numba's cached dispatcher of ``fn``: no Python objects, IEEE floats.

    ``error_model="numpy"``: a division needs no zero check (the engine never divides by zero;
    results are the same IEEE floats, so compiled and plain runs stay bit-identical).
    """
    options = {"_nrt": False} if id(fn) in _unrefcounted else {}
    return _numba().njit(cache=True, nogil=True, error_model="numpy", inline="always" if inline else "never",
                         **options)(fn)


def compile_kernels(notice: bool = True) -> None:
    """Wrap every kernel in a dispatcher and bind it where the plain kernel was bound (numba
    resolves a kernel's callees from its module's names). ``notice``: say so on the terminal if
    numba actually compiles (its cache is cold)."""
    global _notice
    if notice and not _notice:
        from numba.core import event

        _notice = True
        event.register("numba:compile", _compile_notice())
    for fn, inline in _plain:
        _dispatchers[id(fn)] = _dispatcher(fn, inline)
    rebind(*((fn, _dispatchers[id(fn)]) for fn, _ in _plain))


@contextmanager
def dispatchers() -> Iterator[None]:
    """The kernels as dispatchers for a while (numba compiling the engine ahead of time needs
    them), then plain again unless the process had compiled them before."""
    before = compiled()
    if not before:
        compile_kernels(notice=False)
    try:
        yield
    finally:
        if not before:
            rebind(*((_dispatchers.pop(id(fn)), fn) for fn, _ in _plain))


def _compile_notice() -> Any:
    """A numba event listener that says on the terminal, once, that numba compiles (its cache
    was cold): no silent minute."""
    from numba.core import event

    class CompileNotice(event.Listener):
        shown = False

        def on_start(self, ev: Any) -> None:
            if not self.shown:
                self.shown = True
                print("kvcargo: compiling the simulation engine with numba, once after installing or upgrading "
                      "(up to a minute); later runs load it from numba's cache", file=sys.stderr, flush=True)

        def on_end(self, ev: Any) -> None:
            pass

    return CompileNotice()
