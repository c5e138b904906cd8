"""The web server's simulation workers: a run stopped at the time limit is replaced by a spare
that was started (and had loaded the engine) before the limit was hit."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvcargo import simulate
from kvcargo.web.workers import SimPool, SimulationTimeout


def spare_pids(pool: SimPool, wait_s: float = 300.0) -> list[int]:
    """The pids of the pool's spares, once each has started and said it is ready."""
    spares = list(pool._ready.queue)
    deadline = time.monotonic() + wait_s
    out = []
    for fut in spares:
        out.append(fut.result(timeout=max(0.0, deadline - time.monotonic())).process.pid)
    return out


def live_pids(pool: SimPool) -> set[int]:
    return {w.process.pid for w in pool._live if w.process.is_alive()}


def test_the_run_after_a_timeout_is_served_by_the_warm_spare() -> None:
    pool = SimPool(workers=1, timeout_s=2.0, queue=0, spares=1)
    try:
        pool.warm()
        run = asyncio.run
        first = run(pool.run({"config": {"requests": 50}}))
        assert first["summary"]["completed"] == 50
        (spare,) = spare_pids(pool)
        (busy,) = live_pids(pool) - {spare}  # the worker of the pool's one thread
        with pytest.raises(SimulationTimeout, match="longer than 2 s"):
            run(pool.run({"config": {"requests": 3_000_000}}))
        assert busy not in live_pids(pool)  # the stopped run's process is gone
        r = run(pool.run({"config": {"link": "eth-25g", "rate": 14}}))
        assert r["summary"]["tpot_p99"] == simulate(link="eth-25g", rate=14).summary["tpot_p99"]
        (replacement,) = spare_pids(pool)
        assert replacement not in (spare, busy)  # the spare was taken and a new one started
        assert live_pids(pool) == {spare, replacement}  # the run went to the old spare: nothing else lives
    finally:
        pool.close()
    assert not live_pids(pool)


def test_no_spares_when_asked_for_none() -> None:
    pool = SimPool(workers=1, timeout_s=30.0, queue=0, spares=0)
    try:
        r = asyncio.run(pool.run({"config": {"requests": 20}}))
        assert r["summary"]["completed"] == 20
        assert spare_pids(pool) == [] and len(live_pids(pool)) == 1
    finally:
        pool.close()
    with pytest.raises(ValueError, match="spares at least 0"):
        SimPool(spares=-1)
