"""Trace replay: readers detected by content, one-line errors with line numbers, transforms,
trace statistics, and the ``simulate`` / ``trace-stats`` faces.

Runs on the excerpts committed under ``tests/data/traces`` (the first 500 requests of each trace);
the published statistics of the full traces are checked in ``test_traces_published.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvcargo.config import SimConfig, load_workload
from kvcargo.errors import KvcargoError
from kvcargo.workload import LengthDist, generate
from kvcargo.workload.stats import timeline, trace_stats
from kvcargo.workload.traces import detect, mean_rate, parse_window, read_trace, transform

DATA = Path(__file__).resolve().parent / "data" / "traces"
MOONCAKE_CONV = DATA / "mooncake_conversation.jsonl"
MOONCAKE_SYN = DATA / "mooncake_synthetic.jsonl"
AZURE_CODE = DATA / "azure2023_code.csv"
AZURE_CONV = DATA / "azure2023_conv.csv"


def kvcargo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcargo", *args], capture_output=True, text=True, timeout=600)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def error_of(path: Path, **kw) -> str:
    with pytest.raises(KvcargoError) as exc:
        read_trace(path, **kw)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- the real traces


@pytest.mark.parametrize(("path", "fmt"), [
    (MOONCAKE_CONV, "Mooncake JSONL"), (MOONCAKE_SYN, "Mooncake JSONL"),
    (AZURE_CODE, "Azure 2023 CSV"), (AZURE_CONV, "Azure 2023 CSV"),
])
def test_detects_the_real_formats_by_content(path: Path, fmt: str, tmp_path: Path) -> None:
    assert detect(path) == fmt
    renamed = write(tmp_path, "trace.txt", path.read_text(encoding="utf-8"))  # the name plays no part
    assert detect(renamed) == fmt


def test_mooncake_conversation_excerpt() -> None:
    w = read_trace(MOONCAKE_CONV)
    assert len(w) == 500
    assert w.prompt[:3].tolist() == [6758, 7322, 7236] and w.output[:3].tolist() == [500, 490, 794]
    assert (w.total_prompt_tokens, w.total_output_tokens) == (7_124_855, 180_942)
    assert w.arrival[-1] == 165.0 and w.arrival[0] == 0.0  # timestamps in ms → s
    assert w.source == "Mooncake JSONL mooncake_conversation.jsonl"


def test_mooncake_keeps_hash_ids_as_flat_array_with_offsets() -> None:
    w = read_trace(MOONCAKE_CONV)
    assert w.block_offsets.shape == (501,) and w.block_offsets[0] == 0
    assert w.block_offsets[-1] == len(w.block_ids) == 14_162
    assert w.block_ids[w.block_offsets[0]:w.block_offsets[1]].tolist() == list(range(14))
    assert w.block_ids[w.block_offsets[1]:w.block_offsets[2]].tolist() == [0, *range(14, 28)]
    # one id per 512-token block
    assert np.array_equal(np.diff(w.block_offsets), -(-w.prompt // 512))


def test_mooncake_times_are_exactly_ms_over_1000() -> None:
    w = read_trace(MOONCAKE_SYN)
    raw = [json.loads(line)["timestamp"] for line in MOONCAKE_SYN.read_text().splitlines()]
    assert w.arrival.tolist() == [t / 1000 for t in raw]
    assert w.arrival[-1] == 139.272
    assert (w.total_prompt_tokens, w.total_output_tokens) == (6_403_130, 97_659)


def test_azure_wall_clock_times_become_seconds_since_the_first() -> None:
    w = read_trace(AZURE_CODE)
    assert len(w) == 500
    # 18:17:03.9799600, 18:17:04.0319600, 18:17:04.0781490 (100 ns resolution, exact)
    assert w.arrival[:3].tolist() == [0.0, 0.052, 0.098189]
    assert w.arrival[-1] == 232.801087
    assert w.prompt[:3].tolist() == [4808, 3180, 110] and w.output[:3].tolist() == [10, 8, 27]
    assert w.block_ids is None
    conv = read_trace(AZURE_CONV)
    assert conv.arrival[1] == 4.314579
    assert (conv.total_prompt_tokens, conv.total_output_tokens) == (467_684, 132_536)


# ------------------------------------------------------------------------ kvcargo's formats


def test_kvcargo_csv_keeps_times_and_ignores_rid_and_extra_columns(tmp_path: Path) -> None:
    p = write(tmp_path, "w.csv", "rid,arrival,prompt_len,output_len,note\n0,0.25,100,10,a\n1,1.5,200,20,b\n")
    w = read_trace(p)
    assert w.arrival.tolist() == [0.25, 1.5]  # not re-based: kvcargo's own time line
    assert w.prompt.tolist() == [100, 200] and w.output.tolist() == [10, 20]
    assert detect(p) == "kvcargo CSV"


def test_requests_csv_of_a_run_replays_the_same_stream(tmp_path: Path) -> None:
    from kvcargo import simulate

    r = simulate(requests=60, rate=14)
    r.write_requests_csv(tmp_path / "r.csv")
    w = read_trace(tmp_path / "r.csv")
    g = generate(60, 14, LengthDist(2048, 0.5), LengthDist(256, 0.5), seed=1)
    assert w.arrival.tolist() == g.arrival.tolist()  # bit for bit (floats written as repr)
    assert np.array_equal(w.prompt, g.prompt) and np.array_equal(w.output, g.output)
    again = simulate(workload_file=str(tmp_path / "r.csv"))  # as recorded (a --rate would rescale it)
    assert again.summary["tpot_p99"] == r.summary["tpot_p99"]


def test_json_rows_with_optional_fourth_element(tmp_path: Path) -> None:
    p = write(tmp_path, "w.json", "[\n  [0.5, 100, 10],\n  [0.75, 200, 20, 3]\n]\n")
    w = read_trace(p)
    assert w.arrival.tolist() == [0.5, 0.75] and w.prompt.tolist() == [100, 200]
    assert detect(p) == "JSON rows"


def test_json_rows_of_the_generator_are_bit_exact(tmp_path: Path) -> None:
    g = generate(200, 8, LengthDist(2048, 0.5), LengthDist(256, 0.5), seed=1)
    rows = [[float(a), int(p), int(o)] for a, p, o in zip(g.arrival, g.prompt, g.output)]
    p = write(tmp_path, "g.json", json.dumps(rows))
    w = read_trace(p)
    assert w.arrival.tolist() == g.arrival.tolist() and w.arrival[0] == 0.01803638301368865


def test_requests_sorted_by_arrival_stably(tmp_path: Path) -> None:
    p = write(tmp_path, "w.csv", "arrival,prompt_len,output_len\n2,1,1\n1,2,2\n1,3,3\n0,4,4\n")
    w = read_trace(p)
    assert w.arrival.tolist() == [0, 1, 1, 2] and w.prompt.tolist() == [4, 2, 3, 1]


def test_unsorted_mooncake_reorders_hash_ids_with_their_requests(tmp_path: Path) -> None:
    rows = [{"timestamp": 30, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]},
            {"timestamp": 10, "input_length": 100, "output_length": 2, "hash_ids": [1]},
            {"timestamp": 20, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]}]
    p = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    w = read_trace(p)
    assert w.arrival.tolist() == [0.0, 0.01, 0.02]  # re-based to the first request
    assert w.output.tolist() == [2, 3, 1]
    assert w.block_offsets.tolist() == [0, 1, 4, 6] and w.block_ids.tolist() == [1, 1, 2, 3, 7, 8]


# --------------------------------------------------------------------- generic column mapping


def test_generic_csv_with_column_mapping_and_time_unit(tmp_path: Path) -> None:
    p = write(tmp_path, "g.csv", "t_ms,in,out\n1500,10,1\n1000,20,2\n")
    with pytest.raises(KvcargoError, match="line 1: unrecognised trace header 't_ms,in,out'.*--arrival-col"):
        read_trace(p)
    w = read_trace(p, arrival_col="t_ms", prompt_col="in", output_col="out", time_unit="ms")
    assert w.arrival.tolist() == [0.0, 0.5] and w.prompt.tolist() == [20, 10]
    assert detect(p) == "generic CSV"


def test_generic_jsonl_and_json_objects(tmp_path: Path) -> None:
    p = write(tmp_path, "g.jsonl", '{"t": 3.0, "p": 5, "o": 6}\n\n{"t": 4.5, "p": 7, "o": 8}\n')
    w = read_trace(p, arrival_col="t", prompt_col="p", output_col="o")
    assert w.arrival.tolist() == [0.0, 1.5] and w.output.tolist() == [6, 8]
    q = write(tmp_path, "g.json", '[{"t": 3.0, "p": 5, "o": 6}, {"t": 4.5, "p": 7, "o": 8}]')
    assert read_trace(q, arrival_col="t", prompt_col="p", output_col="o").arrival.tolist() == [0.0, 1.5]
    assert "line 1: no arrival column 'arrival'" in error_of(p)


def test_generic_csv_with_wall_clock_times(tmp_path: Path) -> None:
    p = write(tmp_path, "g.csv", "when,in,out\n2024-05-01T10:00:00.5Z,10,1\n2024-05-01T10:00:02Z,20,2\n")
    w = read_trace(p, arrival_col="when", prompt_col="in", output_col="out")
    assert w.arrival.tolist() == [0.0, 1.5]
    assert "--time-unit applies to numeric arrival times" in error_of(
        p, arrival_col="when", prompt_col="in", output_col="out", time_unit="ms")


def test_mapping_overrides_a_detected_format(tmp_path: Path) -> None:
    p = write(tmp_path, "w.json", "[[100, 0.5, 10], [200, 0.25, 20]]")
    w = read_trace(p, arrival_col="1", prompt_col="0", time_unit="s")
    assert w.arrival.tolist() == [0.25, 0.5] and w.prompt.tolist() == [200, 100]
    assert "give positions" in error_of(p, arrival_col="when")
    m = read_trace(MOONCAKE_CONV, time_unit="s")  # the same file with timestamps read as seconds
    assert m.arrival[-1] == 165_000.0 and m.block_ids is not None


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(("name", "text", "message"), [
    ("e.csv", "", "empty file"),
    ("e.csv", "  \n\n", "empty file"),
    ("e.json", "[]", "empty JSON array"),
    ("h.csv", "arrival,prompt_len,output_len\n", "no requests (a header but no rows)"),
    ("h.csv", "arrival,prompt_len,output_len\n0,1,1\n0.5,2\n", "line 3: 2 fields, the header has 3"),
    ("b.csv", "arrival,prompt_len,output_len\n0,1,1\n\n0.5,x,2\n", "line 4: prompt length must be a whole number"),
    ("b.csv", "arrival,prompt_len,output_len\n0,1,1\n0.5,2.5,2\n", "line 3: prompt length must be a whole number"),
    ("b.csv", "arrival,prompt_len,output_len\n0,1,0\n", "line 2: output length must be a whole number of tokens >= 1"),
    ("b.csv", "arrival,prompt_len,output_len\nsoon,1,1\n", "line 2: arrival must be a number (s), got 'soon'"),
    ("b.csv", "arrival,prompt_len,output_len\n-1,1,1\n", "line 2: arrival must be >= 0 seconds"),
    ("b.csv", "arrival,prompt_len,output_len\nnan,1,1\n", "line 2: arrival must be a number"),
    ("b.json", '[\n [0, 1, 1],\n [0.5, 2]\n]', "line 3: expected [arrival, prompt, output]"),
    ("b.json", '[\n [0, 1, 1],\n 7\n]', "line 3: expected a row [arrival, prompt, output], got 7"),
    ("b.json", '[\n [0, 1, 1],\n [0.5, 2, 2\n', "line 4: not valid JSON"),
    ("b.json", '[[0, 1, 1]] x', "extra data after the array"),
    ("b.json", '[[0, 1, true]]', "line 1: output length must be a whole number of tokens >= 1, got true"),
    ("b.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length"\n',
     "line 2: not valid JSON"),
    ("b.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n[1, 2, 3]\n',
     "line 2: expected a JSON object per line"),
    ("b.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n',
     "line 2: hash_ids must be a list of whole numbers"),
    ("b.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                '{"timestamp": 1, "output_length": 1}\n', "line 2: no prompt column 'input_length'"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,1\n"
              "yesterday,10,1\n", "line 3: arrival 'yesterday' is not a timestamp"),
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,1\n"
              "2023-11-16 18:17:04,0,1\n", "line 3: prompt length must be a whole number"),
    ("u.csv", "x,y\n1,2\n", "line 1: unrecognised trace header 'x,y'"),
])
def test_malformed_files_are_one_line_with_the_line_number(tmp_path: Path, name: str, text: str,
                                                           message: str) -> None:
    p = write(tmp_path, name, text)
    msg = error_of(p)
    assert msg.startswith(str(p) + ": ") and message in msg, msg


def test_unreadable_files(tmp_path: Path) -> None:
    assert "cannot read" in error_of(tmp_path / "missing.csv")
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"arrival,prompt_len,output_len\n0,1,1\n0,1,\xe9\n")
    assert error_of(bad).endswith("line 3: not UTF-8 text")


def test_a_bom_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffarrival,prompt_len,output_len\n0,1,1\n".encode())
    assert len(read_trace(p)) == 1


# -------------------------------------------------------------------------------- transforms


def test_window_keeps_start_inclusive_end_exclusive_and_restarts_the_clock() -> None:
    w = read_trace(AZURE_CODE)
    t = transform(w, window="30:190")
    keep = (w.arrival >= 30) & (w.arrival < 190)
    assert len(t) == keep.sum() > 0 and np.array_equal(t.prompt, w.prompt[keep])
    assert np.array_equal(t.arrival, w.arrival[keep] - 30)
    assert t.source.endswith("(window 30:190)")
    assert len(transform(w, window="200:")) == (w.arrival >= 200).sum()
    assert len(transform(w, window=":10")) == (w.arrival < 10).sum()


def test_limit_and_window_carry_block_ids() -> None:
    w = read_trace(MOONCAKE_CONV)
    t = transform(w, window="10:20", limit=5)
    idx = np.flatnonzero((w.arrival >= 10) & (w.arrival < 20))[:5]
    assert len(t) == 5 and np.array_equal(t.prompt, w.prompt[idx])
    for k, i in enumerate(idx):
        assert np.array_equal(t.block_ids[t.block_offsets[k]:t.block_offsets[k + 1]],
                              w.block_ids[w.block_offsets[i]:w.block_offsets[i + 1]])


def test_time_scale_multiplies_arrival_times() -> None:
    w = read_trace(AZURE_CONV)
    t = transform(w, time_scale=0.5)
    assert np.array_equal(t.arrival, w.arrival * 0.5) and np.array_equal(t.prompt, w.prompt)


def test_rate_rescales_to_the_mean_rate_and_keeps_burstiness() -> None:
    w = read_trace(AZURE_CODE)
    t = transform(w, rate=10.0)
    assert mean_rate(t.arrival) == pytest.approx(10.0, rel=1e-12)
    cv = lambda a: np.diff(a).std() / np.diff(a).mean()  # noqa: E731
    assert cv(t.arrival) == pytest.approx(cv(w.arrival), rel=1e-12)
    assert np.array_equal(t.prompt, w.prompt)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(rate=2, time_scale=2), "give one"),
    (dict(window="60:120"), "holds no requests"),  # a quiet minute of the coding trace
    (dict(window="5"), "expected START:END"),
    (dict(window="b:c"), "expected START:END"),
    (dict(window="9:3"), "0 <= START < END"),
    (dict(limit=0), "--limit must be >= 1"),
    (dict(rate=0.0), "--rate must be a positive number"),
])
def test_transform_errors(kw: dict, message: str) -> None:
    with pytest.raises(KvcargoError, match=message):
        transform(read_trace(AZURE_CODE), **kw)


def test_rate_needs_two_distinct_arrivals(tmp_path: Path) -> None:
    w = read_trace(write(tmp_path, "one.csv", "arrival,prompt_len,output_len\n0,1,1\n0,1,1\n"))
    with pytest.raises(KvcargoError, match="at least two distinct arrival times"):
        transform(w, rate=3)


def test_parse_window() -> None:
    assert parse_window("600:1200") == (600.0, 1200.0)
    assert parse_window(":30") == (0.0, 30.0)
    assert parse_window("30:") == (30.0, float("inf"))


# ------------------------------------------------------------------------- configuration


def test_simconfig_trace_fields_are_validated() -> None:
    for flag, value in [("time_scale", 2.0), ("limit", 3), ("window", "0:1"), ("arrival_col", "t"),
                        ("time_unit", "ms")]:
        with pytest.raises(KvcargoError, match=f"--{flag.replace('_', '-')} applies only to a trace"):
            SimConfig.build(**{flag: value})
    with pytest.raises(KvcargoError, match="give one"):
        SimConfig.build(workload_file="x.csv", rate=3, time_scale=2)
    with pytest.raises(KvcargoError, match="invalid --window 'x'"):
        SimConfig.build(workload_file="x.csv", window="x")
    with pytest.raises(KvcargoError, match="invalid --limit"):
        SimConfig.build(workload_file="x.csv", limit=0)
    with pytest.raises(KvcargoError, match="invalid --time-unit"):
        SimConfig.build(workload_file="x.csv", time_unit="h")


def test_load_workload_reads_and_transforms() -> None:
    c = SimConfig.build(workload_file=str(AZURE_CONV), window="10:", limit=100, rate=4.0)
    w = load_workload(c)
    assert len(w) == 100 and mean_rate(w.arrival) == pytest.approx(4.0)
    assert "window 10:, limit 100, rate 4 req/s" in w.source
    # the same default configuration without a trace is still the reference generator
    assert load_workload(SimConfig.build()).arrival[0] == 0.01803638301368865


def test_simulate_replays_a_production_trace() -> None:
    from kvcargo import simulate

    r = simulate(workload_file=str(MOONCAKE_CONV), limit=40, model="llama3-8b", link="ib-ndr")
    assert len(r.requests()["arrival"]) == 40
    assert r.requests()["prompt_len"][:3].tolist() == [6758, 7322, 7236]


# ---------------------------------------------------------------------------- statistics


def test_trace_stats_of_a_small_handmade_trace(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]},
            {"timestamp": 1000, "input_length": 1500, "output_length": 20, "hash_ids": [1, 2, 3]},
            {"timestamp": 3000, "input_length": 512, "output_length": 30, "hash_ids": [4]},
            {"timestamp": 4000, "input_length": 1024, "output_length": 40, "hash_ids": [4, 5]}]
    p = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows))
    st = trace_stats(read_trace(p), bucket_s=2.0)
    assert st["requests"] == 4 and st["duration_s"] == 4.0 and st["mean_rate"] == 0.75
    gaps = np.array([1.0, 2.0, 1.0])
    assert st["interarrival_cv"] == pytest.approx(gaps.std() / gaps.mean())
    assert st["prompt"]["mean"] == 1015.0 and st["prompt"]["median"] == 1024.0 and st["output"]["max"] == 40
    assert st["blocks"] == {"block_tokens": 512, "total": 8, "unique": 5, "reused": 3, "reused_share": 3 / 8}
    assert st["timeline"]["rate"] == [1.0, 1.0] and st["timeline"]["full_buckets"] == 2


def test_timeline_divides_a_partial_last_bucket_by_its_width() -> None:
    rates, full = timeline(np.array([0.0, 1.0, 2.0, 2.5]), 2.0)
    assert full == 1 and rates.tolist() == [1.0, 4.0]  # [0, 2): 2 req; [2, 2.5]: 2 req in 0.5 s


def test_trace_stats_handoff_demand_names_the_smallest_link() -> None:
    from kvcargo import catalog

    cat = catalog.builtin()
    w = read_trace(MOONCAKE_CONV)
    st = trace_stats(w, 60.0, cat.model("llama3-70b"), cat.links.values())
    h = st["handoff"]
    assert h["bytes_total"] == w.total_prompt_tokens * 327_680
    assert h["mean_bytes_per_s"] == pytest.approx(w.total_prompt_tokens * 327_680 / 165.0)
    ok = [r for r in h["links"] if r["carries_peak"]]
    assert h["smallest_sufficient_link"] == min(ok, key=lambda r: r["bandwidth"])["link"]


# ----------------------------------------------------------------------------------- CLI


def test_cli_trace_stats_json() -> None:
    p = kvcargo("trace-stats", str(MOONCAKE_CONV), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["requests"] == 500 and d["prompt"]["total"] == 7_124_855 and d["blocks"]["total"] == 14_162


def test_cli_trace_stats_text_with_model_and_transforms() -> None:
    p = kvcargo("trace-stats", str(AZURE_CODE), "--model", "llama3-70b", "--window", "0:100", "--limit", "50")
    assert p.returncode == 0, p.stderr
    assert "requests      50" in p.stdout and "KV hand-off demand (llama3-70b" in p.stdout
    assert "smallest catalog link that carries" in p.stdout


def test_cli_simulate_replays_with_trace_flags() -> None:
    p = kvcargo("simulate", "--workload-file", str(AZURE_CONV), "--limit", "30", "--time-scale", "0.5", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["config"]["limit"] == 30


@pytest.mark.parametrize(("args", "message"), [
    (["trace-stats", "{bad}"], "line 3: prompt length must be a whole number"),
    (["simulate", "--workload-file", "{bad}"], "line 3: prompt length must be a whole number"),
    (["simulate", "--workload-file", "{good}", "--window", "oops"], "invalid --window 'oops'"),
    (["simulate", "--limit", "5"], "--limit applies only to a trace"),
    (["trace-stats", "{good}", "--rate", "2", "--time-scale", "3"], "give one"),
])
def test_cli_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    bad = write(tmp_path, "bad.csv", "arrival,prompt_len,output_len\n0,1,1\n1,?,1\n")
    good = write(tmp_path, "good.csv", "arrival,prompt_len,output_len\n0,1,1\n1,2,1\n")
    p = kvcargo(*[a.format(bad=bad, good=good) for a in args])
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""
