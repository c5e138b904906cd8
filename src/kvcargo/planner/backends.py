"""Where the planner's runs execute, behind one interface: ``backend.map(fn, items)``.

``map`` yields ``(index, result)`` pairs as runs finish (so a progress bar can move); callers
put them back in ``items`` order, which is why the results never depend on the backend. ``fn``
must be a module-level function (it is pickled to the workers). An exception inside ``fn`` is
yielded as a :class:`TaskError` in place of that item's result, so one bad run never stops the
others. On Ray and Dask a chunk whose task is lost (its worker or node died, its result vanished
with a node, its owner lost track of it) is submitted again, up to :data:`RETRIES` times, before
its runs become TaskErrors; a chunk's results are yielded once, whole, so nothing is duplicated
or half-delivered. A local worker that dies breaks the whole pool: its runs become TaskErrors.

* ``local`` (default): every core of this machine, one process each (``spawn``, so the workers
  start clean and load the simulator's compiled cache from disk). A small job never starts them:
  runs execute in this process until they have taken :data:`INLINE_SECONDS` of CPU time, a few
  times what starting a worker costs, and only the rest goes to the pool.
* ``ray`` (``kvcargo[ray]``): connects to ``--address`` / ``RAY_ADDRESS``, or starts a local
  Ray instance (and stops it afterwards).
* ``dask`` (``kvcargo[dask]``): a ``distributed`` scheduler at ``--address`` /
  ``DASK_SCHEDULER_ADDRESS``, or a local cluster of processes.

Items travel in chunks (several runs per task) because a simulation can take milliseconds,
less than shipping a task.

Workers run numpy's BLAS on one thread (:data:`SINGLE_THREAD`; Ray and Dask workers do so by
default, local workers are started so): one process per core should not oversubscribe, and a
BLAS reduction's last bit depends on its thread count (``itl_mean`` is such a dot product), so
the rows are bit-identical on every backend. Runs in this process (:class:`InlineBackend`) use
whatever this process uses.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

from kvcargo.errors import KvcargoError

BACKENDS = ("local", "ray", "dask")
RETRIES = 3
"""Times a Ray or Dask chunk whose task was lost is submitted again (a run's own exception is a
result, never retried)."""
CONNECT_TIMEOUT_S = 60.0
"""How long to wait for a Dask scheduler to answer and for its first worker to join."""
INLINE_SECONDS = 4.0
"""CPU seconds of runs the local backend does in its own process before it starts worker processes
(each pays 1-2 s to import kvcargo and load the compiled engine on this project's 2-core
machine, so on two cores the pool only pays for jobs of several seconds more)."""
H = TypeVar("H")
"""A submitted task's handle (a future, a Ray object reference)."""
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _single_threaded() -> None:
    """Worker initializer: one BLAS thread (before numpy is imported by the first task)."""
    os.environ.update(SINGLE_THREAD)


@dataclass(frozen=True)
class TaskError:
    """What a run raised (or why its worker died), in place of its result."""

    message: str
    kind: str = "Exception"

    def __str__(self) -> str:
        return self.message


def describe_exception(exc: BaseException) -> str:
    """One line: the message of a KvcargoError, else ``Type: message`` and where it happened."""
    if isinstance(exc, KvcargoError):
        return str(exc)
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {os.path.basename(where[0].filename)}:{where[0].lineno})" if where else ""
    return ANSI.sub("", f"{type(exc).__name__}: {exc}{at}".replace("\n", " "))  # Ray colours its errors


def run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    """Apply ``fn`` to every item; an exception becomes a :class:`TaskError` for that item."""
    out: list[Any] = []
    for item in chunk:
        try:
            out.append(fn(item))
        except Exception as exc:  # noqa: BLE001 - recorded per run, the others go on
            out.append(TaskError(describe_exception(exc), type(exc).__name__))
    return out


def chunks(n: int, workers: int, per_worker: int = 4, max_size: int = 64) -> list[range]:
    """Split ``range(n)`` into contiguous chunks: about ``per_worker`` per worker, at most ``max_size``."""
    if n <= 0:
        return []
    size = max(1, min(max_size, -(-n // (max(1, workers) * per_worker))))
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


class Backend:
    """The interface: ``map(fn, items)`` yielding ``(index, result)`` as runs finish."""

    name = "base"
    workers = 1

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what this backend started (pools, clusters)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{self.name} backend, {self.workers} workers>"


class InlineBackend(Backend):
    """Everything in this process, in order (one worker, tests, tiny jobs)."""

    name = "inline"

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        for i, item in enumerate(items):
            yield i, run_chunk(fn, [item])[0]


class LocalBackend(Backend):
    """A pool of worker processes on this machine (default: one per core)."""

    name = "local"

    def __init__(self, workers: int | None = None, inline_seconds: float = INLINE_SECONDS) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None
        self._inline_s = 0.0
        self._inline_budget = inline_seconds

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            _check_main_importable()
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_single_threaded)
        return self._pool

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        first = 0
        while self._pool is None and first < len(items) and self._inline_s < self._inline_budget:
            t = time.process_time()  # CPU time: a loaded machine does not make the job look bigger
            result = run_chunk(fn, [items[first]])[0]
            self._inline_s += time.process_time() - t
            yield first, result
            first += 1
        if first == len(items):
            return
        yield from run_chunks(self._executor(), fn, items, first, self.workers, "a worker process", retries=0)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


def run_chunks(executor: Executor, fn: Callable[[Any], Any], items: Sequence[Any], first: int, workers: int,
               what: str, retries: int = RETRIES) -> Iterator[tuple[int, Any]]:
    """``items[first:]`` in about four chunks per worker on a ``concurrent.futures`` executor (a
    process pool, or Dask's ``Client.get_executor()``), yielding ``(index, result)`` as chunks finish."""
    parts = [range(first + r.start, first + r.stop) for r in chunks(len(items) - first, workers)]
    yield from gather(parts, lambda r: executor.submit(run_chunk, fn, [items[i] for i in r]),
                      lambda fs: wait(fs, return_when=FIRST_COMPLETED).done, lambda f: f.result(), what, retries)


def _check_main_importable() -> None:
    """Spawned workers re-run the main program's file: refuse (clearly) when there is none to re-run,
    as for a script piped on standard input, instead of every run failing with a broken pool."""
    import sys

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is not None and not os.path.exists(path):
        raise KvcargoError(f"the local backend's worker processes re-import the main program, but {path!r} is "
                           "not a file (a script on standard input?): save it to a file and run that, or use "
                           "one worker (workers=1 runs in this process)")


def gather(parts: Sequence[range], submit: Callable[[range], H], first_done: Callable[[list[H]], Iterable[H]],
           get: Callable[[H], list[Any]], who: str, retries: int = RETRIES) -> Iterator[tuple[int, Any]]:
    """Submit one task per chunk of item indices; yield ``(index, result)`` for a whole chunk as
    soon as its task is done. A task that failed (not a run: those are TaskErrors in its result) is
    submitted again up to ``retries`` times, then yields one TaskError per item."""
    pending = {submit(r): (r, 0) for r in parts}
    while pending:
        for handle in first_done(list(pending)):
            r, tries = pending.pop(handle)
            try:
                results = get(handle)
            except Exception as exc:  # noqa: BLE001 - a lost task fails its runs, not the sweep
                if tries < retries:
                    pending[submit(r)] = (r, tries + 1)
                    continue
                again = f" (after {tries + 1} tries)" if tries else ""
                results = [TaskError(f"{who} failed{again}: {describe_exception(exc)}", type(exc).__name__)] * len(r)
            yield from zip(r, results)


class RayBackend(Backend):
    """Tasks on a Ray cluster: ``address`` / ``RAY_ADDRESS``, else a local instance."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise KvcargoError("the ray backend needs Ray: pip install 'kvcargo[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS")
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False,
                                      "runtime_env": {"env_vars": dict(SINGLE_THREAD)}}
            if address:
                kwargs["address"] = address
            else:
                kwargs["num_cpus"] = workers or os.cpu_count() or 1
            try:
                ray.init(**kwargs)
            except Exception as exc:  # noqa: BLE001 - surface as one line
                raise KvcargoError(f"cannot start or reach Ray ({address or 'local'}): {exc}") from None
            self._started = True
        self._fixed = workers
        self.workers = workers or self._cpus()
        self._remote = ray.remote(max_retries=0)(run_chunk)  # lost tasks: gather() submits them again

    def _cpus(self) -> int:
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        ray = self._ray
        self.workers = self._fixed or self._cpus()  # nodes may have joined or left since
        # fn travels by value in every task (a module-level function pickles to its name): an object
        # put in the store would be one more thing a lost node or a busy owner can lose
        yield from gather(chunks(len(items), self.workers),
                          lambda r: self._remote.remote(fn, [items[i] for i in r]),
                          lambda refs: ray.wait(refs, num_returns=1)[0], ray.get, "a Ray task")

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


class DaskBackend(Backend):
    """Tasks on a Dask ``distributed`` scheduler: ``address``, else a local cluster."""

    name = "dask"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise KvcargoError("the dask backend needs Dask: pip install 'kvcargo[dask]'") from None
        address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
        self._cluster = None
        try:
            if address:
                self._client = Client(address, timeout=CONNECT_TIMEOUT_S)
            else:
                self._cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                                             processes=True, dashboard_address=None)
                self._client = Client(self._cluster)
        except Exception as exc:  # noqa: BLE001 - surface as one line
            raise KvcargoError(f"cannot start or reach Dask ({address or 'local'}): {exc}") from None
        try:
            self._client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
        except TimeoutError:
            self.close()
            raise KvcargoError(f"no Dask worker joined the scheduler at {address} within "
                               f"{CONNECT_TIMEOUT_S:g} s (start some with: dask worker {address})") from None
        self._fixed = workers
        self.workers = workers or self._threads()

    def _threads(self) -> int:
        return max(1, sum(self._client.nthreads().values()))

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        self.workers = self._fixed or self._threads()  # workers may have joined or left since
        yield from run_chunks(self._client.get_executor(pure=False), fn, items, 0, self.workers, "a Dask task")

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def get_backend(name: str = "local", workers: int | None = None, address: str | None = None) -> Backend:
    """A backend by name: ``local`` (default), ``ray``, ``dask`` (``inline`` for in-process)."""
    if workers is not None and workers < 1:
        raise KvcargoError(f"--workers must be >= 1, got {workers}")
    if name == "local":
        return LocalBackend(workers)
    if name == "inline":
        return InlineBackend()
    if name == "ray":
        return RayBackend(workers, address)
    if name == "dask":
        return DaskBackend(workers, address)
    raise KvcargoError(f"unknown backend {name!r}; valid choices: {', '.join(BACKENDS)}")
