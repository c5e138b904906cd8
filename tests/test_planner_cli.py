"""``kvcargo sweep``, ``capacity`` and ``plan`` end to end, and the planner's plots."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcargo import SimConfig
from kvcargo.errors import KvcargoError
from kvcargo.planner import grid as grid_mod
from kvcargo.planner.capacity import capacity
from kvcargo.planner.plan import Budget, build_space, plan
from kvcargo.planner.sweep import run_sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def kvcargo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcargo", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line in this process (exit status, stdout, stderr): quicker than a subprocess."""
    from kvcargo.cli import main

    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_capacity_json_reproduces_appendix_b_and_the_bisection() -> None:
    p = kvcargo("capacity", "--model", "llama3-70b", "--devices-per-instance", "4", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    c, s = d["ceilings"], d["search"]
    assert (c["prefill"], c["decode"], c["link"], c["decode_batch"]) == (
        7.491102470233705, 28.843033693365935, 74.45033614624572, 194)
    assert c["colocated"] == 2 / (1 / c["prefill"] + 1 / c["decode"])
    assert s["simulations"] == 7 and round(s["rate"], 2) == 5.97 and len(s["probes"]) == 7
    assert s["target"] == 0.9 and s["rtol"] == 0.02


def test_capacity_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "capacity")
    assert code == 0, err
    assert "Highest sustainable rate: 16.25 req/s" in out and "found in 7 simulations of 800 requests" in out
    for name, value in [("prefill", "17.05"), ("decode", "28.12"), ("KV link", "185.92"), ("bound", "17.05")]:
        assert any(ln.startswith(name) and value in ln for ln in out.splitlines()), (name, out)


@pytest.mark.parametrize("args, message", [
    (["capacity", "--rate", "4"], "capacity searches the arrival rate: drop --rate"),
    (["capacity", "--target", "2"], "--target must be in (0, 1]"),
    (["sweep", "--vary", "rat=1,2"], "unknown parameter 'rat' in --vary; did you mean rate?"),
    (["sweep"], "empty grid"),
    (["sweep", "--vary", "rate="], "empty value"),
    (["sweep", "--vary", "rate=4,8", "--rate", "3"], "--rate is both fixed and varied"),
    (["plan"], "plan needs a budget"),
    (["plan", "--gpus", "1"], "impossible budget (1 GPU): the smallest configuration searched"),
    (["plan", "--usd", "1000000", "--devices", "optical"], "no price_usd in the catalog for optical"),
    (["plan", "--gpus", "4", "--tp", "x"], "--tp: expected a comma-separated list of ints"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = cli(capsys, *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_sweep_cli_writes_resumes_and_plots(tmp_path: Path) -> None:
    args = ["sweep", "--vary", "rate=8,14", "--vary", "link=ib-ndr,eth-25g", "--requests", "400",
            "--workers", "1", "--out", "s.csv", "--plot", "s.png"]
    p = kvcargo(*args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "sweep: 4 runs (rate x link) on local backend, 1 worker" in p.stderr
    assert "4 runs in" in p.stdout and "s.csv" in p.stdout
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert [(r["rate"], r["link"], r["status"]) for r in rows] == [
        ("8.0", "ib-ndr", "ok"), ("8.0", "eth-25g", "ok"), ("14.0", "ib-ndr", "ok"), ("14.0", "eth-25g", "ok")]
    assert (tmp_path / "s.png").read_bytes()[:8] == PNG_MAGIC
    again = kvcargo(*args[:-2], "--json", cwd=tmp_path)  # everything is in s.csv already: nothing runs
    assert again.returncode == 0, again.stderr
    assert [d["key"] for d in json.loads(again.stdout)] == [r["key"] for r in rows]


def test_sweep_cli_from_a_file_with_a_failing_run(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text('[base]\nrequests = 200\n[vary]\nmode = ["disagg", "colocated"]\n'
                                     'kv-compress = ["default", "fp8"]\n')
    args = ("sweep", "g.toml", "--backend", "local", "--workers", "1", "--out", "g.csv")
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    assert "KV compression needs a hand-off" in out and "4 runs in" in out and "1 failed" in out
    code, out, err = cli(capsys, *args)  # resumed: the failed row counts as done
    assert code == 0 and "0 runs in" in out and "4 already done, 1 failed" in out


def test_plan_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from kvcargo.cli.plan import render

    front = tmp_path / "front.html"
    code, out, err = cli(capsys, "plan", "--gpus", "4", "--tp", "1", "--requests", "400", "--workers", "1",
                         "--json", "--plot", str(front))
    assert code == 0, err
    d = json.loads(out)
    assert d["counts"]["candidates"] == 6 and d["best"]["front"] and d["cost"] == "gpus"
    assert d["commands"]["capacity"].startswith("kvcargo capacity ")
    assert "plotly" in front.read_text()[:20000].lower()
    base, budget = SimConfig(requests=400), Budget(gpus=4)
    space = build_space(base, set(), budget, tp=(1,))
    text = render(plan(base, budget, space), space)
    assert "Pareto front: capacity vs GPUs" in text and "Best (the highest capacity within the budget)" in text
    assert d["commands"]["capacity"] in text


# --------------------------------------------------------------------------------- plots


@pytest.fixture(scope="module")
def sweep_rows() -> list[dict]:
    return run_sweep(grid_mod.build({"requests": 200}, ["rate=8,12", "link=ib-ndr,eth-25g"])).rows


@pytest.mark.parametrize("suffix", [".png", ".html"])
def test_sweep_plot(sweep_rows: list[dict], tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("matplotlib" if suffix == ".png" else "plotly")
    from kvcargo.report.plots import sweep_figure

    path = sweep_figure(sweep_rows, tmp_path / f"s{suffix}", "rate", ["link"])
    data = path.read_bytes()
    if suffix == ".png":
        assert data[:8] == PNG_MAGIC and len(data) > 10_000
    else:
        text = data.decode()
        assert text.lstrip().lower().startswith(("<!doctype html>", "<html")) and "plotly" in text.lower()
        assert "link=eth-25g" in text and "TPOT p99 (ms)" in text


@pytest.mark.parametrize("suffix", [".png", ".html"])
def test_capacity_and_pareto_plots(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("matplotlib" if suffix == ".png" else "plotly")
    from kvcargo.report.plots import capacity_figure, pareto_figure

    cap = capacity_figure(capacity(SimConfig(requests=300)), tmp_path / f"c{suffix}")
    base, budget = SimConfig(requests=300), Budget(gpus=3)
    r = plan(base, budget, build_space(base, set(), budget, tp=(1,)))
    front = pareto_figure([c.row() for c in r.candidates], tmp_path / f"p{suffix}", "gpus", r.best.label)
    for path in (cap, front):
        data = path.read_bytes()
        if suffix == ".png":
            assert data[:8] == PNG_MAGIC
        else:
            assert b"plotly" in data.lower() and b"</html>" in data.lower()


def test_plot_errors(sweep_rows: list[dict], tmp_path: Path) -> None:
    from kvcargo.report.plots import sweep_figure

    with pytest.raises(KvcargoError, match="use a .png"):
        sweep_figure(sweep_rows, tmp_path / "s.jpg")
    with pytest.raises(KvcargoError, match="no run succeeded"):
        sweep_figure([{**r, "status": "error"} for r in sweep_rows], tmp_path / "s.png")
