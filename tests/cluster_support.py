"""Clusters of separate processes on this machine for the backend tests: a Ray head and a second
Ray node (``ray start``), a Dask scheduler and workers (``dask scheduler`` / ``dask worker``).

Every process is started in a session of its own and torn down by its session id (SIGTERM, then
SIGKILL for whatever of that session is still alive), so nothing outlives a test, even a failed
one, and no other Ray or Dask on the machine is touched (never ``ray stop``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent
TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cluster_env() -> dict[str, str]:
    """The environment of every cluster process: this checkout's sources (and these helpers, which
    the probes below run on the workers) first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), str(TESTS), env.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.2)


def session_pids(sid: int) -> list[int]:
    """Live processes whose session is ``sid`` (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def signal_session(sid: int, sig: int) -> None:
    """Send ``sig`` to every live process of session ``sid``."""
    for pid in session_pids(sid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Processes:
    """Processes started in sessions of their own, each with a log file; ``stop`` ends them."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}
        self.dirs: list[str] = []
        self.env: dict[str, str] = {}
        """Set for every process started from now on (and for a driver in this process)."""

    def tempdir(self) -> str:
        """A fresh short directory under /tmp (Ray's socket paths must stay under 108 bytes),
        removed by ``stop``."""
        self.dirs.append(tempfile.mkdtemp(prefix="kvc-", dir="/tmp"))
        return self.dirs[-1]

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**cluster_env(), **self.env}, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process of ``name``'s session (a machine lost, for SIGKILL)."""
        signal_session(self.procs[name].pid, sig)
        self.procs[name].wait(30)

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM every session, wait up to ``grace`` seconds, then SIGKILL what is left."""
        sids = [p.pid for p in self.procs.values()]
        for sid in sids:
            signal_session(sid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(session_pids(s) for s in sids):
            time.sleep(0.2)
        for sid in sids:
            signal_session(sid, signal.SIGKILL)
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        left = [pid for s in sids for pid in session_pids(s)]
        assert not left, f"processes still alive after the teardown: {left}"


@contextmanager
def processes(logs: Path) -> Iterator[Processes]:
    procs = Processes(logs)
    try:
        yield procs
    finally:
        procs.stop()


OBJECT_STORE_BYTES = 100_000_000
"""Each Ray node's object store (Ray's default is 30% of the machine's memory, per node): a sweep's
results are a few hundred kilobytes."""


def ray_cluster(procs: Processes, cpus_per_node: int = 1, nodes: int = 2) -> str:
    """``ray start --head`` and ``nodes - 1`` × ``ray start --address``; returns the address.

    Token authentication is off for the cluster and its drivers (``procs.env``): Ray turns it on
    whenever ``~/.ray/auth_token`` exists, a file any other Ray user of this machine may write or
    rewrite at any time, and a driver that imported Ray earlier keeps the mode it read then.
    """
    procs.env.update(RAY_AUTH_MODE="disabled")
    port = free_port()
    address = f"{HOST}:{port}"
    common = ("--block", "--node-ip-address", HOST, "--num-cpus", str(cpus_per_node), "--disable-usage-stats",
              "--object-store-memory", str(OBJECT_STORE_BYTES))
    procs.start("ray-head", str(BIN / "ray"), "start", "--head", "--port", str(port), "--include-dashboard",
                "false", "--temp-dir", procs.tempdir(), *common)
    wait_for(lambda: "Ray runtime started" in procs.log("ray-head") or procs.procs["ray-head"].poll() is not None,
             120, "the Ray head's start")
    assert procs.procs["ray-head"].poll() is None, procs.log("ray-head")
    for i in range(1, nodes):
        procs.start(f"ray-node{i}", str(BIN / "ray"), "start", "--address", address, *common)
    return address


def dask_cluster(procs: Processes, workers: int = 2) -> str:
    """``dask scheduler`` and ``workers`` × ``dask worker`` (one process, one thread each)."""
    port = free_port()
    address = f"tcp://{HOST}:{port}"
    procs.start("dask-scheduler", str(BIN / "dask"), "scheduler", "--host", HOST, "--port", str(port),
                "--no-dashboard")
    for i in range(1, workers + 1):
        procs.start(f"dask-worker{i}", str(BIN / "dask"), "worker", address, "--host", HOST, "--nthreads", "1",
                    "--nworkers", "1", "--name", f"worker{i}", "--no-dashboard", "--death-timeout", "60")
    return address


def node_of(seconds: float) -> str:
    """Where this task ran (the Ray node or the Dask worker), after ``seconds`` of sleep so that a
    handful of them spread over every worker."""
    time.sleep(seconds)
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        import ray

        return ray.get_runtime_context().get_node_id()
