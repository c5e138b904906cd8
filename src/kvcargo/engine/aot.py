"""The event loop compiled ahead of time: the same kernels, built by numba into an extension module.

Loading numba's just-in-time engine costs every process about a second (importing numba, its
typing registries, the cached machine code), far more than a run of a few thousand requests.
So the first run whose work pays for compiling also builds, with ``numba.pycc``, an extension
module exporting :func:`kvcargo.engine.loop.run_events` over the state's and the parameters'
arrays, and the other kernels a run calls from Python (:data:`HELPERS`: drawing the workload,
the summary's token gaps and exact weighted sums). It is kept in kvcargo's cache directory (``KVCARGO_CACHE_DIR``, else
``~/.cache/kvcargo``) under a key of the engine's sources, numba's and Python's versions; later
processes import it in milliseconds and never import numba to simulate. It is the same code
through the same compiler, so its results are those of the JIT and of plain Python, bit for bit.

Where numba cannot build it (no C compiler), everything stays as before: the JIT and its cache.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
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
HELPERS = (("kvcargo.workload.draws", "draw_requests"), ("kvcargo.metrics", "_token_gaps"),
           ("kvcargo.stats", "_weighted_sum"))
"""Kernels called from Python besides the event loop, exported under their own names."""
ENGINE_PLAIN_S = 250e-6
"""Seconds of plain Python per request (and part of a hand-off) of a run: the event loop and
the summary (default scenario, this project's 2-core machine)."""
REST_PLAIN_S = 2e-6
"""The same with the engine compiled ahead of time: what stays plain Python, the summary's
exact sums and percentiles (numpy and ``math.fsum``; about 2 s for 1,000,000 requests)."""

_runner: Callable[[State, Params], int] | None = None
_building = False


def prepare(units: float, accumulate: bool = True) -> None:
    """Before simulating ``units`` (requests × parts per hand-off), now or in the runs about to
    come (``accumulate=False``): use the ahead-of-time engine if it is built, else build it when
    compiling pays; then numba's JIT for the kernels left if that pays too."""
    if _runner is None and not _building and _jit.AVAILABLE and _jit.MODE != "jit":
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
    """Bind the module's exports where the kernels they replace are bound."""
    global _runner
    from kvcargo.engine import loop

    types = json.loads(Path(module.__file__).with_suffix(".types").read_text(encoding="utf-8"))  # type: ignore[arg-type]
    entry, fallback = getattr(module, ENTRY), loop.run_events

    def run_events(st: State, pr: Params) -> int:
        """The compiled event loop, or the loop it replaces when an array is not of the type the
        module was built for."""
        arrays = (*st, *writable(pr))
        return entry(*arrays) if fits(arrays, types[ENTRY]) else fallback(st, pr)

    _runner = run_events
    _jit.rebind(fallback, run_events)
    for mod, name in HELPERS:
        plain = getattr(importlib.import_module(mod), name)
        _jit.rebind(plain, _checked(getattr(module, name), types[name], plain))


def _checked(export: Callable[..., Any], expected: list[str], fallback: Callable[..., Any]) -> Callable[..., Any]:
    """``export`` where the arguments are of the types it was built for, else ``fallback``."""

    def call(*args: Any) -> Any:
        return export(*args) if fits(args, expected) else fallback(*args)

    return call


def writable(pr: Params) -> tuple[np.ndarray, ...]:
    """The parameters as writable C arrays (the engine never writes them; a cached read-only
    coefficient table is copied), so one exported signature fits every run."""
    return tuple(np.require(a, requirements="CW") for a in pr)


def arg_spec(numba_types: tuple[Any, ...]) -> list[str]:
    """What an exported signature fixes of each argument: an array's dtype, dimensions and
    layout ('C' contiguous or 'A' any), a number's kind ('i' integer, 'f' float)."""
    out = []
    for t in numba_types:
        if hasattr(t, "ndim"):
            out.append(f"{np.dtype(str(t.dtype)).str}:{t.ndim}:{'C' if t.layout == 'C' else 'A'}")
        else:
            out.append("f" if "float" in str(t) else "i")
    return out


def fits(args: tuple[Any, ...], expected: list[str]) -> bool:
    """Whether ``args`` are of the types an export with :func:`arg_spec` ``expected`` was built for."""
    if len(args) != len(expected):
        return False
    for a, want in zip(args, expected):
        if isinstance(a, np.ndarray):
            dtype, ndim, layout = want.split(":") if ":" in want else ("", "", "")
            if a.dtype.str != dtype or str(a.ndim) != ndim or (layout == "C" and not a.flags.c_contiguous):
                return False
        elif want == "i" and not (isinstance(a, (int, np.integer)) and not isinstance(a, bool)):
            return False
        elif want == "f" and not isinstance(a, (float, np.floating)):
            return False
        elif want not in ("i", "f"):
            return False
    return True


def cache_dir() -> Path:
    return Path(os.environ.get("KVCARGO_CACHE_DIR") or Path.home() / ".cache" / "kvcargo")


def _key() -> str:
    """kvcargo's sources (any module may hold a kernel), numba's version, Python's and the
    machine's."""
    h = hashlib.sha256(_jit.source_digest().encode())
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
    """Compile the engine into the extension module (once; a minute on a cold numba cache); None
    if numba cannot (no C compiler)."""
    global _building
    print("kvcargo: compiling the simulation engine with numba, once after installing or upgrading "
          "(up to a minute)", file=sys.stderr, flush=True)
    from kvcargo.config import SimConfig, resolve
    from kvcargo.engine import cluster
    from kvcargo.metrics import summarize

    st, params = _sample()
    arrays = (*st, *writable(params))
    config = SimConfig.build(requests=400)
    _building = True
    try:
        out = cluster.run(resolve(config))  # plain Python: the helpers' arguments come from it
        with _jit.dispatchers():
            # the helpers' signatures: numba's, from compiling them for a small run's arguments
            resolve(config)
            summarize(out)
            signatures = {name: getattr(importlib.import_module(mod), name).signatures[0] for mod, name in HELPERS}
            return _compile(arrays, signatures)
    finally:
        _building = False


def _compile(arrays: tuple[np.ndarray, ...], signatures: dict[str, tuple[Any, ...]]) -> ModuleType | None:
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
        types = {ENTRY: arg_spec(sig.args)}
        for mod, name in HELPERS:
            dispatcher = getattr(importlib.import_module(mod), name)
            cres = dispatcher.overloads[signatures[name]]
            cc.export(name, cres.signature)(dispatcher.py_func)
            types[name] = arg_spec(signatures[name])
        with warnings.catch_warnings():  # pycc is marked for deprecation upstream; see docs/architecture.md
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            cc.compile()
        built = next(work.glob(f"{MODULE}*"))
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(target.with_suffix(".types"), json.dumps(types).encode())
        _write_atomically(target, built.read_bytes())  # last: a module on disk has its types beside it
    except Exception as exc:  # noqa: BLE001 - no compiler, no pycc: the JIT serves instead
        print(f"kvcargo: could not build the ahead-of-time engine ({type(exc).__name__}); "
              "using numba's JIT", file=sys.stderr, flush=True)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _load()


def _write_atomically(path: Path, data: bytes) -> None:
    """Concurrent builders (test workers) never expose a partial file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
