"""The planner's core: Appendix B ceilings, the bisection, grids, sweeps (rows, failures, resume)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from kvcargo import SimConfig, simulate
from kvcargo.errors import KvcargoError
from kvcargo.planner import grid as grid_mod
from kvcargo.planner.backends import InlineBackend, TaskError, chunks, run_chunk
from kvcargo.planner.capacity import capacity, ceilings, search
from kvcargo.planner.sweep import read_csv, run_sweep

CLI_DEFAULTS_70B = SimConfig(model="llama3-70b", devices_per_instance=4)



def same_rows(a: list[dict], b: list[dict]) -> bool:
    """Equal rows, NaN equal to NaN."""
    def norm(r: dict) -> dict:
        return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}

    return [norm(r) for r in a] == [norm(r) for r in b]

# ------------------------------------------------------------------ Appendix B ceilings


def test_ceilings_reproduce_appendix_b_bit_for_bit() -> None:
    c = ceilings(CLI_DEFAULTS_70B)
    assert c.prefill == 7.491102470233705
    assert c.decode == 28.843033693365935
    assert c.link == 74.45033614624572
    assert c.decode_batch == 194
    assert c.prefill_batch == 4 and c.decode_context == 2176
    assert c.bound == c.prefill and c.bound_by == "prefill"
    # colocated: the same two instances doing both, N / (1/prefill + 1/decode)
    assert c.colocated == 2 / (1 / c.prefill + 1 / c.decode)
    # §8.6, section 8 (rounded): prefill 7.49, decode 28.8, KV link 74.5
    assert (round(c.prefill, 2), round(c.decode, 1), round(c.link, 1)) == (7.49, 28.8, 74.5)


def test_ceilings_scale_with_instances_channels_and_compression() -> None:
    one = ceilings(SimConfig())
    two = ceilings(SimConfig(prefill=2, decode=3, link_channels=2))
    assert two.prefill == 2 * one.prefill and two.decode == 3 * one.decode
    assert two.link == 2 * one.link
    assert two.prefill_per_instance == one.prefill_per_instance
    fp8 = ceilings(SimConfig(kv_compress="fp8", link="eth-25g"))
    plain = ceilings(SimConfig(link="eth-25g"))
    assert fp8.link > 1.9 * plain.link  # half the bytes on the wire (plus 1 µs of stage latency)
    # the calculator's "link full at" for 25 GbE, 2048 tokens: 11.6 req/s
    assert round(plain.link, 1) == 11.6 and plain.bound_by == "link"


def test_ceilings_colocated_mode() -> None:
    c = ceilings(SimConfig(mode="colocated", instances=3))
    assert c.mode == "colocated" and c.bound_by == "colocated" and math.isinf(c.link)
    assert c.bound == c.colocated == 3 / (1 / c.prefill_per_instance + 1 / c.decode_per_instance)


def test_ceilings_model_that_does_not_fit_is_an_error() -> None:
    with pytest.raises(KvcargoError, match="does not fit"):
        ceilings(SimConfig(model="llama3-70b"))


# ------------------------------------------------------------------------ the search


def test_bisection_finds_5_97_in_7_simulations() -> None:
    s = search(CLI_DEFAULTS_70B)
    assert s.simulations == 7
    assert round(s.rate, 2) == 5.97
    rates = [p["rate"] for p in s.probes]
    assert rates[0] == 7.491102470233705 and not s.probes[0]["ok"]  # starts at the ceiling, which fails
    assert rates[1] == rates[0] / 2 and s.probes[1]["ok"]  # then bisects from [0, ceiling]
    assert s.hi - s.lo <= 0.02 * s.hi and s.rate == s.lo
    # every probe is exactly a simulation at that rate
    last = simulate(CLI_DEFAULTS_70B, rate=s.rate).summary
    assert last["slo_attainment"] == s.probes[-1]["slo_attainment"] >= 0.9
    # §8.6 section 4: 89.9% at 6 req/s (just under the target)
    assert round(simulate(CLI_DEFAULTS_70B, rate=6.0).summary["slo_attainment"], 3) == 0.899


def test_bracket_grows_when_the_ceiling_is_sustained() -> None:
    s = search(SimConfig(ttft_slo=5.0, tpot_slo=1.0), start=4.0)
    rates = [p["rate"] for p in s.probes]
    assert rates[:3] == [4.0, 6.0, 9.0] and all(p["ok"] for p in s.probes[:3])
    assert s.rate > 9.0 and s.hi - s.lo <= 0.02 * s.hi


def test_search_target_and_tolerance_are_configurable() -> None:
    loose = search(CLI_DEFAULTS_70B, target=0.5, rtol=0.1)
    assert loose.rate > 5.97 and loose.hi - loose.lo <= 0.1 * loose.hi
    assert all(p["ok"] == (p["slo_attainment"] >= 0.5) for p in loose.probes)
    with pytest.raises(KvcargoError, match="--target"):
        search(SimConfig(), target=1.5)
    with pytest.raises(KvcargoError, match="--rtol"):
        search(SimConfig(), rtol=0)


def test_search_without_any_sustainable_rate_ends_at_zero() -> None:
    s = search(SimConfig(ttft_slo=0.01))  # no prefill step is that fast
    assert s.rate == 0.0 and not s.feasible and s.simulations < 20


def test_capacity_search_of_the_8_1_configuration() -> None:
    """Its speed (the target is ≤ 1 s) is measured by benchmarks/bench.py, not asserted here."""
    s = search(SimConfig())
    assert s.simulations == 7 and round(s.rate, 2) == 16.25


def test_capacity_data_is_what_json_prints() -> None:
    d = capacity(CLI_DEFAULTS_70B)
    assert d["ceilings"]["decode_batch"] == 194
    assert d["search"]["simulations"] == 7 and d["search"]["steady"]
    assert d["config"]["model"] == "llama3-70b"


# ---------------------------------------------------------------------------- grids


def test_parse_vary_types_ranges_and_defaults() -> None:
    assert grid_mod.parse_vary("rate=8,10,12") == ("rate", [8.0, 10.0, 12.0])
    assert grid_mod.parse_vary("rate=8:14:2") == ("rate", [8.0, 10.0, 12.0, 14.0])
    assert grid_mod.parse_vary("prompt-cv=0:0.3:0.1")[1] == [0.0, 0.1, 0.2, 0.3]
    assert grid_mod.parse_vary("--kv-compress=default,fp8") == ("kv_compress", [None, "fp8"])
    assert grid_mod.parse_vary("decode=1,2") == ("decode", [1, 2])
    assert grid_mod.parse_vary("dvfs=false,true") == ("dvfs", [False, True])


@pytest.mark.parametrize("spec, message", [
    ("rat=1,2", "unknown parameter 'rat' in --vary; did you mean rate"),
    ("bogus=1", "unknown parameter 'bogus'"),
    ("rate=", "empty value"),
    ("rate=8,,10", "empty value"),
    ("rate", "use NAME=V1,V2"),
    ("rate=abc", "invalid value 'abc' for rate"),
    ("rate=-1", "greater than 0"),
    ("decode=0", "greater than or equal to 1"),
    ("mode=both", "invalid value 'both' for mode"),
    ("rate=9:2", "bad range"),
    ("catalog=x.toml", "cannot be varied"),
])
def test_parse_vary_errors(spec: str, message: str) -> None:
    with pytest.raises(KvcargoError, match=message):
        grid_mod.parse_vary(spec)


def test_grid_product_order_and_errors() -> None:
    g = grid_mod.build({"requests": 100}, ["rate=8,10", "link=ib-ndr,eth-25g,nvlink4"])
    pts = g.points()
    assert len(g) == len(pts) == 6
    assert [(p["rate"], p["link"]) for p in pts[:4]] == [(8.0, "ib-ndr"), (8.0, "eth-25g"), (8.0, "nvlink4"),
                                                          (10.0, "ib-ndr")]
    assert all(p["requests"] == 100 and p["model"] == "llama3-8b" for p in pts)
    assert len({grid_mod.point_key(p) for p in pts}) == 6
    with pytest.raises(KvcargoError, match="empty grid"):
        grid_mod.build({"rate": 8.0}, [])
    with pytest.raises(KvcargoError, match="both fixed and varied"):
        grid_mod.build({"rate": 8.0}, ["rate=8,10"])
    with pytest.raises(KvcargoError, match="varied twice"):
        grid_mod.build({}, ["rate=8", "rate=10"])
    with pytest.raises(KvcargoError, match="twice"):
        grid_mod.build({}, ["rate=8,8"])


def test_point_key_is_stable_and_covers_every_field() -> None:
    a = grid_mod.config_values({"rate": 8.0})
    assert grid_mod.point_key(a) == grid_mod.point_key(dict(a))
    assert grid_mod.point_key(a) != grid_mod.point_key({**a, "seed": 2})
    # only values that differ from the defaults count: a default spelled out is the same run,
    # and a field added later (with a default) leaves existing keys alone
    assert grid_mod.point_key({"rate": 8.0}) == grid_mod.point_key({"rate": 8.0, "seed": 1, "model": "llama3-8b"})
    assert grid_mod.point_key({"rate": 8.0, "no_such_field": 1}) == grid_mod.point_key({"rate": 8.0})


def test_sweep_file(tmp_path: Path) -> None:
    f = tmp_path / "sweep.toml"
    f.write_text('[base]\nrequests = 100\nlink-channels = 2\n[vary]\nrate = [8, 12]\nkv-compress = ["none", "fp8"]\n')
    g = grid_mod.build({"seed": 3}, ["decode=1,2"], f)
    assert g.varied == ["rate", "kv_compress", "decode"] and len(g) == 8
    assert g.base == {"requests": 100, "link_channels": 2, "seed": 3}
    with pytest.raises(KvcargoError, match="not found"):
        grid_mod.build(file=tmp_path / "missing.toml")


@pytest.mark.parametrize("text, match", [
    ("[vary]\nrat = [1]\n", "unknown parameter 'rat' in sweep file bad.toml"),
    ("[varies]\nrate = [1]\n", "unknown table"),
    ("[vary]\nrate = []\n", "empty grid"),
    ("[vary\n", "bad.toml"),  # not TOML: the error names the file
])
def test_bad_sweep_file_is_named(tmp_path: Path, text: str, match: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(KvcargoError, match=match):
        grid_mod.build(file=bad)


# ----------------------------------------------------------------------------- sweeps


def small_grid(*extra: str) -> grid_mod.Grid:
    return grid_mod.build({"requests": 200}, ["rate=8,12", "link=ib-ndr,eth-25g", *extra])


def test_sweep_rows_are_the_simulations_in_grid_order() -> None:
    res = run_sweep(small_grid())
    assert res.ran == 4 and res.failed == 0 and len(res.rows) == 4
    for row, point in zip(res.rows, small_grid().points()):
        s = simulate(SimConfig(**point)).summary
        assert row["status"] == "ok" and row["error"] == ""
        assert (row["rate"], row["link"]) == (point["rate"], point["link"])
        assert row["ttft_p99"] == s["ttft_p99"] and row["link_busy"] == s["link_busy"]
        assert row["sim_requests"] == s["requests"]  # renamed: 'requests' is a config field
        assert "instances" not in row or not isinstance(row["instances"], list)
        assert all(isinstance(v, (int, float, str, bool, type(None))) for v in row.values())


def test_failed_runs_are_recorded_and_the_sweep_goes_on() -> None:
    g = grid_mod.build({"requests": 200}, ["mode=disagg,colocated", "kv-compress=default,fp8",
                                           "model=llama3-8b,llama3-70b"])
    res = run_sweep(g)
    assert len(res.rows) == 8
    bad = [r for r in res.rows if r["status"] == "error"]
    # colocated + a codec is invalid; Llama-3-70B does not fit one H100
    assert len(bad) == 5 and res.failed == 5
    assert any("KV compression needs a hand-off" in r["error"] for r in bad)
    assert any("does not fit" in r["error"] for r in bad)
    assert all(r.get("ttft_p99") is None for r in bad)
    good = [r for r in res.rows if r["status"] == "ok"]
    assert len(good) == 3 and all(r["model"] == "llama3-8b" for r in good)


def boom(point: dict) -> dict:
    if point["rate"] == 12.0:
        raise RuntimeError("worker exploded")
    from kvcargo.planner.sweep import run_point

    return run_point(point)


def test_an_exception_in_a_run_becomes_an_error_row() -> None:
    res = run_sweep(small_grid(), fn=boom)
    errs = [r for r in res.rows if r["status"] == "error"]
    assert [r["rate"] for r in errs] == [12.0, 12.0]
    assert errs[0]["error"].startswith("RuntimeError: worker exploded")
    assert run_chunk(boom, [{"rate": 12.0}])[0] == TaskError(
        run_chunk(boom, [{"rate": 12.0}])[0].message, "RuntimeError")


def test_resume_skips_finished_rows(tmp_path: Path) -> None:
    out = tmp_path / "sweep.csv"
    first = run_sweep(small_grid(), out=out)
    assert first.ran == 4 and out.exists() and out.with_suffix(".parquet").exists()
    text = out.read_text()
    again = run_sweep(small_grid(), out=out)
    assert again.ran == 0 and again.skipped == 4 and out.read_text() == text
    assert same_rows(again.rows, read_csv(out))
    # drop one row: only that run happens again, and the file comes back identical
    with open(out, newline="") as fh:
        rows = list(csv.reader(fh))
    with open(out, "w", newline="") as fh:
        csv.writer(fh).writerows(rows[:2] + rows[3:])
    third = run_sweep(small_grid(), out=out)
    assert third.ran == 1 and third.skipped == 3 and out.read_text() == text
    # a bigger grid reuses the rows it shares
    bigger = run_sweep(small_grid("seed=1,2"), out=out)
    assert bigger.ran == 4 and bigger.skipped == 4 and len(bigger.rows) == 8
    # --fresh runs everything again
    assert run_sweep(small_grid(), out=out, resume=False).ran == 4


def test_resume_keeps_rows_of_other_grids_and_retries_failures_on_request(tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    run_sweep(grid_mod.build({"requests": 200}, ["rate=5,6"]), out=out)
    g = grid_mod.build({"requests": 200}, ["mode=disagg,colocated", "kv-compress=default,fp8"])
    res = run_sweep(g, out=out)
    assert res.kept == 2 and len(res.rows) == 6 and len(res.grid_rows) == 4 and res.failed == 1
    assert run_sweep(g, out=out).ran == 0
    retry = run_sweep(g, out=out, retry_failed=True)
    assert retry.ran == 1 and retry.failed == 1


def test_parquet_holds_the_same_rows(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    g = grid_mod.build({"requests": 200}, ["mode=disagg,colocated", "kv-compress=default,fp8"])
    res = run_sweep(g, out=tmp_path / "p.parquet")
    assert res.csv_path == tmp_path / "p.csv" and res.parquet_path == tmp_path / "p.parquet"
    table = pq.read_table(res.parquet_path).to_pylist()
    assert [r["key"] for r in table] == [r["key"] for r in res.rows]
    assert [r["ttft_p99"] for r in table] == [r.get("ttft_p99") for r in res.rows]
    assert [r["error"] for r in table] == [r["error"] for r in res.rows]


def test_csv_cells_come_back_with_their_types(tmp_path: Path) -> None:
    res = run_sweep(small_grid(), out=tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text()
    # keys that look like numbers stay text (a regression: '0012e45...' once came back as a float)
    odd = {res.rows[0]["key"]: "0012e45678901234", res.rows[1]["key"]: "1234567890123456"}
    for old, new in odd.items():
        text = text.replace(old, new)
    (tmp_path / "t.csv").write_text(text)
    rows = read_csv(tmp_path / "t.csv")
    assert [r["key"] for r in rows[:2]] == list(odd.values())
    assert rows[0]["rate"] == 8.0 and rows[0]["link"] == "ib-ndr" and rows[0]["prefill"] == 1
    assert rows[0]["dvfs"] is False and rows[0]["kv_compress"] is None and rows[0]["model"] == "llama3-8b"
    assert rows[0]["ttft_p99"] == res.rows[0]["ttft_p99"]  # floats round-trip exactly (repr)
    assert same_rows(rows[2:], res.rows[2:])


def test_not_a_sweep_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(KvcargoError, match="not a kvcargo sweep file"):
        run_sweep(small_grid(), out=out)


def test_chunks_cover_every_item_once() -> None:
    for n, w in [(0, 4), (1, 4), (7, 2), (1000, 16), (5, 1)]:
        parts = chunks(n, w)
        assert [i for r in parts for i in r] == list(range(n))
    assert list(InlineBackend().map(len, ["ab", "c"])) == [(0, 2), (1, 1)]
