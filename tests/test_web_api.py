"""The web API through FastAPI's test client: the CLI's exact numbers, validation, limits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

with warnings.catch_warnings():  # starlette's notice that its test client will move to httpx2
    warnings.filterwarnings("ignore", message=".*httpx2.*")
    from fastapi.testclient import TestClient

from kvcargo import catalog as catalog_mod  # noqa: E402
from kvcargo import simulate  # noqa: E402
from kvcargo.config import SimConfig  # noqa: E402
from kvcargo.report.data import jsonable  # noqa: E402
from kvcargo.report.timeseries import interval_series, latency_samples, link_series, plot_data  # noqa: E402
from kvcargo.web import create_app  # noqa: E402
from kvcargo.web.presets import PRESETS, chapter_text  # noqa: E402
from kvcargo.web.service import result_table  # noqa: E402

STATIC = Path(__file__).resolve().parents[1] / "src" / "kvcargo" / "web" / "static"
PAGE_ONLY = {"layers", "panel"}
"""Keys the calculator response adds to ``kvcargo handoff --json``'s (for the page)."""


def kvcargo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcargo", *args], capture_output=True, text=True, timeout=600)


def flags(params: dict) -> list[str]:
    return [a for k, v in params.items() for a in (f"--{k.replace('_', '-')}", str(v))]


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(max_requests=50_000, timeout_s=120)) as c:
        yield c


# ------------------------------------------------------------------------------- calculator

HANDOFF_CASES = [
    {},
    {"prompt": 4096, "send": "layerwise", "kv_compress": "fp8"},
    {"model": "mistral-7b", "link": "nvlink4", "kv_compress": "freq-keep-k", "kv_keep": 0.25, "device": "a100",
     "devices_per_instance": 2},
    {"model": "llama3-70b", "prompt": 8000, "link": "cpo-optical", "kv_compress": "fp4-block", "devices_per_instance": 4,
     "send": "layerwise"},
    {"prompt": 1, "link": "eth-100g", "kv_compress": "none"},
    {"prompt": 3000, "kv_compress": "ratio", "kv_ratio": 6.5, "send": "layerwise"},
    {"kv_compress": "kivi-2bit", "link": "ib-ndr"},
]


def test_handoff_parameters_are_the_cli_options() -> None:
    """The page's calculator takes ``kvcargo handoff``'s options (both from HandoffConfig), less
    the server's files."""
    from kvcargo.cli import handoff as handoff_cli
    from kvcargo.params import HandoffConfig
    from kvcargo.web.service import handoff_defaults

    cli = {p.name for p in handoff_cli.command.params} - {"all_links", "catalog", "as_json"}
    assert set(handoff_defaults()) == cli
    assert handoff_defaults() == {k: v for k, v in HandoffConfig().model_dump().items() if k != "catalog"}


@pytest.mark.parametrize("params", HANDOFF_CASES)
def test_handoff_equals_cli(client: TestClient, params: dict) -> None:
    r = client.get("/api/handoff", params=params)
    assert r.status_code == 200, r.text
    got = r.json()
    assert {k: v for k, v in got.items() if k not in PAGE_ONLY} == json.loads(kvcargo("handoff", *flags(params),
                                                                                        "--json").stdout)
    text = kvcargo("handoff", *flags(params)).stdout.splitlines()
    assert got["panel"]["title"] == text[0]
    assert got["panel"]["rows"] == [re.split(r"\s{2,}", ln.strip()) for ln in text[1:]]
    assert got["layers"] == catalog_mod.load().model(params.get("model", "llama3-8b")).layers


def test_handoff_chapter_panel(client: TestClient) -> None:
    def values(**params: object) -> dict[str, str]:
        return {label: value for label, value, _ in client.get("/api/handoff", params=params).json()["panel"]["rows"]}

    base = values()
    assert base == {"KV to hand off": "268.4 MB", "On the wire": "268.4 MB", "Transfer": "85.9 ms",
                    "Prefill": "59.0 ms", "Exposed after prefill": "85.9 ms", "Link full at": "11.6 req/s"}
    assert values(send="layerwise")["Exposed after prefill"] == "28.7 ms"
    assert values(send="layerwise", kv_compress="fp8")["Exposed after prefill"] == "1.36 ms"
    assert values(model="llama3-70b", devices_per_instance=2)["KV to hand off"] == "671.1 MB"


@pytest.mark.parametrize("params, message", [
    ({"prompt": "abc"}, "invalid --prompt (got 'abc'): Input should be a valid integer, unable to parse string as an "
                        "integer"),
    ({"prompt": "0"}, "invalid --prompt (got '0'): Input should be greater than or equal to 1"),
    ({"prompt": "2048.5"}, "invalid --prompt (got '2048.5'): Input should be a valid integer, unable to parse string "
                           "as an integer"),
    ({"prompt": str(10**8)}, "invalid --prompt (got '100000000'): Input should be less than or equal to 10000000"),
    ({"send": "sideways"}, "invalid --send (got 'sideways'): Input should be 'whole' or 'layerwise'"),
    ({"model": "gpt-9"}, "invalid --model: unknown model 'gpt-9'; valid choices: "),
    ({"link": "carrier-pigeon"}, "invalid --link: unknown link 'carrier-pigeon'; valid choices: "),
    ({"kv_compress": "zip"}, "invalid --kv-compress: unknown codec 'zip'; valid choices: "),
    ({"device": "tpu"}, "invalid --device: unknown device 'tpu'; valid choices: "),
    ({"kv_compress": "fp8", "kv_keep": "0.5"}, "--kv-keep applies only to freq-keep-k, not 'fp8'"),
    ({"kv_keep": "1.5"}, "invalid --kv-keep (got '1.5'): Input should be less than or equal to 1"),
    ({"devices_per_instance": "0"}, "invalid --devices-per-instance (got '0'): Input should be greater than or equal "
                                    "to 1"),
    ({"model": "llama3-70b"}, "Llama-3-70B does not fit the prefill pool (1x h100, 80 GB): its weights need at least "
                              "2 devices per instance"),
    ({"kv_compress": "ratio", "kv_ratio": "0.5"}, "invalid --kv-ratio (got '0.5'): Input should be greater than or "
                                                  "equal to 1"),
    ({"kv_compress": "fp8", "kv_ratio": "3"}, "--kv-ratio applies only to a 'ratio' codec, not 'fp8'"),
    ({"links": "1"}, "unknown parameter --links"),
])
def test_handoff_validation(client: TestClient, params: dict, message: str) -> None:
    r = client.get("/api/handoff", params=params)
    assert r.status_code == 422
    assert r.json()["error"].startswith(message), r.json()


def test_handoff_repeated_parameter(client: TestClient) -> None:
    r = client.get("/api/handoff?prompt=1&prompt=2")
    assert r.status_code == 422 and r.json() == {"error": "parameter prompt given more than once", "field": "prompt"}


def test_catalog_and_defaults(client: TestClient) -> None:
    d = client.get("/api/catalog").json()
    cat = catalog_mod.load()
    for kind in ("models", "devices", "links", "codecs"):
        assert d[kind] == json.loads(json.dumps({k: e.model_dump() for k, e in getattr(cat, kind).items()}))
    assert json.loads(kvcargo("catalog", "models", "--json").stdout)["llama3-8b"]["layers"] == d["models"]["llama3-8b"][
        "layers"]
    sim = SimConfig().model_dump()
    assert d["defaults"]["simulate"] == {k: v for k, v in sim.items() if k not in ("catalog", "workload_file")}
    assert d["defaults"]["handoff"] == {"model": "llama3-8b", "prompt": 2048, "link": "eth-25g", "kv_compress": None,
                                        "kv_keep": None, "kv_ratio": None, "send": "whole", "device": "h100", "devices_per_instance": 1,
                                        "weight_format": None, "kv_format": None, "compute_format": None,
                                        "speculative": None, "link_channels": None, "kv_compress_at": "transit",
                                        "transit_ops_per_byte": None, "layer_groups": None, "lm_head": "all",
                                        "cost_model": "roofline", "link_model": "line-rate"}
    assert d["defaults"]["rate"] == 8.0
    assert d["limits"]["max_requests"] == 50_000 and d["limits"]["timeout_s"] == 120


# -------------------------------------------------------------------------------- simulator

SIM_CASES = [
    {},
    {"link": "eth-25g", "rate": 14, "kv_compress": "fp8"},
    {"decode_device": "a100", "kv_compress": "fp4-block", "kv_compress_at": "endpoint", "requests": 300, "seed": 7},
    {"mode": "colocated", "rate": 6, "requests": 400},
    {"model": "mistral-7b", "prefill": 2, "decode": 3, "link": "eth-100g", "link_channels": 2, "prompt": 4000,
     "output": 128, "kv_compress": "freq-keep-k", "kv_keep": 0.2},
    {"model": "llama3-8b-hyena-dist", "prefill_device": "optical-fft", "ft_enob": 10, "requests": 200},
    {"model": "llama3-8b-ced", "ced_replay_on": "decode", "ced_replay": 64, "requests": 200},
]


@pytest.mark.parametrize("params", SIM_CASES)
def test_simulate_equals_cli_json(client: TestClient, params: dict) -> None:
    r = client.post("/api/simulate", json=params)
    assert r.status_code == 200, r.text
    got = r.json()
    cli = json.loads(kvcargo("simulate", *flags(params), "--json").stdout)
    assert {"config": got["config"], "summary": got["summary"]} == cli
    assert got["summary"] == jsonable(simulate(**params).summary)
    assert [row["text"] for row in got["table"]] == [row["text"] for row in result_table(simulate(**params).summary)]


def test_simulate_notes_what_it_ignores_or_clips(client: TestClient) -> None:
    """A mean length above the generator's clip or an inert serving flag runs, as the companion's
    does, and the response says what the run did with it (the command line's stderr notes)."""
    plain = client.post("/api/simulate", json={"requests": 100}).json()
    inert = client.post("/api/simulate", json={"requests": 100, "kv_block_size": 64, "think": 2}).json()
    assert plain["notes"] == [] and inert["summary"] == plain["summary"]
    assert inert["notes"] == ["--kv-block-size has no effect without --kv-policy paged",
                              "--think has no effect with one turn per session (--turns 1)"]
    clipped = client.post("/api/simulate", json={"requests": 100, "prompt": 40_000})
    assert clipped.status_code == 200 and clipped.json()["notes"][0].startswith("--prompt 40,000 is above 32,768 tokens")


def test_simulate_table_chapter_scenario(client: TestClient) -> None:
    table = {row["key"]: row["text"] for row in client.post("/api/simulate", json={"link": "eth-25g", "rate": 14})
             .json()["table"]}
    assert table == {
        "ttft_p50": "187.2 ms", "ttft_p99": "626.6 ms", "tpot_p50": "27.8 ms", "tpot_p99": "77.2 ms",
        "handoff_p50": "4,643.7 ms", "handoff_p99": "9,657.8 ms", "link_busy": "94.0%", "slo_attainment": "41.0%",
        "goodput_rps": "5.52 req/s", "j_per_token": "0.268 J", "link_j_per_request": "0.0323 J",
        "completed": "800 of 800",
    }
    colocated = {row["key"]: row["text"] for row in client.post("/api/simulate", json={"mode": "colocated"})
                 .json()["table"]}
    assert colocated["handoff_p99"] == "—" and colocated["link_busy"] == "— (no hand-off)"


@pytest.mark.parametrize("preset", PRESETS, ids=[p["key"] for p in PRESETS])
def test_presets_reproduce_the_chapter(client: TestClient, preset: dict) -> None:
    summary = client.post("/api/simulate", json=preset["params"]).json()["summary"]
    for key, unit, text in preset["chapter"]:
        assert chapter_text(summary[key], unit, text) == text, (preset["key"], key)


def test_presets_cover_the_chapter(client: TestClient) -> None:
    got = client.get("/api/presets").json()
    assert [p["key"] for p in got] == [p["key"] for p in PRESETS]
    params = [p["params"] for p in got]
    assert {p["link"] for p in params if set(p) == {"link", "rate"} and p["rate"] == 8} == {
        "nvlink4", "cpo-optical", "ib-ndr", "eth-100g", "eth-25g"}
    for wanted in ({"link": "eth-25g", "rate": 14}, {"link": "eth-25g", "rate": 14, "kv_compress": "fp8"},
                   {"rate": 8, "decode_device": "a100"}, {"rate": 8, "prefill_device": "a100"},
                   {"rate": 8, "prefill_device": "a100", "prefill": 2}):
        assert wanted in params
    for p in got:
        SimConfig.build(**p["params"])
        assert all(set(c) == {"key", "unit", "text"} for c in p["chapter"])


def test_plot_data_matches_the_summary() -> None:
    r = simulate(link="eth-25g", rate=14)
    s = r.summary
    d = plot_data(r)
    p = d["cdf"]["percentiles"]
    for key in ("ttft", "tpot", "handoff"):
        assert d["cdf"][key][p.index(50.0)] == s[f"{key}_p50"]
        assert d["cdf"][key][p.index(99.0)] == s[f"{key}_p99"]
        assert d["cdf"][key][0] <= d["cdf"][key][-1] == s[f"{key}_max"]
    assert len(latency_samples(r)["ttft"]) == s["steady_requests"]
    link = d["link"]
    assert len(link["t"]) == len(link["busy"]) == len(link["queue"]) == 200
    assert np.mean(link["busy"]) == pytest.approx(s["link_busy"], rel=1e-9)
    assert np.mean(link["queue"]) * s["horizon_s"] == pytest.approx(s["link_mean_wait_s"] * s["transfers"], rel=1e-9)
    assert min(link["queue"]) >= 0 and max(link["busy"]) <= 1 + 1e-9


def test_interval_series_is_exact() -> None:
    got = interval_series(np.array([0.0, 0.5, np.nan]), np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 2.0, 4.0]))
    assert got.tolist() == [1.5, 1.0, 0.0]
    s = link_series(np.array([0.0]), np.array([1.0]), np.array([3.0]), 4.0, channels=2, bins=4)
    assert s["t"] == [0.5, 1.5, 2.5, 3.5] and s["busy"] == [0.0, 0.5, 0.5, 0.0] and s["queue"] == [1.0, 0, 0, 0]


@pytest.mark.parametrize("body, status, message", [
    ({"rate": -1}, 422, "invalid --rate (got -1): Input should be greater than 0"),
    ({"requests": "many"}, 422, "invalid --requests (got 'many'): Input should be a valid integer"),
    ({"requests": 1.5}, 422, "invalid --requests (got 1.5): Input should be a valid integer"),
    ({"rate": True}, 422, "invalid --rate (got True): Input should be a valid number"),
    ({"rate": "9"}, 422, "invalid --rate (got '9'): Input should be a valid number"),
    ({"dvfs": 1}, 422, "invalid --dvfs (got 1): Input should be a valid boolean"),
    ({"requests": 60_000_000}, 422, "invalid --requests (got 60000000): at most 50,000 per run in the web API"),
    ({"model": "x" * 50_000}, 422, "invalid --model: unknown model 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (50,002 chars); valid"),
    ({"requests": 60_000}, 422, "invalid --requests (got 60000): at most 50,000 per run in the web API "
                                "(kvcargo ui --max-requests)"),
    ({"decode": 1000}, 422, "invalid --decode (got 1000): at most 64 in the web API"),
    ({"output": 1e5, "max_length": 200_000}, 422, "invalid --output (got 100000): at most 65,536 in the web API"),
    ({"output": 1e7}, 422, "invalid --output (got 1e+07): at most 65,536 in the web API"),
    ({"link": "carrier-pigeon"}, 422, "invalid --link: unknown link 'carrier-pigeon'; valid choices: cpo-optical, "
                                      "eth-100g"),
    ({"model": "llama3-70b"}, 422, "Llama-3-70B does not fit the prefill pool"),
    ({"mode": "colocated", "kv_compress": "fp8"}, 422, "KV compression needs a hand-off"),
    ({"kv_keep": 0.5}, 422, "--kv-keep applies only to --kv-compress freq-keep-k"),
    ({"kv_compress_at": "cloud"}, 422, "invalid --kv-compress-at (got 'cloud'): Input should be 'transit' or "
                                       "'endpoint'"),
    ({"workload_file": "/etc/passwd"}, 422, "--workload-file names a file on the server: not accepted by the web API"),
    ({"catalog": ["/etc/passwd"]}, 422, "--catalog names a file on the server: not accepted by the web API"),
    ({"bogus": 1}, 422, "unknown parameter --bogus"),
    ({"fft_efficiency": 0.5}, 422, "--fft-efficiency applies only to FFT-mixing models"),
    ({"model": "llama3-8b-ced", "mode": "colocated", "ced_replay_on": "decode"}, 422, "--ced-replay-on decode"),
    ([1, 2], 400, "the body must be a JSON object of simulation parameters"),
])
def test_simulate_validation(client: TestClient, body: object, status: int, message: str) -> None:
    r = client.post("/api/simulate", json=body)
    assert r.status_code == status
    assert r.json()["error"].startswith(message), r.json()


def test_simulate_malformed_and_oversized_bodies(client: TestClient) -> None:
    r = client.post("/api/simulate", content=b'{"rate": ', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("the body is not valid JSON")
    r = client.post("/api/simulate", content=b"{" + b" " * 70_000 + b"}", headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json() == {"error": "the body is larger than 64 KiB"}
    empty = client.post("/api/simulate", headers={"Content-Type": "application/json"})
    assert empty.json()["summary"]["ttft_p99"] == 0.3536255769527793  # empty body: defaults


def test_timeout_stops_the_run_and_the_next_one_works() -> None:
    with TestClient(create_app(max_requests=5_000_000, timeout_s=1.0, workers=1)) as c:
        pool = c.app.state.pool
        c.post("/api/simulate", json={"requests": 10})  # the worker is up
        spares = {f.result() for f in pool._ready.queue}  # started and kept ready, not running this run
        (before,) = [w.process for w in pool._live - spares]
        t0 = time.perf_counter()
        r = c.post("/api/simulate", json={"requests": 3_000_000})
        assert r.status_code == 504, r.text
        assert r.json()["error"] == ("the run took longer than 1 s and was stopped (kvcargo ui --timeout); "
                                     "try fewer requests")
        assert time.perf_counter() - t0 < 10
        before.join(5)
        assert not before.is_alive()  # really stopped, not left running
        r = c.post("/api/simulate", json={"link": "eth-25g"})
        assert r.status_code == 200 and r.json()["summary"]["tpot_p99"] == simulate(link="eth-25g").summary["tpot_p99"]


def test_page_static_and_headers(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert '<script src="/vendor/plotly.min.js"' in r.text and '<script src="/static/app.js"' in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    js = client.get("/vendor/plotly.min.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert "plotly.js" in js.text[:300]
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    assert client.get("/api/docs").status_code == 404  # FastAPI's docs page would load a CDN
    assert client.get("/api/openapi.json").json()["paths"].keys() >= {"/api/handoff", "/api/simulate",
                                                                       "/api/catalog", "/api/presets"}


def test_static_files_reference_nothing_outside() -> None:
    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.findall(r"(?:https?:)?//(?!www\.w3\.org/2000/svg)[a-z0-9.-]+\.[a-z]{2,}", text), path.name


def test_host_header_checked_when_asked() -> None:
    c = TestClient(create_app(allowed_hosts=["127.0.0.1", "localhost", "[::1]"]), base_url="http://127.0.0.1")
    assert c.get("/api/presets").status_code == 200
    assert c.get("/api/presets", headers={"Host": "[::1]:8000"}).status_code == 200
    r = c.get("/api/presets", headers={"Host": "attacker.example"})
    assert r.status_code == 400
    assert r.json() == {"error": "invalid Host header 'attacker.example': this server answers only 127.0.0.1, "
                                 "[::1], localhost"}


def test_cross_site_and_non_json_posts_are_refused(client: TestClient) -> None:
    """A page on another site can POST text/plain without a preflight: it must not start a run."""
    r = client.post("/api/simulate", content=b'{"requests": 5}',
                    headers={"Content-Type": "text/plain", "Origin": "http://testserver"})
    assert r.status_code == 415 and r.json()["error"].startswith("send the parameters as JSON")
    r = client.post("/api/simulate", json={"requests": 5}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert r.json() == {"error": "cross-site request refused (Origin 'http://evil.example' is not this page's)"}
    ok = client.post("/api/simulate", json={"requests": 5}, headers={"Origin": "http://testserver"})
    assert ok.status_code == 200 and ok.json()["summary"]["requests"] == 5


def test_invalid_parameter_errors_name_the_field(client: TestClient) -> None:
    r = client.post("/api/simulate", json={"tpot_slo": -1})
    assert r.status_code == 422 and r.json()["field"] == "tpot_slo"


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"model": "llama3-70b"}, "devices_per_instance", "does not fit the prefill pool"),
    ({"model": "llama3-70b", "mode": "colocated"}, "devices_per_instance", "does not fit the colocated pool"),
    ({"model": "llama3-70b", "prefill_devices_per_instance": 2, "decode_devices_per_instance": 1},
     "decode_devices_per_instance", "does not fit the decode pool"),
    ({"model": "llama3-70b", "tp": 1}, "devices_per_instance", "prefill pool: Llama-3-70B does not fit"),
    ({"tp": 3}, "devices_per_instance", "parallel tp=3 x pp=1 needs 3 devices per instance"),
    ({"decode_tp": 2, "decode_pp": 3, "decode_devices_per_instance": 6}, "decode_pp", "not divisible into 3"),
    ({"tp": 2, "ep": 2, "devices_per_instance": 2}, "ep", "expert parallelism needs a mixture-of-experts"),
    ({"speculative": "mistral-7b"}, "speculative", "32000-token vocabulary"),
    ({"weight_format": "fp8", "compute_format": "fp8", "device": "a100"}, "compute_format", "no fp8 units"),
    ({"batch_policy": "chunked", "model": "gemma2-9b"}, "model", "modelled for full-attention models"),
    ({"cost_model": "calibrated", "device": "optical"}, "device", "measured kernel tables"),
])
def test_errors_without_a_flag_name_the_parameter_to_change(client: TestClient, body: dict, field: str,
                                                            says: str) -> None:
    """The page marks ``field``: the parameter a user should change, where the message names none."""
    r = client.post("/api/simulate", json=body)
    assert r.status_code == 422 and says in r.json()["error"] and r.json()["field"] == field, r.json()
