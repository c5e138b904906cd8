"""Simulations off the server process, with a wall-clock limit that really stops them.

A :class:`SimPool` owns ``workers`` threads; each drives its own worker process (spawned, so it
is safe next to the server's threads) over a pipe, one run at a time. A run that passes
``timeout_s`` is stopped by killing its process; the next run on that thread takes a warm spare
(``spares`` processes are kept started and ready, and each one taken is replaced in the
background), so it does not wait the seconds a new process takes to load the engine. Runs beyond
``workers`` wait in a queue of at most ``queue`` and are refused when it is full. The server's
event loop only awaits futures, so the calculator never waits for a simulation.

Kept rather than a library pool: ``concurrent.futures`` cannot stop a running task (only kill
the whole pool), no maintained pool among kvcargo's dependencies kills one task's process at a
deadline and hands the next run an already-started spare, and the planner's local backend
batches work without deadlines.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from kvcargo.errors import KvcargoError

START_TIMEOUT_S = 900.0
"""How long a new worker may take to start (the first start after installing compiles the
engine: a few minutes)."""
WARM_UNITS = 100_000
"""Work a worker prepares the engine for at start (see kvcargo.engine.aot.prepare)."""
SHUTTING_DOWN = "the server is shutting down"


class SimulationTimeout(RuntimeError):
    """The run passed the server's wall-clock limit and was stopped."""


class SimulatorBusy(RuntimeError):
    """Every worker is busy and the queue is full."""


class WorkerFailed(RuntimeError):
    """A worker died or failed with something other than bad input."""


def _serve(conn: Connection) -> None:
    """A worker process: warm the engine up, then run jobs until the pipe closes."""
    # Ctrl-C in a terminal reaches the whole process group: the server stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from kvcargo.engine import aot
    from kvcargo.web.service import run_simulation

    # Build the compiled engine now if it is missing (inside START_TIMEOUT_S, not a timed run):
    # the runs the server allows are large enough for it to pay.
    aot.prepare(WARM_UNITS, accumulate=False)
    run_simulation({"requests": 2})
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            conn.send(("ok", run_simulation(**job)))
        except KvcargoError as exc:
            conn.send(("invalid", (str(exc), exc.field, exc.pool)))
        except Exception as exc:  # reported to the client as a 500, the worker lives on
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


@dataclass(eq=False)
class _Worker:
    process: Any
    conn: Connection
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while stopping: close() and the run's own thread may stop a worker at the same time."""

    def stop(self) -> None:
        with self.lock:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5)
            self.conn.close()


class SimPool:
    """Worker processes behind an async ``run(job)``; see the module docstring."""

    def __init__(self, workers: int = 2, timeout_s: float = 30.0, queue: int = 8, spares: int = 1) -> None:
        if workers < 1 or spares < 0:
            raise ValueError("workers must be at least 1 and spares at least 0")
        self.workers, self.timeout_s, self.queue, self.spares = workers, timeout_s, queue, spares
        self._ctx = mp.get_context("spawn")
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="kvcargo-sim")
        self._starter = ThreadPoolExecutor(workers + spares, thread_name_prefix="kvcargo-sim-start")
        self._ready: queue_mod.Queue[Future[_Worker]] = queue_mod.Queue()
        """Spare workers, started or starting, oldest first."""
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: set[_Worker] = set()
        self._pending = 0
        self._closed = False

    # --------------------------------------------------------------- on the pool's threads

    def _worker(self) -> _Worker:
        """This thread's worker: its own while alive, else the oldest spare (then replaced)."""
        w: _Worker | None = getattr(self._local, "worker", None)
        if w is not None and w.process.is_alive():
            return w
        if w is not None:
            self._forget(w)
        try:
            spare = self._ready.get_nowait()
        except queue_mod.Empty:  # none kept yet (or spares=0): start one for this thread
            spare = self._starter.submit(self._start)
        w = spare.result()
        self._local.worker = w
        # Only now: on a cold engine cache every new process compiles the engine, and the
        # spare should find it compiled rather than compete with this worker for the CPU.
        self._add_spare()
        return w

    def _add_spare(self) -> None:
        with self._lock:
            if not self._closed and self._ready.qsize() < self.spares:
                self._ready.put(self._starter.submit(self._start))

    def _start(self) -> _Worker:
        """A new worker process, once it has loaded the engine and said it is ready."""
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="kvcargo-sim-worker")
        process.start()
        child.close()
        w = _Worker(process, parent)
        with self._lock:
            closed = self._closed
            if not closed:
                self._live.add(w)
        if closed:
            w.stop()
            raise WorkerFailed(SHUTTING_DOWN)
        if not parent.poll(START_TIMEOUT_S):
            self._forget(w)
            raise WorkerFailed("the simulation worker did not start in time")
        try:
            parent.recv()
        except EOFError:
            self._forget(w)
            raise WorkerFailed("the simulation worker failed to start") from None
        return w

    def _forget(self, w: _Worker) -> None:
        w.stop()
        with self._lock:
            self._live.discard(w)
        if getattr(self._local, "worker", None) is w:
            self._local.worker = None

    def _call(self, job: dict[str, Any] | None) -> Any:
        w = self._worker()
        if job is None:  # warm-up only
            return None
        t0 = time.perf_counter()
        w.conn.send(job)
        if not w.conn.poll(self.timeout_s):
            self._forget(w)
            raise SimulationTimeout(f"the run took longer than {self.timeout_s:g} s and was stopped "
                                    "(kvcargo ui --timeout); try fewer requests")
        try:
            status, value = w.conn.recv()
        except EOFError:
            self._forget(w)
            raise WorkerFailed(f"the simulation worker died after {time.perf_counter() - t0:.1f} s "
                               "(out of memory?)") from None
        if status == "invalid":
            message, field, pool = value
            raise KvcargoError(message, field=field, pool=pool)
        if status == "error":
            raise WorkerFailed(value)
        return value

    # --------------------------------------------------------------------- on the event loop

    async def run(self, job: dict[str, Any]) -> Any:
        """Run ``job`` (keyword arguments of :func:`kvcargo.web.service.run_simulation`)."""
        with self._lock:
            if self._closed:
                raise SimulatorBusy(SHUTTING_DOWN)
            if self._pending >= self.workers + self.queue:
                raise SimulatorBusy(f"the simulator is busy ({self._pending} runs in progress or waiting); "
                                    "try again shortly")
            self._pending += 1
        try:
            return await asyncio.wrap_future(self._executor.submit(self._call, job))
        except (Exception, asyncio.CancelledError):
            if self._closed:  # stopped by close(): however the run ended, the answer is the same
                raise SimulatorBusy(SHUTTING_DOWN) from None
            raise
        finally:
            with self._lock:
                self._pending -= 1

    def warm(self) -> None:
        """Start every worker in the background (returns at once); the spares follow them."""
        for _ in range(self.workers):
            self._executor.submit(self._call, None)

    def close(self) -> None:
        """Stop every worker at once: runs in progress or waiting end with :class:`SimulatorBusy`
        (the server is shutting down)."""
        with self._lock:
            self._closed = True
            live = list(self._live)
            self._live.clear()
        for w in live:
            w.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._starter.shutdown(wait=False, cancel_futures=True)
