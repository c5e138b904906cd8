"""Checks the web API makes in the request handler, before any simulation worker is involved.

A bad request must be answered 4xx by the server itself: a worker may be starting, busy or
replaced after a time limit, and none of that may turn a typo into a 500. Two layers:

* :func:`check_catalog_keys`: every parameter that names a catalog entry (model, devices,
  links, codec, draft), with an error that names the parameter (``invalid --prefill-device:
  unknown device 'tpu'; valid choices: ...``), so the page can mark the field and show its label;
* :func:`check_run`: everything else a run checks before its engine starts (fit in memory,
  lever combinations, workload limits, the models the scheduled engine covers), by resolving
  the configuration on a short prefix of its request stream: milliseconds at any request count.

An error whose message names no flag (a model that does not fit a pool, a draft of another
vocabulary) carries the parameter to change (``KvcargoError.field``, set where it is raised);
:func:`with_field` resolves it to the pool's own parameter where the configuration sets one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcargo import catalog as catalog_mod
from kvcargo.catalog import Catalog
from kvcargo.config import SimConfig, resolve
from kvcargo.errors import KvcargoError, unknown
from kvcargo.serving import check_model
from kvcargo.speculative import MTP

CATALOG_FIELDS: dict[str, tuple[str, str]] = {
    "model": ("models", "model"), "device": ("devices", "device"), "prefill_device": ("devices", "device"),
    "decode_device": ("devices", "device"), "link": ("links", "link"), "scale_up_link": ("links", "link"),
    "host_link": ("links", "link"), "kv_compress": ("codecs", "codec"), "speculative": ("models", "draft"),
}
"""Parameters (of the simulator and the calculator) that name a catalog entry: table, kind."""
EXTRA_CHOICES = {"speculative": (MTP,)}
"""Valid values of a catalog parameter that are not catalog keys."""
SAMPLE_REQUESTS = 64
"""Requests :func:`check_run` generates: enough to exercise the workload's checks, cheap at any size."""


def check_catalog_keys(values: Mapping[str, Any], cat: Catalog) -> None:
    """Refuse a catalog parameter in ``values`` whose key ``cat`` does not hold (None is unset)."""
    for name, (table, kind) in CATALOG_FIELDS.items():
        key = values.get(name)
        if key is None:
            continue
        valid = [*getattr(cat, table), *EXTRA_CHOICES.get(name, ())]
        if key not in valid:
            raise KvcargoError(f"invalid --{name.replace('_', '-')}: {unknown(kind, key, valid)}")


def check_run(config: SimConfig) -> None:
    """Resolve ``config`` as a run does (catalog, pools, levers, workload checks), on at most
    :data:`SAMPLE_REQUESTS` of its requests; raises what the run would raise before its engine."""
    check_catalog_keys(config.model_dump(), catalog_mod.load(config.catalog))
    try:
        check_model(resolve(config.replace(requests=min(config.requests, SAMPLE_REQUESTS))))
    except KvcargoError as exc:
        raise with_field(exc, config) from None


def with_field(exc: KvcargoError, config: SimConfig) -> KvcargoError:
    """``exc`` with the parameter a user should change resolved against ``config``: the pool's own
    parameter (``prefill_devices_per_instance``) where the error concerns one pool and the
    configuration sets that pool's value, else the shared one (``devices_per_instance``)."""
    if exc.field is not None and exc.pool is not None:
        own = f"{exc.pool}_{exc.field}"
        if own in SimConfig.model_fields and getattr(config, own) is not None:
            exc.field = own
        exc.pool = None
    return exc
