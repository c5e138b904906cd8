"""Execution backends: the same sweep gives equal rows on local processes, Ray and Dask."""

from __future__ import annotations

import math
import os

import pytest

from kvcargo.errors import KvcargoError
from kvcargo.planner import grid as grid_mod
from kvcargo.planner.backends import LocalBackend, TaskError, get_backend
from kvcargo.planner.sweep import run_sweep


def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Equal rows, NaN equal to NaN (and the rows of a successful run hold no NaN at all here)."""
    def norm(r: dict) -> dict:
        return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}

    return [norm(r) for r in a] == [norm(r) for r in b]


GRID = grid_mod.build({"requests": 300}, ["rate=8,14", "link=ib-ndr,eth-25g", "kv-compress=default,fp8"])


def explode(x: int) -> int:
    if x == 3:
        raise ValueError("three is right out")
    if x == 5:
        os._exit(1)  # the worker process dies
    return x * x


def die_once(item: tuple[str, int]) -> int:
    """``x * x``; the process running item 2 dies the first time (a lost worker, then a retry)."""
    folder, x = item
    marker = os.path.join(folder, f"died-{x}")
    if x == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return x * x


@pytest.fixture(scope="module")
def local_rows() -> list[dict]:
    with LocalBackend(2, inline_seconds=0) as be:
        return run_sweep(GRID, be).rows


def test_local_processes_run_the_grid(local_rows: list[dict]) -> None:
    assert len(local_rows) == 8 and all(r["status"] == "ok" for r in local_rows)
    assert [r["key"] for r in local_rows] == [grid_mod.point_key(p) for p in GRID.points()]


def test_a_small_job_runs_in_this_process_and_gives_the_same_rows(local_rows: list[dict]) -> None:
    with LocalBackend(2) as be:
        rows = run_sweep(GRID, be).rows
        assert be._pool is None  # eight runs of 300 requests take far less than starting a worker
    assert same_rows(rows, local_rows)


def test_the_rest_of_a_job_goes_to_the_workers_once_this_process_has_spent_its_share() -> None:
    with LocalBackend(2, inline_seconds=1e-9) as be:
        out = dict(be.map(explode, [1, 2, 4, 6]))
        assert be._pool is not None
    assert out == {0: 1, 1: 4, 2: 16, 3: 36}


def test_local_backend_records_exceptions_and_dead_workers() -> None:
    with LocalBackend(2, inline_seconds=0) as be:
        out = dict(be.map(explode, [1, 2, 3, 4]))
    assert (out[0], out[1], out[3]) == (1, 4, 16)  # keyed by position in the items
    assert isinstance(out[2], TaskError) and out[2].kind == "ValueError"
    assert out[2].message.startswith("ValueError: three is right out (at test_planner_backends.py:")
    with LocalBackend(1, inline_seconds=0) as be:
        dead = dict(be.map(explode, [5]))
    assert isinstance(dead[0], TaskError) and "worker process failed" in dead[0].message


def test_unknown_backend_and_bad_workers() -> None:
    with pytest.raises(KvcargoError, match="unknown backend 'spark'"):
        get_backend("spark")
    with pytest.raises(KvcargoError, match="--workers must be >= 1"):
        get_backend("local", workers=0)


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # the workers import this file's functions
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_ray_gives_the_same_rows_as_local(ray_instance, local_rows: list[dict], tmp_path) -> None:
    with get_backend("ray") as be:
        assert be.workers == 2
        res = run_sweep(GRID, be, tmp_path / "ray.csv")
    assert same_rows(res.rows, local_rows)
    with LocalBackend(2, inline_seconds=0) as be:
        run_sweep(GRID, be, tmp_path / "local.csv")
    assert (tmp_path / "ray.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()
    assert ray_instance.is_initialized()  # an instance the backend did not start is left running


@pytest.mark.ray
def test_ray_runs_a_lost_task_again(ray_instance, tmp_path) -> None:
    with get_backend("ray") as be:
        out = dict(be.map(die_once, [(str(tmp_path), x) for x in range(6)]))
    assert out == {x: x * x for x in range(6)} and (tmp_path / "died-2").exists()


@pytest.mark.dask
def test_dask_gives_the_same_rows_as_local(local_rows: list[dict]) -> None:
    pytest.importorskip("distributed")
    with get_backend("dask", workers=2) as be:
        res = run_sweep(GRID, be)
    assert same_rows(res.rows, local_rows)


def test_a_lost_chunk_is_submitted_again_and_delivered_once() -> None:
    """``gather``: a task that fails (a lost worker, node or object; not a run's exception) is
    submitted again; each index is yielded exactly once, from a whole chunk; past the retries its
    runs become TaskErrors."""
    from kvcargo.planner.backends import gather

    submitted: list[range] = []
    lost = {range(2, 4): 2, range(4, 6): 99}  # chunk -> how many of its submissions are lost

    def submit(r: range) -> tuple[range, int]:
        submitted.append(r)
        return r, submitted.count(r)

    def get(handle: tuple[range, int]) -> list[int]:
        r, attempt = handle
        if attempt <= lost.get(r, 0):
            raise ConnectionError(f"lost {r.start}")
        return [i * i for i in r]

    out = list(gather([range(0, 2), range(2, 4), range(4, 6)], submit, lambda hs: hs[:1], get, "a task", retries=3))
    assert sorted(i for i, _ in out) == list(range(6))  # every index once
    assert dict(out)[2] == 4 and dict(out)[3] == 9  # delivered by its third submission
    assert submitted.count(range(2, 4)) == 3 and submitted.count(range(4, 6)) == 4
    assert all(isinstance(dict(out)[i], TaskError) for i in (4, 5))
    assert dict(out)[4].message.startswith("a task failed (after 4 tries): ConnectionError: lost 4 (at ")
