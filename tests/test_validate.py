"""``kvcargo validate``: published vs kvcargo, gaps reported, trace checks skipped without traces."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvcargo import catalog, validate
from kvcargo.cost import Pool
from kvcargo.errors import KvcargoError
from kvcargo.handoff import calculate
from kvcargo.workload.builtin import trace_dir

ROOT = Path(__file__).resolve().parent.parent
EXCERPTS = Path(__file__).resolve().parent / "data" / "traces"
FULL = trace_dir()


def kvcargo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvcargo", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


def by_what(results: list[validate.Result]) -> dict[str, validate.Result]:
    return {r.what: r for r in results}


def test_kv_sizes_all_match_exactly() -> None:
    rs = validate.run(["kv"])
    assert len(rs) == 7 and all(r.status == "ok" and r.rel_diff is not None for r in rs)
    r = by_what(rs)
    assert r["OPT-66B (MHA)"].value == 2_359_296 and r["OPT-66B (MHA)"].kvcargo == "2.25 MiB"
    assert r["DeepSeek-V3 (MLA latent, not split by TP)"].value == 70_272
    assert r["Llama-3-70B (GQA, 8 KV heads)"].rel_diff == 0.0


def test_moe_parameter_counts() -> None:
    r = by_what(validate.run(["moe"]))
    assert r["Mixtral-8x7B total parameters"].status == "ok"
    assert r["Mixtral-8x7B active parameters per token"].status == "ok"
    assert r["DeepSeek-V3 total parameters"].status == "ok"
    active = r["DeepSeek-V3 active parameters per token"]
    assert active.status == "gap" and active.rel_diff == pytest.approx(37_551_276_032 / 37e9 - 1)
    assert "counting convention" in active.note


def test_splitwise_gap_is_reported_with_the_calculators_number() -> None:
    rs = validate.run(["splitwise"])
    assert [r.status for r in rs] == ["gap", "gap"]
    cat = catalog.builtin()
    h100 = calculate(cat.model("llama2-70b"), 1500, cat.link("ib-ndr"), Pool(cat.device("h100"), 8), send="layerwise")
    assert rs[0].value == h100.exposed_s and rs[0].rel_diff == pytest.approx(h100.exposed_s / 5e-3 - 1)
    assert rs[0].kvcargo == f"{h100.exposed_s * 1e3:.3f} ms"
    assert rs[1].value < 8e-3 and "HDR" in rs[1].note


def test_mooncake_line_rate_gap() -> None:
    rs = validate.run(["mooncake"])
    assert [r.status for r in rs] == ["gap", "gap"]
    assert rs[0].kvcargo == "100 GB/s" and rs[1].kvcargo == "400 GB/s"
    assert rs[1].rel_diff == pytest.approx(3.94e9 / (10e-6 + 3.94e9 / 400e9) / 190e9 - 1)


def test_trace_checks_use_the_built_in_traces_and_skip_missing_files(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVCARGO_TRACE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert validate.find_trace_dir() == FULL
    (tmp_path / "t").mkdir()
    shutil.copy(EXCERPTS / "azure2023_code.csv", tmp_path / "t")
    rs = by_what(validate.run(["traces"], tmp_path / "t"))
    assert rs["Mooncake conversation: requests"].status == "skipped"
    assert "not available" in rs["Mooncake conversation: requests"].note
    # the excerpt is not the full trace: a statistic kvcargo should reproduce then fails
    assert rs["Azure 2023 code: requests"].status == "FAIL"
    assert rs["Azure 2023 code: median prompt"].status == "ok"  # the excerpt's median happens to agree


def test_trace_checks_pass_on_the_built_in_traces() -> None:
    rs = validate.run(["traces"])
    assert len(rs) == 13 and all(r.status == "ok" for r in rs), [r for r in rs if r.status != "ok"]


def test_unknown_group_and_trace_dir() -> None:
    with pytest.raises(KvcargoError, match="unknown group 'nope'"):
        validate.run(["nope"])
    with pytest.raises(KvcargoError, match="not a directory"):
        validate.run(["traces"], "/nonexistent/dir")


def test_parse_and_show() -> None:
    assert validate.parse("2.25 MiB") == (2.25, "MiB", 2)
    assert validate.parse("12,035 tokens") == (12035.0, "tokens", 0)
    assert validate.shown(0.000133, "ms", 0) == "0.133 ms"
    assert validate.shown(12_034.6, "tokens", 0) == "12,035 tokens"
    with pytest.raises(KvcargoError, match="unknown unit"):
        validate.parse("3 parsecs")


def test_render_quotes_published_kvcargo_and_difference() -> None:
    text = validate.render(validate.run(["kv", "splitwise"]))
    assert "OPT-13B (MHA)" in text and "800 KiB" in text and "-97.3%" in text and "gap" in text
    assert text.endswith("9 checks: 7 ok, 2 gaps reported, 0 failed, 0 skipped")


def test_cli_validate(tmp_path: Path) -> None:
    p = kvcargo("validate", "--trace-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "gaps reported, 0 failed, 13 skipped" in p.stdout
    j = kvcargo("validate", "--json", "--group", "kv")
    rows = json.loads(j.stdout)
    assert j.returncode == 0 and [r["status"] for r in rows] == ["ok"] * 7
    assert set(rows[0]) == {"group", "what", "source", "published", "kvcargo", "value", "rel_diff", "status", "note"}
    assert "splitwise" in kvcargo("validate", "--list").stdout


def test_cli_validate_exits_1_on_a_failed_check(tmp_path: Path) -> None:
    shutil.copy(EXCERPTS / "mooncake_synthetic.jsonl", tmp_path)
    p = kvcargo("validate", "--group", "traces", "--trace-dir", str(tmp_path))
    assert p.returncode == 1 and "FAIL" in p.stdout


def test_cli_validate_bad_input_is_one_line_exit_2() -> None:
    p = kvcargo("validate", "--group", "nope")
    assert p.returncode == 2 and "unknown group 'nope'" in p.stderr and p.stdout == ""
