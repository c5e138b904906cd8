"""The event loop compiled ahead of time: the same kernels, built by numba into an extension module.

Loading numba's just-in-time engine costs every process about a second (importing numba, its
typing registries, the cached machine code), far more than a run of a few thousand requests.
So the first run whose work pays for compiling has built, with ``numba.pycc``, an extension
module exporting :func:`kvcargo.engine.loop.run_events` over the state's and the parameters'
arrays, and the other kernels a run calls from Python (:data:`HELPERS`: drawing the workload,
the summary's token gaps, exact sums and weighted order statistics) — in a background process
while it goes on as plain Python, unless the job alone is worth waiting for. It is kept in
kvcargo's cache directory (``KVCARGO_CACHE_DIR``, else ``~/.cache/kvcargo``) under a key of the engine's sources, numba's and Python's versions; later
processes import it in milliseconds and never import numba to simulate. It is the same code
through the same compiler, so its results are those of the JIT and of plain Python, bit for bit.

Where numba cannot build it (no C compiler), everything stays as before: the JIT and its cache.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kvcargo import _jit
from kvcargo.cachefiles import cache_dir
from kvcargo.engine.state import Params, State

MODULE = "kvcargo_engine_aot"
ENTRY = "run_arrays"
SCHED_ENTRY = "run_scheduled"
"""The serving levers' event loop (:mod:`kvcargo.engine.sched_loop`) over a scheduled state's arrays."""
HELPERS = (("kvcargo.workload.draws", "draw_requests"), ("kvcargo.metrics", "_token_gaps"),
           ("kvcargo.stats", "_weighted_limbs"), ("kvcargo.stats", "_limb_sum"),
           ("kvcargo.stats", "_weighted_select"), ("kvcargo.engine.sched_gaps", "per_request"),
           ("kvcargo.engine.sched_gaps", "_weighted"))
"""Kernels called from Python besides the event loops, exported under their own names: with
them, a run through the module calls no other kernel from Python, so it never imports numba."""
ENGINE_PLAIN_S = 250e-6
"""Seconds of plain Python per request (and part of a hand-off) of a run: the event loop and
the summary (default scenario, this project's 2-core machine)."""

BUILD_PLAIN_S = 60.0
"""Seconds of plain Python from which one job waits for the module to be built (a few minutes
of CPU on a fresh install) rather than running plain while it is built in the background."""
STALE_LOCK_S = 1800.0
"""A build lock older than this was left by a builder that died: building may start again."""

_runner: Callable[[State, Params], int] | None = None
_sched_runner: Callable[[Any], int] | None = None
_building = False
_background = False
"""Whether a background build (this process's or another's) is under way: runs stay plain
Python meanwhile (a cold JIT would cost as much as the build)."""


def prepare(units: float, accumulate: bool = True, unit_plain_s: float = ENGINE_PLAIN_S) -> None:
    """Before work of ``units`` (requests × parts per hand-off; or requests drawn, at
    ``unit_plain_s`` each), now or in the runs about to come (``accumulate=False``): use the
    ahead-of-time engine if it is built. Else, when compiling pays, build it: in this process
    if the job is large (:data:`BUILD_PLAIN_S`) or ``KVCARGO_JIT=1``, otherwise in a background
    process while this one stays plain Python (no silent wait on a first run). Where it cannot
    be built, numba's JIT if that pays. With the module nothing else is compiled (it holds every
    kernel called from Python)."""
    global _background
    if _building:  # the build's own sample runs stay plain Python
        return
    plain_s = units * unit_plain_s
    if _runner is None and _jit.AVAILABLE and _jit.MODE != "jit" and not _failed():
        module = _load()
        if module is None and _jit.pays(plain_s):
            if _jit.MODE == "1" or plain_s >= BUILD_PLAIN_S:
                module = _wait_for_build() or _build()
            else:
                _background = _background or _build_in_background()
        if module is not None:
            _use(module)
    if _runner is not None or building():
        return
    if accumulate:
        _jit.use_compiled(plain_s)
    else:
        _jit.expect_work(plain_s)


def building() -> bool:
    """Whether a background build this process started or found is under way: runs stay plain
    Python until it is done (a cold just-in-time compile would compete with it as long)."""
    return _background and not _failed()


def in_use() -> bool:
    """Whether runs go through the ahead-of-time engine (it takes the plain arrays)."""
    return _runner is not None


def _use(module: ModuleType) -> None:
    """Bind the module's exports where the kernels they replace are bound."""
    global _runner, _sched_runner
    from kvcargo.engine import loop

    text = Path(module.__file__).with_suffix(".types").read_text(encoding="utf-8")  # type: ignore[arg-type]
    types = {name: parse_spec(spec) for name, spec in json.loads(text).items()}
    entry, plain_loop = getattr(module, ENTRY), loop.run_events

    def run_events(st: State, pr: Params) -> int:
        """The compiled event loop, or the loop it replaces (just in time, if that pays) when an
        array is not of the type the module was built for."""
        arrays = (*st, *writable(pr))
        if fits(arrays, types[ENTRY]):
            return entry(*arrays)
        _jit.use_compiled(len(st.t) * ENGINE_PLAIN_S)
        return _jit.current(plain_loop)(st, pr)

    _runner = run_events
    _sched_runner = _checked(getattr(module, SCHED_ENTRY), types[SCHED_ENTRY], _scheduled_fallback, spread=True)
    helpers = [(getattr(importlib.import_module(mod), name), name) for mod, name in HELPERS]
    _jit.rebind((plain_loop, run_events),
                *((plain, _checked(getattr(module, name), types[name], plain)) for plain, name in helpers))


def _checked(export: Callable[..., Any], expected: Spec, fallback: Callable[..., Any],
             spread: bool = False) -> Callable[..., Any]:
    """``export`` where the arguments are of the types it was built for, else ``fallback``.
    ``spread``: the one argument is a tuple of arrays, exported as one argument each."""

    def call(*args: Any) -> Any:
        flat = args[0] if spread else args
        return export(*flat) if fits(flat, expected) else fallback(*args)

    return call


def scheduled_loop() -> Callable[[Any], int] | None:
    """The serving levers' event loop from the module, if runs go through it (it takes a
    scheduled state; bound here, so that a default run never imports that loop)."""
    return _sched_runner


def _scheduled_fallback(st: Any) -> int:
    """The scheduled loop just in time (compiled if that pays) for a state the module does not fit."""
    from kvcargo.engine import sched_loop
    from kvcargo.engine.sched_run import plain_seconds

    _jit.use_compiled(plain_seconds(st))
    return _jit.current(sched_loop.run_events)(st)


def writable(pr: Params) -> tuple[np.ndarray, ...]:
    """The parameters as writable C arrays (the engine never writes them; a cached read-only
    coefficient table is copied), so one exported signature fits every run."""
    return tuple(a if a.flags.c_contiguous and a.flags.writeable else np.require(a, requirements="CW") for a in pr)


def arg_spec(numba_types: tuple[Any, ...]) -> list[str]:
    """What an exported signature fixes of each argument: an array's dtype, dimensions and
    layout ('C' or 'F' contiguous, 'A' any), a number's kind ('i' integer, 'f' float)."""
    out = []
    for t in numba_types:
        if hasattr(t, "ndim"):
            out.append(f"{np.dtype(str(t.dtype)).str}:{t.ndim}:{t.layout}")
        else:
            out.append("f" if "float" in str(t) else "i")
    return out


Spec = tuple[tuple[str, "np.dtype | None", int, str], ...]
"""An :func:`arg_spec` parsed once (:func:`parse_spec`): per argument its kind ('a' array, 'i'
integer, 'f' float), an array's dtype and dimensions, and its layout ('C', 'F' or 'A'). A
long run pauses thousands of times (a planner's probes, a full step log), each resumed through
:func:`fits`."""


def parse_spec(expected: list[str]) -> Spec:
    """``expected`` (an :func:`arg_spec`) in the form :func:`fits` compares cheaply."""
    out = []
    for want in expected:
        if ":" in want:
            dtype, ndim, layout = want.split(":")
            out.append(("a", np.dtype(dtype), int(ndim), layout))
        else:
            out.append((want, None, 0, "A"))
    return tuple(out)


def fits(args: tuple[Any, ...], expected: Spec) -> bool:
    """Whether ``args`` are of the types an export with :func:`arg_spec` ``expected`` (parsed) was
    built for."""
    if len(args) != len(expected):
        return False
    for a, (kind, dtype, ndim, layout) in zip(args, expected):
        if isinstance(a, np.ndarray):
            if (kind != "a" or a.dtype != dtype or a.ndim != ndim or (layout == "C" and not a.flags.c_contiguous)
                    or (layout == "F" and not a.flags.f_contiguous)):
                return False
        elif kind == "i" and not (isinstance(a, (int, np.integer)) and not isinstance(a, bool)):
            return False
        elif kind == "f" and not isinstance(a, (float, np.floating)):
            return False
        elif kind not in ("i", "f"):
            return False
    return True


@cache
def _key() -> str:
    """kvcargo's sources (any module may hold a kernel), numba's version, Python's and the
    machine's."""
    import hashlib
    import platform

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


def _lock() -> Path:
    """Present while a process builds the module (it holds the builder's process id)."""
    return _path().with_name("building")


def _failed() -> bool:
    """Whether building was tried and failed here (no C compiler): the JIT serves instead."""
    return _path().with_name("failed").exists()


def _build_in_background() -> bool:
    """Start building the module in a detached process unless one is already building it.
    Whether a build is under way."""
    import subprocess  # like the other modules of building: imported only to build

    lock = _lock()
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            if time.time() - lock.stat().st_mtime < STALE_LOCK_S:
                return True
            lock.unlink()
        except FileNotFoundError:  # it finished just now
            return _load() is None and _build_in_background()
        return _build_in_background()
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    with open(lock.with_name("build.log"), "wb") as log:
        child = subprocess.Popen([sys.executable, "-c", "from kvcargo.engine import aot; aot.build_locked()"],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                 start_new_session=True)
    os.write(fd, str(child.pid).encode())
    os.close(fd)
    print("kvcargo: building the compiled simulation engine in the background, once after installing or "
          f"upgrading (a few minutes; log: {lock.with_name('build.log')}); until then runs stay plain "
          "Python",
          file=sys.stderr, flush=True)
    return True


def build_locked() -> None:
    """A background builder's work (see :func:`_build_in_background`): build, then drop the lock."""
    try:
        _build()
    finally:
        _lock().unlink(missing_ok=True)


def _wait_for_build() -> ModuleType | None:
    """The module, once a background build under way finishes (None if none is, or it failed)."""
    lock = _lock()
    if not lock.exists():
        return None
    print("kvcargo: waiting for the compiled simulation engine being built in the background "
          "(a few minutes, once after installing or upgrading)", file=sys.stderr, flush=True)
    while lock.exists() and time.time() - lock.stat().st_mtime < STALE_LOCK_S:
        time.sleep(0.5)
    return _load()


def _sample() -> tuple[State, Params]:
    """The arrays of a small default run: their types are the exported signature."""
    from kvcargo.config import SimConfig, resolve
    from kvcargo.engine import cluster

    params, _ = cluster.build_params(resolve(SimConfig.build(requests=16)))
    channels = params.pf[:, 2].astype(np.int64)
    from kvcargo.engine.state import new_state

    return new_state(16, 1, 1, 2, 256, channels, 1, False, 1024), params


SCHEDULED_SAMPLE = {"requests": 400, "batch_policy": "chunked", "kv_policy": "paged"}
"""A small run of the scheduled engine: its arrays' types are the exported loop's and helpers'."""


def _build() -> ModuleType | None:
    """Compile the engine into the extension module (once; a few minutes on a cold numba cache); None
    if numba cannot (no C compiler)."""
    global _building
    print("kvcargo: compiling the simulation engine with numba, once after installing or upgrading "
          "(a few minutes)", file=sys.stderr, flush=True)
    from kvcargo.config import SimConfig, resolve
    from kvcargo.engine import cluster, sched_gaps, sched_run
    from kvcargo.metrics import summarize

    _building = True
    try:
        st, params = _sample()
        arrays = (*st, *writable(params))
        config = SimConfig.build(requests=400)
        out = cluster.run(resolve(config))  # plain Python: the helpers' arguments come from it
        sched = resolve(SimConfig.build(**SCHEDULED_SAMPLE))
        sched_arrays = tuple(sched_run.build(sched, sched_run.transfers_of(sched)))
        sched_out = cluster.run(sched)
        with _jit.dispatchers():
            # the helpers' signatures: numba's, from compiling them for a small run's arguments
            resolve(config)
            summarize(out)
            summarize(sched_out)
            sched_gaps.per_request(sched_out.steps[:, 1], sched_out.step_inst[:, 0], sched.n_decode,
                                   *sched_out.itl_runs, len(sched_out.arrival))
            signatures = {name: getattr(importlib.import_module(mod), name).signatures[0] for mod, name in HELPERS}
            return _compile(arrays, sched_arrays, signatures)
    finally:
        _building = False


def _compile(arrays: tuple[np.ndarray, ...], sched_arrays: tuple[np.ndarray, ...],
             signatures: dict[str, tuple[Any, ...]]) -> ModuleType | None:
    import shutil
    import tempfile
    import warnings

    import numba
    from numba.pycc import CC

    from kvcargo.engine.sched_state import SchedState

    names = [f"s_{f}" for f in State._fields] + [f"p_{f}" for f in Params._fields]
    sig = numba.int64(*[numba.typeof(a) for a in arrays])
    sched_sig = numba.int64(*[numba.typeof(a) for a in sched_arrays])
    target = _path()
    work = Path(tempfile.mkdtemp(prefix="kvcargo-aot-"))
    try:
        # pycc compiles a module-level function: the wrapper is written out as a tiny module.
        src = work / "kvcargo_engine_entry.py"
        src.write_text(
            "from kvcargo.engine._structs import by_pointer\n"
            "from kvcargo.engine.loop import run_events\n"
            "from kvcargo.engine.sched_loop import run_events as run_sched\n"
            "from kvcargo.engine.sched_state import SchedState\n"
            "from kvcargo.engine.state import Params, State\n\n\n"
            f"def {ENTRY}({', '.join(names)}):\n"
            f"    return run_events(by_pointer(State({', '.join(names[:len(State._fields)])})), "
            f"by_pointer(Params({', '.join(names[len(State._fields):])})))\n\n\n"
            f"def {SCHED_ENTRY}({', '.join(SchedState._fields)}):\n"
            f"    return run_sched(SchedState({', '.join(SchedState._fields)}))\n", encoding="utf-8")
        spec = importlib.util.spec_from_file_location("kvcargo_engine_entry", src)
        entry_mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(entry_mod)  # type: ignore[union-attr]
        cc = CC(MODULE)
        cc.output_dir = str(work)
        cc.verbose = False
        cc.export(ENTRY, sig)(getattr(entry_mod, ENTRY))
        cc.export(SCHED_ENTRY, sched_sig)(getattr(entry_mod, SCHED_ENTRY))
        types = {ENTRY: arg_spec(sig.args), SCHED_ENTRY: arg_spec(sched_sig.args)}
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
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(target.with_name("failed"), f"{type(exc).__name__}: {exc}".encode())
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _load()


def _write_atomically(path: Path, data: bytes) -> None:
    """Concurrent builders (test workers) never expose a partial file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def install() -> None:
    """Build the module now unless it is built, and fill numba's cache with the kernels it does not
    hold (an installer's step: ``scripts/setup.sh`` runs ``python -m kvcargo.engine.aot``, so a
    first run after installing compiles nothing)."""
    if not _jit.AVAILABLE:
        print("kvcargo: numba is not installed (or KVCARGO_JIT=0): the engine stays plain Python",
              file=sys.stderr)
        return
    if _load() is not None:
        print(f"kvcargo: the compiled simulation engine is built ({_path().parent})", file=sys.stderr)
    elif _wait_for_build() is None and _build() is not None:
        print(f"kvcargo: built the compiled simulation engine ({_path().parent})", file=sys.stderr)
    if _failed():
        _warm_scheduled()


def _warm_scheduled() -> None:
    """Where the module cannot be built: compile the serving levers' scheduled loop into numba's
    on-disk cache by one small run with every kernel compiled, as a first run that needed it
    (``kvcargo reproduce`` checks the levers) would otherwise compile it for minutes. Said on the
    terminal while numba compiles; nothing to do when its cache is warm."""
    from kvcargo.config import SimConfig
    from kvcargo.simulation import simulate

    _jit.compile_kernels()
    simulate(SimConfig.build(requests=64, batch_policy="chunked", kv_policy="paged")).summary  # noqa: B018


if __name__ == "__main__":
    from kvcargo.engine import aot  # this module under its own name, whose state the engine reads

    aot.install()
