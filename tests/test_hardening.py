"""What the model can represent: FLOP counts, the clock, the generator's clip; outputs that are
checked before a run and written atomically; the local backend with a script on stdin."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kvcargo import catalog as catalog_mod
from kvcargo.config import SimConfig, load_workload, notes
from kvcargo.cost import Pool, model_coefficients, prefill_step
from kvcargo.errors import KvcargoError
from kvcargo.limits import INT64_MAX, MAX_CLOCK_S, RANGES, max_step_tokens
from kvcargo.outputs import atomic_path, check_output
from kvcargo.simulation import simulate
from kvcargo.workload import LengthDist, generate

CAT = catalog_mod.load(())


@pytest.mark.parametrize("key", sorted(CAT.models))
def test_max_step_tokens_is_the_last_exact_int64_flop_count(key: str) -> None:
    mi, _ = model_coefficients(CAT.model(key))
    limit = max_step_tokens(mi)
    two_pmm, two_ld = int(mi[0]), int(mi[2 + 1])  # MI_TWO_PMM, MI_TWO_LD

    def flops(t: int) -> int:
        return two_pmm * t + two_ld * t * (t + 1)

    assert flops(limit) <= INT64_MAX < flops(limit + 1)


def test_prefill_at_the_limit_is_exact_and_beyond_it_refused() -> None:
    from kvcargo.handoff import calculate_config
    from kvcargo.params import HandoffConfig

    def calculate_keys(cat, model, prompt, link):  # type: ignore[no-untyped-def]
        return calculate_config(HandoffConfig(model=model, prompt=prompt, link=link), cat)

    m = CAT.model("llama3-8b")
    limit = max_step_tokens(model_coefficients(m)[0])
    assert limit == 5_903_082
    r, *_ = calculate_keys(CAT, "llama3-8b", limit, "eth-25g")
    below, *_ = calculate_keys(CAT, "llama3-8b", limit - 1000, "eth-25g")
    assert r.prefill_s > below.prefill_s > 16_000  # quadratic, not wrapped around (6e6 tokens once gave 0.3 s)
    assert 0 < prefill_step(m, Pool(CAT.device("h100")), [limit]).flops <= INT64_MAX
    with pytest.raises(KvcargoError, match="above 5,903,082, the most one prefill step of llama3-8b can hold"):
        calculate_keys(CAT, "llama3-8b", 6_000_000, "eth-25g")


def test_a_trace_prompt_beyond_the_limit_is_refused_before_the_run(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,prompt_len,output_len\n0,100,10\n1,100000000000,10\n", encoding="utf-8")
    with pytest.raises(KvcargoError, match="request 1's prompt of 100,000,000,000 tokens"):
        simulate(SimConfig(workload_file=str(trace)))


def test_arrivals_beyond_the_clock_are_refused() -> None:
    with pytest.raises(KvcargoError, match=r"the last request arrives at 1e\+09 s|beyond 1e\+09 s"):
        simulate(SimConfig(rate=1e-6, requests=2000, prompt=10, output=2))
    assert MAX_CLOCK_S == 1e9


def test_clipped_lengths_are_counted_exactly() -> None:
    """The draws do not depend on the clip: the clipped count is the number of unclipped draws
    beyond it (a differential check against the same generator with the clip raised)."""
    config = SimConfig(prompt=30_000, output=300, requests=400, output_cv=3.0)
    w = load_workload(config)
    wide = generate(400, 8.0, LengthDist(30_000, 0.5, hi=2**24), LengthDist(300, 3.0, hi=2**24), seed=1)
    assert w.clipped_prompts == int(np.count_nonzero(wide.prompt > 32_768)) > 0
    assert w.clipped_outputs == int(np.count_nonzero(wide.output > 32_768))
    assert np.array_equal(w.prompt, np.minimum(wide.prompt, 32_768))
    s = simulate(config).summary
    assert (s["clipped_prompts"], s["clipped_outputs"]) == (w.clipped_prompts, w.clipped_outputs)


def test_a_fixed_length_at_the_clip_is_not_counted_as_clipped() -> None:
    w = load_workload(SimConfig(prompt=32_768, prompt_cv=0, requests=20))
    assert set(w.prompt.tolist()) == {32_768} and w.clipped_prompts == 0


def test_the_clip_can_be_raised_and_a_mean_above_it_runs_clipped_with_a_note() -> None:
    """As the reference generator: a mean above the clip runs, every length clipped; a note says so."""
    above = SimConfig.build(prompt=40_000, prompt_cv=0, requests=5)
    assert set(load_workload(above).prompt.tolist()) == {32_768}
    assert [n for n in notes(above) if n.startswith("--prompt 40,000 is above 32,768 tokens")]
    raised = SimConfig(prompt=40_000, prompt_cv=0, max_length=65_536, requests=5)
    assert set(load_workload(raised).prompt.tolist()) == {40_000} and notes(raised) == []


def test_every_range_is_in_the_help_and_refused_beyond() -> None:
    from kvcargo.cli.simulate import command

    helps = {p.name: p.help for p in command.params}
    for name, bound in RANGES.items():
        assert "[range: " in helps[name], name
        beyond = (bound.hi * 2 + 1) if bound.hi is not None else None
        if beyond is not None and name not in ("max_length",):
            value = int(beyond) if SimConfig.model_fields[name].annotation in (int, int | None) else beyond
            with pytest.raises(KvcargoError, match="out of range|less than or equal"):
                SimConfig.build(**{name: value, **_needs(name)})


def _needs(name: str) -> dict:
    """What a field needs to apply at all."""
    return {"kv_keep": {"kv_compress": "freq-keep-k"}, "kv_ratio": {"kv_compress": "ratio"},
            "layer_groups": {"send": "layerwise"}, "nics_per_instance": {"topology": "nic"},
            "domain_size": {"topology": "nvlink-domain"}, "time_scale": {"workload_file": "azure-code-2023"},
            "instances": {"mode": "colocated"}, "kv_block_size": {"kv_policy": "paged"},
            "max_seq_len": {"kv_policy": "max"}, "system_len": {"system_prompts": 2},
            "ced_replay": {"model": "llama3-8b-ced"}, "transit_ops_per_byte": {"kv_compress": "fp8"},
            "transit_pj_per_bit": {"kv_compress": "fp8"}, "think": {"turns": 2},
            "fft_efficiency": {"model": "llama3-8b-hyena"}, "ft_static_w": {"device": "optical-fft"}}.get(name, {})


def test_a_run_larger_than_memory_gets_one_line(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """numpy's allocation error (a trace output of 10^12 tokens asked 1.8 TiB for the step log)
    is one line and exit 2, as an absurd size is bad input."""
    import kvcargo.simulation
    from kvcargo.cli import main

    def too_large(*args: object, **kwargs: object) -> None:
        np.empty(2**57, dtype=np.int8)  # 128 PiB: beyond any address space

    monkeypatch.setattr(kvcargo.simulation, "simulate", too_large)
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("kvcargo: error: out of memory: the run is larger than this machine can hold")


def test_a_run_where_every_request_is_rejected_shows_no_nan(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """One request whose KV (10^7 tokens, 1.3 TB) never fits: nothing completes, so rates and
    energy per token are undefined; the report shows "—" (it printed "nan") and numpy's divide
    warnings no longer reach stderr."""
    from kvcargo.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("arrival,prompt_len,output_len\n0,10,10000000\n", encoding="utf-8")
    main(["simulate", "--workload-file", str(trace)])
    out, err = capsys.readouterr()
    assert "completed 0 of 1 requests (1 rejected: KV never fits)" in out
    assert "nan" not in out.lower() and err == ""
    assert "goodput — req/s" in out and "— J per output token" in out


def test_a_scheduled_run_where_every_request_is_rejected_shows_no_nan(capsys: pytest.CaptureFixture[str]) -> None:
    """KV blocks of a million tokens: no request ever fits, the scheduler block has no mean."""
    from kvcargo.cli import main

    main(["simulate", "--requests", "20", "--kv-policy", "paged", "--kv-block-size", "1000000"])
    out = capsys.readouterr().out
    assert "completed 0 of 20 requests (20 rejected: KV never fits)" in out
    assert "mean running — rows" in out and "nan" not in out.lower()


def test_default_run_is_unchanged_by_the_checks() -> None:
    s = simulate(SimConfig()).summary
    assert s["ttft_p99"] == 0.3536255769527793 and s["clipped_prompts"] == 0
    assert s["link_gbytes_per_s"] == s["link_gbps"]


# ------------------------------------------------------------------------------------ outputs

def test_check_output_refuses_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(KvcargoError, match="does not exist"):
        check_output(tmp_path / "missing" / "r.csv", "--requests-csv")
    with pytest.raises(KvcargoError, match="is a directory"):
        check_output(tmp_path, "--out")
    with pytest.raises(KvcargoError, match="use a file ending in .csv"):
        check_output(tmp_path / "r.txt", "--requests-csv", (".csv",))
    assert check_output(tmp_path / "r.csv", "--requests-csv", (".csv",)) == tmp_path / "r.csv"
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "rows.csv"
    target.write_text("old, complete\n", encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half a ", encoding="utf-8")
        raise RuntimeError("killed mid-write")
    assert target.read_text(encoding="utf-8") == "old, complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.csv"]  # no temporary file left behind
    with atomic_path(target) as tmp:
        tmp.write_text("new\n", encoding="utf-8")
    assert target.read_text(encoding="utf-8") == "new\n" and oct(target.stat().st_mode & 0o777) != "0o600"


def test_simulate_writes_its_outputs_whole(tmp_path: Path) -> None:
    from kvcargo.cli import main

    csv, trace = tmp_path / "r.csv", tmp_path / "t.json"
    main(["simulate", "--requests", "20", "--requests-csv", str(csv), "--trace", str(trace), "--json"])
    assert csv.read_text(encoding="utf-8").count("\n") == 21 and trace.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "t.json"]


def test_local_backend_with_a_script_on_stdin_says_what_is_wrong() -> None:
    script = textwrap.dedent("""
        from kvcargo.planner.backends import get_backend
        from kvcargo.planner.grid import build
        from kvcargo.planner.sweep import run_sweep
        with get_backend("local", 2, None) as be:
            run_sweep(build({}, ["rate=8,9"], None), be)
    """)
    r = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=300)
    if r.returncode == 0:  # small grids may run in this process: then there is nothing to refuse
        assert "Traceback" not in r.stderr
        return
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].endswith(
        "'<stdin>' is not a file (a script on standard input?): save it to a file and run that, or use one "
        "worker (workers=1 runs in this process)")


def test_a_sweep_legend_names_an_unset_codec_as_the_page_does() -> None:
    """``kv-compress=default`` (no codec) and the ``none`` codec (an in-transit stage) are two
    different runs: their legends must differ."""
    from kvcargo.report.plots import series_of

    rows = [{"rate": 8.0, "kv_compress": None}, {"rate": 8.0, "kv_compress": "none"}]
    assert list(series_of(rows, "rate", ["kv_compress"])) == ["kv-compress=uncompressed", "kv-compress=none"]
