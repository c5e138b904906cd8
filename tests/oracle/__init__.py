"""Independent test oracles for kvcargo.

:mod:`oracle.simpy_oracle` is a deliberately simple SimPy re-implementation of the reference
simulator's event semantics (reference-semantics §6), used to check the real engine. Its step
costs (:mod:`oracle.costs`), hand-offs (:mod:`oracle.handoff`) and summary
(:mod:`oracle.summary`) are restated from the spec as well: no kvcargo code but the catalog.
:mod:`oracle.serving_oracle` models the companion's scheduled instances (batching policies, KV
policies, paging with recompute and swap, disaggregated reserve-then-transfer, prefix caching,
closed-loop sessions) the same plain way.
"""

from .simpy_oracle import CompressionSpec, OracleResult, PoolSpec, run_oracle, run_resolved
from .summary import summarize

__all__ = ["CompressionSpec", "OracleResult", "PoolSpec", "run_oracle", "run_resolved", "summarize"]
