"""The planner: sweeps over simulation parameters, capacity searches and the best
prefill:decode split, run on every core of one machine or on a Ray / Dask cluster.

* :mod:`~kvcargo.planner.grid` — the grid of a sweep (``--vary``, TOML sweep files);
* :mod:`~kvcargo.planner.backends` — one ``map(fn, items)`` over local processes, Ray or Dask;
* :mod:`~kvcargo.planner.sweep` — run a grid, one plain row per run, resumable CSV / Parquet;
* :mod:`~kvcargo.planner.capacity` — the analytic ceilings of Appendix B and the
  bracket-and-bisect search for the highest sustainable rate;
* :mod:`~kvcargo.planner.plan` — the search over splits, devices and links, with analytic
  pruning and the Pareto front.

Nothing here changes a simulation: every row is what ``kvcargo simulate`` prints for the same
configuration, whichever backend ran it.
"""
