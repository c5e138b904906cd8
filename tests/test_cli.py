"""The command line end to end (subprocesses: real exit codes, real stdout/stderr)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcargo import simulate


def kvcargo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcargo", *args], capture_output=True, text=True, timeout=600)


def test_handoff_panel() -> None:
    p = kvcargo("handoff", "--model", "llama3-8b", "--prompt", "2048", "--link", "eth-25g")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    for label, value in [("KV to hand off", "268.4 MB"), ("On the wire", "268.4 MB"), ("Transfer", "85.9 ms"),
                         ("Prefill", "59.0 ms"), ("Exposed after prefill", "85.9 ms"), ("Link full at", "11.6 req/s")]:
        assert any(ln.startswith(label) and value in ln for ln in lines), (label, p.stdout)


def test_handoff_json_layerwise_fp8() -> None:
    p = kvcargo("handoff", "--link", "eth-25g", "--send", "layerwise", "--kv-compress", "fp8", "--json")
    d = json.loads(p.stdout)
    assert d["kv_bytes"] == 268_435_456 and d["wire_bytes"] == 134_217_728.0
    assert round(d["exposed_s"] * 1e3, 2) == 1.36 and d["send"] == "layerwise"


def test_handoff_links_table_lists_every_link() -> None:
    out = kvcargo("handoff", "--prompt", "2048", "--links").stdout
    for name, t in [("NVLink 4", "601.5 µs"), ("Co-packaged optics", "1.35 ms"), ("InfiniBand NDR 400G", "5.38 ms"),
                    ("100 GbE", "21.5 ms"), ("25 GbE", "85.9 ms"), ("PCIe Gen4", "8.39 ms")]:
        assert any(name in ln and t in ln for ln in out.splitlines()), (name, out)


def test_catalog_lists_kinds() -> None:
    out = kvcargo("catalog", "links").stdout
    assert "eth-25g" in out and "3.125 GB/s" in out
    assert json.loads(kvcargo("catalog", "models", "--json").stdout)["llama3-8b"]["layers"] == 32


@pytest.mark.parametrize("args, message", [
    (["handoff", "--model", "gpt-9"], "unknown model 'gpt-9'; valid choices: "),
    (["handoff", "--link", "carrier-pigeon"], "unknown link 'carrier-pigeon'; valid choices:"),
    (["handoff", "--kv-compress", "zip"], "unknown codec 'zip'; valid choices: fp4-block, fp8"),
    (["handoff", "--prompt", "0"], "prompt must be a positive whole number"),
    (["handoff", "--prompt", "many"], "'many' is not a valid integer"),
    (["handoff", "--model", "llama3-70b"], "does not fit the prefill pool"),
    (["simulate", "--rate", "-3"], "invalid --rate (got -3.0): Input should be greater than 0"),
    (["simulate", "--decode", "0"], "invalid --decode"),
    (["simulate", "--mode", "colocated", "--kv-compress", "fp8"], "KV compression needs a hand-off"),
    (["simulate", "--requests", "1000000000"], "invalid --requests"),
    (["simulate", "--ttft-slo", "0"], "invalid --ttft-slo"),
    (["simulate", "--device", "tpu"], "unknown device 'tpu'"),
    (["simulate", "--model", "llama3-70b"], "does not fit the prefill pool"),
    (["reproduce", "--group", "nope"], "unknown group 'nope'"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    p = kvcargo(*args)
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_simulate_json_equals_the_python_api(tmp_path: Path) -> None:
    p = kvcargo("simulate", "--link", "eth-25g", "--requests", "300", "--json",
                "--requests-csv", str(tmp_path / "r.csv"))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["summary"]
    want = simulate(link="eth-25g", requests=300).summary
    for k in ("ttft_p99", "tpot_p99", "handoff_p99", "link_busy", "j_per_token", "goodput_rps", "completed"):
        assert got[k] == want[k]
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert list(rows[0]) == ["rid", "arrival", "prompt_len", "output_len", "prefill_start", "first_token",
                             "kv_start", "kv_ready", "decode_start", "finish"]
    assert len(rows) == 300 and rows[0]["arrival"] == repr(0.01803638301368865) and rows[0]["prompt_len"] == "1236"
    assert rows[0]["finish"] == repr(float(simulate(link="eth-25g", requests=300).requests()["finish"][0]))


def test_colocated_csv_leaves_link_cells_empty(tmp_path: Path) -> None:
    p = kvcargo("simulate", "--mode", "colocated", "--requests", "50", "--requests-csv", str(tmp_path / "c.csv"))
    assert p.returncode == 0, p.stderr
    row = next(csv.DictReader(open(tmp_path / "c.csv")))
    assert row["kv_start"] == "" and row["kv_ready"] == "" and row["finish"] != ""
    assert "Hot-spot" in p.stdout and "colocated-0" in p.stdout


def test_default_simulate_is_the_chapter_first_row() -> None:
    out = kvcargo("simulate").stdout
    ttft = next(ln for ln in out.splitlines() if ln.startswith("TTFT"))
    tpot = next(ln for ln in out.splitlines() if ln.startswith("TPOT"))
    assert ttft.split()[4] == "353.6" and tpot.split()[4] == "8.8"


def test_every_simulate_flag_has_help_text() -> None:
    """Help lives in SimConfig's field docstrings: a field without one would be a bare flag."""
    from click.testing import CliRunner

    from kvcargo.cli.simulate import command
    from kvcargo.config import SimConfig

    assert [n for n, f in SimConfig.model_fields.items() if not f.description] == []
    helps = {p.name: p.help for p in command.params}
    assert helps["max_batch"] == "Maximum decode batch. [range: 1 to 1,000,000] [default: 256]"
    assert "Maximum decode batch" in CliRunner().invoke(command, ["--help"]).output


@pytest.mark.parametrize("handoff", [["--link-model", "measured", "--cost-model", "calibrated"],
                                     ["--send", "layerwise", "--layer-groups", "4", "--kv-reserve", "at-transfer"]])
def test_compare_twin_drops_only_the_hand_off(handoff: list[str]) -> None:
    """The colocated twin has no KV link: it runs without the hand-off options and equals a direct run."""
    common = ["--requests", "60", "--json", "--rate", "4", "--ttft-slo", "0.5"]
    p = kvcargo("simulate", "--compare", *handoff, *common)
    assert p.returncode == 0, p.stderr
    twin, disagg = json.loads(p.stdout)
    assert disagg["config"]["mode"] == "disagg"
    kept = [a for a in handoff if a in ("--cost-model", "calibrated")]
    direct = json.loads(kvcargo("simulate", "--mode", "colocated", *kept, *common).stdout)
    assert twin == direct
