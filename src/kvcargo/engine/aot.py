"""The event loop compiled ahead of time: the same kernels, built by numba into an extension module.

Loading numba's just-in-time engine costs every process about a second (importing numba, its
typing registries, the cached machine code), far more than a run of a few thousand requests.
So the first run whose work pays for compiling also builds, with ``numba.pycc``, an extension
module exporting one function: :func:`kvcargo.engine.loop.run_events` over the state's and the
parameters' arrays. It is kept in kvcargo's cache directory (``KVCARGO_CACHE_DIR``, else
``~/.cache/kvcargo``) under a key of the engine's sources, numba's and Python's versions; later
processes import it in milliseconds and never import numba to simulate. It is the same code
through the same compiler, so its results are those of the JIT and of plain Python, bit for bit.

Where numba cannot build it (no C compiler), everything stays as before: the JIT and its cache.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kvcargo import _jit
from kvcargo.engine.state import Params, State

MODULE = "kvcargo_engine_aot"
ENTRY = "run_arrays"
ENGINE_PLAIN_S = 250e-6
"""Seconds of plain Python per request (and part of a hand-off) of a run: the event loop and
the summary (default scenario, this project's 2-core machine)."""
REST_PLAIN_S = 30e-6
"""The same with the event loop compiled ahead of time: what stays plain Python (the summary's
statistics over the step log)."""

_runner: Callable[[State, Params], int] | None = None


def prepare(units: float, accumulate: bool = True) -> None:
    """Before simulating ``units`` (requests × parts per hand-off), now or in the runs about to
    come (``accumulate=False``): use the ahead-of-time engine if it is built, else build it when
    compiling pays; then numba's JIT for the kernels left if that pays too."""
    if _runner is None and _jit.AVAILABLE and _jit.MODE != "jit":
        module = _load()
        if module is None and _jit.pays(units * ENGINE_PLAIN_S):
            module = _build()
        if module is not None:
            _use(module)
    plain_s = units * (REST_PLAIN_S if _runner is not None else ENGINE_PLAIN_S)
    if accumulate:
        _jit.use_compiled(plain_s)
    else:
        _jit.expect_work(plain_s)


def in_use() -> bool:
    """Whether runs go through the ahead-of-time engine (it takes the plain arrays)."""
    return _runner is not None


def _use(module: ModuleType) -> None:
    global _runner
    from kvcargo.engine import loop

    entry = getattr(module, ENTRY)
    expected = Path(module.__file__).with_suffix(".types").read_text(encoding="utf-8")  # type: ignore[arg-type]

    def run_events(st: State, pr: Params) -> int:
        """The compiled event loop, or the loop it replaces when an array is not of the type the
        module was built for."""
        arrays = (*st, *writable(pr))
        if kinds(arrays) != expected:
            return fallback(st, pr)
        return entry(*arrays)

    fallback = loop.run_events
    run_events.__doc__ = fallback.__doc__
    _runner = run_events
    _jit.rebind(fallback, run_events)


def writable(pr: Params) -> tuple[np.ndarray, ...]:
    """The parameters as writable C arrays (the engine never writes them; a cached read-only
    coefficient table is copied), so one exported signature fits every run."""
    return tuple(np.require(a, requirements="CW") for a in pr)


def kinds(arrays: tuple[np.ndarray, ...]) -> str:
    """Dtype, dimensions, contiguity and writability of each array: what the export's signature
    fixes."""
    return ";".join(f"{a.dtype.str}{a.ndim}{'C' if a.flags.c_contiguous else 'A'}{'w' if a.flags.writeable else 'r'}"
                    for a in arrays)


def cache_dir() -> Path:
    return Path(os.environ.get("KVCARGO_CACHE_DIR") or Path.home() / ".cache" / "kvcargo")


def _key() -> str:
    """The engine's sources (every kvcargo module that can hold a kernel), numba's version,
    Python's and the machine's."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted([*root.glob("engine/*.py"), *root.glob("*.py")]):
        h.update(path.name.encode() + path.read_bytes())
    spec = importlib.util.find_spec("numba")
    if spec is not None and spec.origin:
        h.update((Path(spec.origin).parent / "_version.py").read_bytes())
    h.update(f"{sys.version}{platform.machine()}{importlib.machinery.EXTENSION_SUFFIXES[0]}".encode())
    return h.hexdigest()[:16]


def _path() -> Path:
    return cache_dir() / f"engine-{_key()}" / f"{MODULE}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def _load() -> ModuleType | None:
    path = _path()
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


def _sample() -> tuple[State, Params]:
    """The arrays of a small default run: their types are the exported signature."""
    from kvcargo.config import SimConfig, resolve
    from kvcargo.engine import cluster

    params, _ = cluster.build_params(resolve(SimConfig.build(requests=16)))
    channels = params.pf[:, 2].astype(np.int64)
    from kvcargo.engine.state import new_state

    return new_state(16, 1, 1, 2, 256, channels, 1, False, 1024), params


def _build() -> ModuleType | None:
    """Compile the event loop into the extension module (about 20 s, once); None if numba
    cannot (no C compiler)."""
    print("kvcargo: compiling the simulation engine with numba, once after installing or upgrading "
          "(about 20 s)", file=sys.stderr, flush=True)
    st, params = _sample()
    arrays = (*st, *writable(params))
    with _jit.dispatchers():
        return _compile(arrays)


def _compile(arrays: tuple[np.ndarray, ...]) -> ModuleType | None:
    import numba
    from numba.pycc import CC

    names = [f"s_{f}" for f in State._fields] + [f"p_{f}" for f in Params._fields]
    sig = numba.int64(*[numba.typeof(a) for a in arrays])
    target = _path()
    work = Path(tempfile.mkdtemp(prefix="kvcargo-aot-"))
    try:
        # pycc compiles a module-level function: the wrapper is written out as a tiny module.
        src = work / "kvcargo_engine_entry.py"
        src.write_text(
            "from kvcargo.engine._structs import ParamsRef, StateRef\n"
            "from kvcargo.engine.loop import run_events\n\n\n"
            f"def {ENTRY}({', '.join(names)}):\n"
            f"    return run_events(StateRef({', '.join(names[:len(State._fields)])}), "
            f"ParamsRef({', '.join(names[len(State._fields):])}))\n", encoding="utf-8")
        spec = importlib.util.spec_from_file_location("kvcargo_engine_entry", src)
        entry_mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(entry_mod)  # type: ignore[union-attr]
        cc = CC(MODULE)
        cc.output_dir = str(work)
        cc.verbose = False
        cc.export(ENTRY, sig)(getattr(entry_mod, ENTRY))
        with warnings.catch_warnings():  # pycc is marked for deprecation upstream; see docs/architecture.md
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            cc.compile()
        built = next(work.glob(f"{MODULE}*"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.with_suffix(".types").write_text(kinds(arrays), encoding="utf-8")
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(built, tmp)
        os.replace(tmp, target)  # atomic, and last: a module on disk is complete, its types beside it
    except Exception as exc:  # noqa: BLE001 - no compiler, no pycc: the JIT serves instead
        print(f"kvcargo: could not build the ahead-of-time engine ({type(exc).__name__}); "
              "using numba's JIT", file=sys.stderr, flush=True)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _load()

