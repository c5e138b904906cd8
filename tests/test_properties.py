"""Property-based tests of every input boundary: any input gives either a correct result or a
one-line error (exit status 2 on the CLI, HTTP 4xx on the web) — never a traceback, NaN or
infinity in the output, or an overflowed number. Examples are bounded so the suite stays fast.
"""

from __future__ import annotations

import json
import math
import os
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvcargo import catalog as catalog_mod
from kvcargo import ced
from kvcargo.cli import main
from kvcargo.config import SimConfig
from kvcargo.cost import Pool, shape
from kvcargo.errors import KvcargoError
from kvcargo.handoff import calculate_config
from kvcargo.params import HandoffConfig

CAT = catalog_mod.load(())
EXAMPLES = int(os.environ.get("KVCARGO_PROPERTY_EXAMPLES", "40"))
"""Examples per property (bounded so CI stays fast; raise it to search harder)."""
BOUNDED = settings(max_examples=EXAMPLES, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

EDGES = [0, 1, -1, 0.5, 1e-300, 1e-7, 1e6, 1e9, 1e300, 2**31, 2**63, 2**64, 10**20, 32_768, 32_769]
numbers = st.one_of(st.integers(-(10**24), 10**24), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(EDGES))
plausible = st.one_of(st.integers(1, 64), st.floats(0.01, 100.0), st.sampled_from(["fp8", "ratio", "layerwise", "nic"]))
anything = st.one_of(numbers, plausible, plausible, st.booleans(), st.none(), st.text(max_size=6),
                     st.lists(st.integers(), max_size=2))


def _finite_tree(x: Any) -> None:
    """Every number in a JSON-like tree is finite and not absurdly large (no overflow)."""
    if isinstance(x, dict):
        for v in x.values():
            _finite_tree(v)
    elif isinstance(x, list):
        for v in x:
            _finite_tree(v)
    elif isinstance(x, float):
        assert math.isfinite(x) and abs(x) < 1e30, x


def _one_line(message: str) -> None:
    assert message and "\n" not in message.strip() and "Traceback" not in message


def _json_or_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    """Run a command in process: its JSON output, or None after checking it failed in one line."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    if code == 0:
        return json.loads(out.out)
    assert code == 2 and out.out == "", out
    _one_line(out.err)
    return None


# ------------------------------------------------------------------------- the calculator

@BOUNDED
@given(model=st.sampled_from([*CAT.models, "nope"]), prompt=st.one_of(st.integers(-5, 10**13), st.sampled_from(EDGES)),
       link=st.sampled_from([*CAT.links, ""]), codec=st.sampled_from([None, *CAT.codecs]),
       keep=st.one_of(st.none(), numbers), ratio=st.one_of(st.none(), numbers),
       send=st.sampled_from(["whole", "layerwise"]), device=st.sampled_from([*CAT.devices]),
       n=st.one_of(st.integers(-2, 2000)))
def test_calculator_is_right_or_refuses(model, prompt, link, codec, keep, ratio, send, device, n) -> None:
    try:
        r, m, ln, pool = calculate_config(HandoffConfig.build(
            model=model, prompt=prompt, link=link, kv_compress=codec, kv_keep=keep, kv_ratio=ratio, send=send,
            device=device, devices_per_instance=n), CAT)
    except KvcargoError as exc:
        _one_line(str(exc))
        return
    _finite_tree(r.as_dict())
    s = shape(m)
    assert r.kv_bytes == s.handoff_bytes(prompt) and r.kv_bytes > 0
    if codec is None:
        assert r.transfer_s == ln.latency + r.wire_bytes / ln.bandwidth
    else:  # an in-transit stage adds its latency, and may be slower than the wire
        assert r.transfer_s >= ln.latency + r.wire_bytes / ln.bandwidth
    # the prefill takes at least its compute at full rate: an overflowed FLOP count would not (a
    # causal encoder-decoder's prompt token touches only the encoder and the decoder's K/V projections)
    touched = ced.split(m).p_prompt if ced.is_ced(m) else s.p_layers
    assert r.prefill_s >= (2 * touched * prompt) / Pool(CAT.device(device), n).flop_rate
    assert 0 < r.exposed_s <= r.transfer_s


@BOUNDED
@given(args=st.lists(st.tuples(st.sampled_from(["--prompt", "--kv-keep", "--kv-ratio", "--devices-per-instance",
                                                 "--kv-compress", "--model", "--link", "--send"]),
                               st.one_of(numbers.map(str), st.sampled_from(["ratio", "freq-keep-k", "fp8", "x"]))),
                     max_size=3))
def test_handoff_command_prints_json_or_one_line(args, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json_or_one_line(["handoff", "--json", *[a for pair in args for a in pair]], capsys)
    if data is not None:
        _finite_tree(data)


# ----------------------------------------------------------------------- the simulator

TRACE_ONLY = ("time_scale", "limit", "window", "arrival_col", "prompt_col", "output_col", "time_unit")
FIELDS = [f for f in SimConfig.model_fields if f not in ("catalog", "workload_file", *TRACE_ONLY)]


KEYS = {"model": CAT.models, "device": CAT.devices, "prefill_device": CAT.devices, "decode_device": CAT.devices,
        "link": CAT.links, "kv_compress": CAT.codecs}


def typed_values(name: str) -> st.SearchStrategy[Any]:
    """Values of the field's own type, in and around its range (and, now and then, anything)."""
    annotation = SimConfig.model_fields[name].annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    base = typing.get_args(args[0])[0] if typing.get_origin(args[0]) is typing.Annotated else args[0]
    if typing.get_origin(base) is typing.Literal:
        own = st.sampled_from(typing.get_args(base))
    elif base is bool:
        own = st.booleans()
    elif base is int:
        own = st.one_of(st.integers(1, 64), st.sampled_from([0, 2**24, 32_768, 10**6]))
    elif base is float:
        own = st.one_of(st.floats(1e-3, 1e4), st.sampled_from([0.0, 1e-6, 1e6, 1e300, math.nan, math.inf]))
    else:
        own = st.sampled_from(sorted(KEYS.get(name, ["x"])))
    return st.one_of(*[own] * 6, anything)


bodies = st.lists(st.sampled_from(FIELDS), max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: typed_values(n) for n in names}))


@settings(max_examples=max(1, EXAMPLES * 3 // 4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_simulation_api_is_finite_or_refuses(body: dict[str, Any]) -> None:
    """The web API's validation and run, in process (the page's server does the same in a worker)."""
    from kvcargo.web import service

    body = {"requests": 40, **body}
    try:
        config = service.check_simulation(body, max_requests=200)
        payload = service.run_simulation(config.model_dump(), bins=20)
    except KvcargoError as exc:
        _one_line(str(exc))
        event("refused")
        return
    event("ran")
    json.dumps(payload, allow_nan=False)  # strict JSON: NaN and infinities became null
    _finite_tree(payload["summary"])
    s = payload["summary"]
    assert s["completed"] + s["rejected"] == s["requests"] == config.requests
    assert s["clipped_prompts"] <= s["requests"] and s["clipped_outputs"] <= s["requests"]


@settings(max_examples=max(1, EXAMPLES * 5 // 8), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(flags=st.dictionaries(st.sampled_from(["rate", "prompt", "output", "prompt_cv", "max_length", "seed",
                                              "token_budget", "max_batch", "ttft_slo", "link_channels"]),
                             numbers.map(str), max_size=3))
def test_simulate_command_prints_json_or_one_line(flags: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--summary-only", "--requests", "30"]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", v]
    data = _json_or_one_line(argv, capsys)
    if data is not None:
        _finite_tree(data["summary"])
        assert data["summary"]["requests"] == 30


@BOUNDED
@given(query=st.dictionaries(st.sampled_from(["prompt", "model", "link", "kv_compress", "kv_keep", "kv_ratio", "send",
                                              "device", "devices_per_instance", "extra"]),
                             st.one_of(numbers.map(str), st.text(max_size=8)), max_size=4))
def test_calculator_api_answers_or_refuses_with_4xx(query: dict[str, str]) -> None:
    pytest.importorskip("fastapi")
    from kvcargo.web import service

    try:
        data = service.handoff(service.parse_handoff(list(query.items())))
    except KvcargoError as exc:
        _one_line(str(exc))
        return
    _finite_tree({k: v for k, v in data.items() if k != "panel"})


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from kvcargo.web.app import create_app

    with TestClient(create_app(max_requests=200, timeout_s=60, workers=1)) as c:
        yield c


@settings(max_examples=max(1, EXAMPLES // 2), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=st.one_of(bodies.map(lambda b: {"requests": 40, **b}), anything))
def test_simulate_endpoint_answers_finite_json_or_a_4xx_line(client, body: Any) -> None:
    raw = json.dumps(body).encode()  # Python's JSON: NaN and Infinity as bare words, as a careless client sends
    r = client.post("/api/simulate", content=raw, headers={"Content-Type": "application/json"})
    if r.status_code == 200:
        payload = json.loads(r.text)  # strict JSON: the server wrote NaN and infinities as null
        _finite_tree(payload["summary"])
        return
    assert 400 <= r.status_code < 500, r.text[:300]
    error = r.json()
    assert set(error) <= {"error", "field"}
    _one_line(error["error"])


@BOUNDED
@given(query=st.dictionaries(st.sampled_from(["prompt", "model", "link", "kv_compress", "kv_keep", "kv_ratio", "send",
                                              "device", "devices_per_instance"]),
                             st.one_of(numbers.map(str), st.text(max_size=8)), max_size=4))
def test_handoff_endpoint_answers_finite_json_or_a_4xx_line(client, query: dict[str, str]) -> None:
    r = client.get("/api/handoff", params=query)
    if r.status_code == 200:
        _finite_tree({k: v for k, v in r.json().items() if k != "panel"})
        return
    assert r.status_code == 422, r.text[:300]
    _one_line(r.json()["error"])
