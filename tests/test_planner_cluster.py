"""The Ray and Dask backends on real clusters of separate processes on 127.0.0.1, as a user who
outgrew one machine runs them (``ray start --head`` plus ``ray start --address``; ``dask
scheduler`` plus two ``dask worker``): the sweep spreads over both nodes and gives the local
backend's rows; a worker lost in the middle of a sweep loses no row; a driver killed in the
middle leaves a valid CSV from which a re-run finishes only the missing rows.

Each test starts its own cluster and tears every process of it down, even on failure
(:mod:`cluster_support`).
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_support import Processes, dask_cluster, node_of, processes, ray_cluster, wait_for

from kvcargo.planner import grid as grid_mod
from kvcargo.planner.backends import Backend, LocalBackend, get_backend
from kvcargo.planner.sweep import read_csv, run_sweep

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BASE = {"requests": 20_000}
VARY = ["rate=6:15:1", "link=ib-ndr,eth-25g", "kv-compress=default,fp8"]
GRID = grid_mod.build(BASE, VARY)  # 40 runs of ~50 ms each
LONG_BASE = {"requests": 50_000}
LONG_VARY = ["rate=6:15:0.5", *VARY[1:]]
LONG_GRID = grid_mod.build(LONG_BASE, LONG_VARY)  # 76 runs of ~0.1 s: more than one checkpoint (2 s)


def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows]


@pytest.fixture(scope="module")
def local_rows() -> dict[str, list[dict[str, Any]]]:
    """Both grids on the local backend (which also compiles the engine's cache for the workers)."""
    with LocalBackend(2) as be:
        return {"short": run_sweep(GRID, be).rows, "long": run_sweep(LONG_GRID, be).rows}


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    with processes(tmp_path) as p:
        yield p


class KillAfterFirst(Backend):
    """Another backend whose first result triggers ``kill``: the rest of the sweep is in flight."""

    def __init__(self, inner: Backend, kill) -> None:
        self.inner, self.kill, self.name, self.workers = inner, kill, inner.name, inner.workers

    def map(self, fn, items):
        for n, pair in enumerate(self.inner.map(fn, items)):
            if n == 0:
                self.kill()
            yield pair


def spread(backend: Backend) -> set[str]:
    """The nodes (Ray) or workers (Dask) that ran eight half-second probes."""
    return {r for _, r in backend.map(node_of, [0.5] * 8)}


def driver_killed_then_resumed(procs: Processes, backend_args: list[str], backend: Backend, out: Path,
                               expected: list[dict[str, Any]]) -> None:
    """``kvcargo sweep`` as a separate driver, SIGKILLed once its first checkpoint is on disk; the
    file then holds whole rows only, and the same sweep run again runs exactly the missing ones."""
    flags = [a for k, v in LONG_BASE.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    argv = [sys.executable, "-m", "kvcargo", "sweep", *flags, *[a for v in LONG_VARY for a in ("--vary", v)],
            *backend_args, "--out", str(out), "--no-progress"]
    driver = procs.start("driver", *argv)
    wait_for(lambda: out.exists() or driver.poll() is not None, 240, "the driver's first checkpoint")
    procs.kill("driver")
    assert driver.returncode != 0, f"the sweep ended before it could be interrupted:\n{procs.log('driver')}"
    with open(out, newline="") as fh:
        raw = list(csv.reader(fh))
    assert raw and all(len(r) == len(raw[0]) for r in raw)  # no half-written line
    kept = read_csv(out)
    keys = [r["key"] for r in kept]
    assert 0 < len(kept) < len(LONG_GRID.points()) and len(set(keys)) == len(keys)
    assert all(r["status"] == "ok" for r in kept)
    by_key = {r["key"]: r for r in comparable(expected)}
    assert all(by_key[r["key"]] == r for r in comparable(kept))  # the rows it kept are exact

    res = run_sweep(LONG_GRID, backend, out)
    assert (res.skipped, res.ran) == (len(kept), len(LONG_GRID.points()) - len(kept))
    final = read_csv(out)
    assert len({r["key"] for r in final}) == len(final) == len(expected)
    assert comparable(final) == comparable(expected)


@pytest.mark.dask
def test_dask_scheduler_and_two_workers_give_the_local_rows_and_survive_a_lost_worker(procs, local_rows) -> None:
    pytest.importorskip("distributed")
    address = dask_cluster(procs, workers=2)
    with get_backend("dask", address=address) as be:
        wait_for(lambda: len(be._client.nthreads()) == 2, 120, "two Dask workers")
        assert spread(be) == {"worker1", "worker2"} and be.workers == 2
        assert comparable(run_sweep(GRID, be).rows) == comparable(local_rows["short"])

        killing = KillAfterFirst(be, lambda: procs.kill("dask-worker2"))
        res = run_sweep(GRID, killing)
        assert procs.procs["dask-worker2"].poll() is not None
        assert len(be._client.nthreads()) == 1  # the scheduler knows the worker is gone
    assert res.failed == 0 and comparable(res.rows) == comparable(local_rows["short"])


@pytest.mark.dask
def test_dask_sweep_resumes_after_its_driver_is_killed(procs, local_rows, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    address = dask_cluster(procs, workers=2)
    with get_backend("dask", address=address) as be:
        wait_for(lambda: len(be._client.nthreads()) == 2, 120, "two Dask workers")
        driver_killed_then_resumed(procs, ["--backend", "dask", "--address", address], be, tmp_path / "s.csv",
                                   local_rows["long"])


def ray_driver(procs: Processes, monkeypatch: pytest.MonkeyPatch) -> str:
    """A two-node Ray cluster, and this process set up to be its driver."""
    address = ray_cluster(procs, cpus_per_node=1, nodes=2)
    for key, value in procs.env.items():
        monkeypatch.setenv(key, value)
    return address


@pytest.mark.ray
def test_ray_head_and_second_node_give_the_local_rows_and_survive_a_lost_node(procs, local_rows, monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    address = ray_driver(procs, monkeypatch)
    with get_backend("ray", address=address) as be:
        wait_for(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, 120, "two Ray nodes")
        assert len(spread(be)) == 2 and be.workers == 2
        assert comparable(run_sweep(GRID, be).rows) == comparable(local_rows["short"])

        killing = KillAfterFirst(be, lambda: procs.kill("ray-node1"))
        res = run_sweep(GRID, killing)
        assert procs.procs["ray-node1"].poll() is not None
    assert res.failed == 0 and comparable(res.rows) == comparable(local_rows["short"])


@pytest.mark.ray
def test_ray_sweep_resumes_after_its_driver_is_killed(procs, local_rows, tmp_path: Path, monkeypatch) -> None:
    ray = pytest.importorskip("ray")
    address = ray_driver(procs, monkeypatch)
    with get_backend("ray", address=address) as be:
        wait_for(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, 120, "two Ray nodes")
        driver_killed_then_resumed(procs, ["--backend", "ray", "--address", address], be, tmp_path / "s.csv",
                                   local_rows["long"])
