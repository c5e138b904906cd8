"""What the web API computes, without the web: the calculator panel, the catalog, a simulation
payload. The FastAPI routes (:mod:`kvcargo.web.app`) only parse, bound and serialise.

Parameter names, defaults and bounds are the CLI's: both faces take them from the parameter models,
:class:`~kvcargo.params.HandoffConfig` for the calculator and :class:`~kvcargo.config.SimConfig`
for the simulator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kvcargo import catalog as catalog_mod
from kvcargo.config import SimConfig
from kvcargo.cost import Pool
from kvcargo.errors import KvcargoError, clip
from kvcargo.handoff import HandoffResult, calculate_config
from kvcargo.params import SERVER_ONLY, HandoffConfig, build
from kvcargo.report import handoff as handoff_report
from kvcargo.report.data import jsonable
from kvcargo.report.text import ms, pct

SIM_LIMITS: dict[str, float] = {
    "prefill": 64, "decode": 64, "instances": 128, "link_channels": 64,
    "devices_per_instance": 64, "prefill_devices_per_instance": 64, "decode_devices_per_instance": 64,
    "prompt": 1_048_576, "output": 65_536, "max_batch": 4096, "token_budget": 1_048_576,
    "layer_groups": 256, "nics_per_instance": 64, "domain_size": 1024, "max_length": 1_048_576,
}
"""Bounds the web API puts on simulation parameters on top of SimConfig's own (one request must
not exhaust the machine). ``requests`` is bounded by the server's ``max_requests`` instead."""


def parse_handoff(query: Sequence[tuple[str, str]]) -> HandoffConfig:
    """Validate ``GET /api/handoff`` query parameters: :class:`HandoffConfig`'s fields less the
    server-only ones, each at most once; an empty optional parameter is unset."""
    values: dict[str, str] = {}
    for key, value in query:
        if key in values:
            raise KvcargoError(f"parameter {key} given more than once")
        values[key] = value
    _refuse_server_only(values)
    for key, field in HandoffConfig.model_fields.items():
        if values.get(key) == "" and field.default is None:
            del values[key]
    return HandoffConfig.build(**values)


def _refuse_server_only(values: Mapping[str, Any]) -> None:
    for key in SERVER_ONLY:
        if key in values:
            raise KvcargoError(f"--{key.replace('_', '-')} names a file on the server: not accepted by the web API")


def handoff(params: HandoffConfig, catalog_files: Sequence[str] = ()) -> dict[str, Any]:
    """The calculator: ``kvcargo handoff --json``'s numbers plus the CLI's text panel (``panel``)."""
    result, m, link, pool = calculate_config(params.model_copy(update={"catalog": tuple(catalog_files)}))
    return {**result.as_dict(), "layers": m.layers, "panel": panel(result, link.name, m.name, pool)}


def panel(result: HandoffResult, link_name: str, model_name: str, pool: Pool) -> dict[str, Any]:
    """``kvcargo handoff``'s text panel as a title and (label, value, note) rows: the very strings
    the CLI prints, so the page and the terminal cannot disagree."""
    title, rows = handoff_report.panel_rows(result, link_name, model_name, pool)
    return {"title": title, "rows": rows, "explain": handoff_report.EXPLANATION.get(result.handoff_kind, "")}


def catalog(catalog_files: Sequence[str] = ()) -> dict[str, Any]:
    """Every catalog entry by kind (SI units), as ``kvcargo catalog KIND --json``."""
    cat = catalog_mod.load(catalog_files)
    return {kind: {k: e.model_dump() for k, e in getattr(cat, kind).items()} for kind in catalog_mod.KINDS}


def handoff_defaults() -> dict[str, Any]:
    """HandoffConfig's defaults, less the server-only fields."""
    d = HandoffConfig().model_dump()
    for key in SERVER_ONLY:
        d.pop(key, None)
    return d


def simulate_defaults() -> dict[str, Any]:
    """SimConfig's defaults (``rate`` None means DEFAULT_RATE), less the server-only fields."""
    d = SimConfig().model_dump()
    for key in SERVER_ONLY:
        d.pop(key)
    return d


def check_simulation(body: Mapping[str, Any], max_requests: int, catalog_files: Sequence[str] = ()) -> SimConfig:
    """Validate a ``POST /api/simulate`` body (a JSON object) into a SimConfig, within the web API's bounds."""
    _refuse_server_only(body)
    for key in body:
        if key not in SimConfig.model_fields:
            raise KvcargoError(f"unknown parameter {clip('--' + str(key).replace('_', '-'))}")
    requests = body.get("requests")
    if isinstance(requests, int) and not isinstance(requests, bool) and requests > max_requests:
        raise KvcargoError(f"invalid --requests (got {requests}): at most {max_requests:,} per run "
                           "in the web API (kvcargo ui --max-requests)")
    config = build(SimConfig, dict(body), strict=True)  # strict: JSON true is not 1, "9" is not 9
    for key, limit in SIM_LIMITS.items():
        value = getattr(config, key)
        if value is not None and value > limit:
            raise KvcargoError(f"invalid --{key.replace('_', '-')} (got {value:g}): at most {limit:,.0f} "
                               "in the web API")
    if catalog_files:
        config = config.replace(catalog=tuple(catalog_files))
    return config


RESULT_ROWS = [
    ("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"),
    ("tpot_p50", "TPOT p50"), ("tpot_p99", "TPOT p99"),
    ("handoff_p50", "Hand-off p50"), ("handoff_p99", "Hand-off p99"),
    ("link_busy", "Link busy"), ("slo_attainment", "SLO attainment"), ("goodput_rps", "Goodput"),
    ("j_per_token", "Energy per output token"), ("link_j_per_request", "Link energy per request"),
    ("completed", "Completed"),
]


def result_table(summary: Mapping[str, Any]) -> list[dict[str, str]]:
    """The page's results table, formatted as the CLI report formats these figures."""

    def text(key: str) -> str:
        x = summary[key]
        if key.endswith(("_p50", "_p99")):
            return "—" if x is None or math.isnan(x) else f"{ms(x)} ms"
        if key in ("link_busy", "link_j_per_request") and not summary["transfers"]:
            return "— (no hand-off)"
        if key in ("link_busy", "slo_attainment"):
            return pct(x)
        if key == "goodput_rps":
            return "—" if math.isnan(x) else f"{x:.2f} req/s"
        if key == "j_per_token":
            return "—" if math.isnan(x) else f"{x:.3f} J"
        if key == "link_j_per_request":
            return f"{x:.4f} J"
        rejected = f" ({summary['rejected']:,} rejected: KV never fits)" if summary["rejected"] else ""
        return f"{summary['completed']:,} of {summary['requests']:,}{rejected}"

    rows = [{"key": key, "label": label, "text": text(key)} for key, label in RESULT_ROWS]
    return rows + [{"key": key, "label": label, "text": show(summary[key])}
                   for key, label, show in LEVER_ROWS if key in summary]


LEVER_ROWS = [
    ("mean_running", "Mean running batch", lambda x: f"{x:.2f}"),
    ("kv_token_frac", "KV allocated that holds tokens", lambda x: pct(x)),
    ("computed_prefill_tokens", "Prefill tokens computed", lambda x: f"{x:,}"),
    ("preemptions", "Preemptions", lambda x: f"{x:,}"),
    ("recompute_tokens", "Tokens recomputed", lambda x: f"{x:,}"),
    ("swap_out_GB", "Swapped to host", lambda x: f"{x:.3f} GB"),
    ("swap_seconds", "Host-link time", lambda x: f"{x:.3f} s"),
    ("prefix_hit_tokens", "Prefix cache hits (tokens)", lambda x: f"{x:,}"),
]
"""Rows the serving levers add to the table (when their metric is in the summary)."""


def run_simulation(config: dict[str, Any], bins: int = 200) -> dict[str, Any]:
    """One run as the API returns it: ``config`` and ``summary`` exactly as ``kvcargo simulate
    --json`` prints them, then the page's ``table``, ``plots`` and the run's ``wall_s``."""
    from kvcargo.report.timeseries import plot_data
    from kvcargo.simulation import simulate

    t0 = time.perf_counter()
    result = simulate(SimConfig.build(**config))
    payload = jsonable(result.to_dict())
    payload["table"] = result_table(result.summary)
    payload["plots"] = jsonable(plot_data(result, bins))
    payload["wall_s"] = time.perf_counter() - t0
    return payload
