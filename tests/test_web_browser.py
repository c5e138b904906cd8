"""The page in a real headless Chromium (Debian's ``chromium`` driven by Playwright).

Every test checks what a user sees against the CLI / the Python API, and that the page made no
request outside the local server and raised no script error.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUTPUT = Path(__file__).resolve().parents[1] / "test-output"

if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed (/usr/bin/chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from web_support import live_server  # noqa: E402

from kvcargo import simulate  # noqa: E402
from kvcargo.web import create_app  # noqa: E402
from kvcargo.web.service import result_table  # noqa: E402


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with live_server(create_app(timeout_s=120)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, base_url: str) -> Iterator[object]:
    """The page, loaded; requests that leave the local server are blocked and reported."""
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    pg = context.new_page()
    outside: list[str] = []
    errors: list[str] = []

    def gate(route) -> None:
        if route.request.url.startswith(base_url + "/"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    pg.route("**/*", gate)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" and "status of 4" not in m.text else None)
    pg.goto(base_url + "/")
    pg.wait_for_selector("body[data-ready='1']")
    pg.wait_for_selector("#calc-table tr")
    yield pg
    context.close()
    assert outside == [], f"requests outside the local server: {outside}"
    assert errors == [], f"script errors: {errors}"


def cli_panel(*args: str) -> tuple[str, list[list[str]]]:
    """``kvcargo handoff``'s text panel: the title and (label, value, note) rows."""
    out = subprocess.run([sys.executable, "-m", "kvcargo", "handoff", *args], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return out[0], [re.split(r"\s{2,}", ln.strip()) for ln in out[1:]]


def page_panel(pg) -> tuple[str, list[list[str]]]:
    rows = pg.eval_on_selector_all("#calc-table tr",
                                   "rows => rows.map(r => [...r.children].map(c => c.textContent))")
    return pg.text_content("#calc-title"), rows


def expect_panel(pg, expected: tuple[str, list[list[str]]]) -> None:
    """Wait (up to 15 s) until the page shows ``expected``; then compare, for a readable failure."""
    shown = ("exp => JSON.stringify([document.querySelector('#calc-title').textContent, "
             "[...document.querySelectorAll('#calc-table tr')].map(r => [...r.children].map(c => c.textContent))])"
             " === JSON.stringify(exp)")
    try:
        pg.wait_for_function(shown, arg=[expected[0], expected[1]], timeout=15_000)
    except sync_api.TimeoutError:
        pass
    assert page_panel(pg) == expected


def test_prompt_slider_updates_the_panel_to_the_cli_numbers(page) -> None:
    assert page_panel(page) == cli_panel()  # the defaults: 2,048 tokens over 25 GbE
    assert page.text_content("#calc-exposed-label") == "exposed after prefill: 85.9 ms"
    slider = page.locator("#calc-prompt-range")
    slider.focus()
    page.keyboard.press("ArrowRight")  # one step of 16 tokens
    expect_panel(page, cli_panel("--prompt", "2064"))
    assert page.input_value("#calc-prompt") == "2064"
    page.keyboard.press("End")
    expect_panel(page, cli_panel("--prompt", "32768"))
    assert page.text_content("#calc-prompt-out") == "32,768"

    page.fill("#calc-prompt", "2048")
    page.check("#calc-send-layerwise")
    page.wait_for_function("() => document.querySelector('#calc-exposed-label').textContent.endsWith('28.7 ms')")
    page.select_option("#calc-kv_compress", "fp8")
    page.wait_for_function("() => document.querySelector('#calc-exposed-label').textContent.endsWith('1.36 ms')")
    expect_panel(page, cli_panel("--send", "layerwise", "--kv-compress", "fp8"))
    # layer-wise: the transfer is drawn as slices that start during the prefill
    first = page.eval_on_selector(".tl-transfer", "r => Number(r.getAttribute('x'))")
    prefill_end = page.eval_on_selector(".tl-prefill", "r => Number(r.getAttribute('x')) + Number(r.getAttribute('width'))")
    assert first < prefill_end

    assert page.is_hidden("#calc-kv_ratio-field")
    page.select_option("#calc-kv_compress", "ratio")  # the measured-ratio codec: its field appears
    page.fill("#calc-kv_ratio", "8")
    expect_panel(page, cli_panel("--send", "layerwise", "--kv-compress", "ratio", "--kv-ratio", "8"))
    page.select_option("#calc-kv_compress", "fp8")

    page.select_option("#calc-model", "mistral-7b")
    page.select_option("#calc-link", "nvlink4")
    page.select_option("#calc-device", "a100")
    expect_panel(page, cli_panel("--model", "mistral-7b", "--link", "nvlink4", "--device", "a100",
                                 "--send", "layerwise", "--kv-compress", "fp8"))


def test_invalid_calculator_input_shows_the_error_then_recovers(page) -> None:
    page.fill("#calc-prompt", "0")
    page.wait_for_selector("#calc-error:not([hidden])")
    assert page.text_content("#calc-error") == "invalid --prompt (got '0'): Input should be greater than or equal to 1"
    assert "stale" in page.get_attribute("#calc-panel", "class")
    page.select_option("#calc-model", "llama3-70b")
    page.fill("#calc-prompt", "1024")
    page.wait_for_function("() => document.querySelector('#calc-error').textContent.startsWith('Llama-3-70B does not')")
    page.fill("#calc-devices_per_instance", "2")
    expect_panel(page, cli_panel("--model", "llama3-70b", "--prompt", "1024", "--devices-per-instance", "2"))
    assert page.is_hidden("#calc-error")
    assert "stale" not in page.get_attribute("#calc-panel", "class")


def test_preset_run_shows_the_table_and_both_plots(page) -> None:
    page.select_option("#sim-preset", "eth-25g-14")
    assert page.input_value("#sim-rate") == "14" and page.input_value("#sim-link") == "eth-25g"
    page.click("#sim-run")
    page.wait_for_selector("#sim-table tbody tr", timeout=120_000)
    page.wait_for_selector("#plot-cdf .main-svg")
    page.wait_for_selector("#plot-link .main-svg")
    rows = page.eval_on_selector_all(
        "#sim-table tbody tr", "rows => rows.map(r => [r.dataset.key, ...[...r.children].map(c => c.textContent)])")
    summary = simulate(link="eth-25g", rate=14).summary
    expected = result_table(summary)
    assert [(key, label, value) for key, label, value, _ in rows] == [(r["key"], r["label"], r["text"]) for r in expected]
    shown = {key: (value, chapter) for key, _, value, chapter in rows}
    assert shown["tpot_p99"] == ("77.2 ms", "77.2 ms")
    assert shown["handoff_p99"] == ("9,657.8 ms", "9,657.8 ms")
    assert shown["link_busy"] == ("94.0%", "94.0%")
    assert shown["slo_attainment"] == ("41.0%", "41.0%")
    assert page.text_content("#sim-command") == "kvcargo simulate --rate 14 --link eth-25g"
    traces = page.evaluate("() => document.getElementById('plot-cdf').data.map(t => [t.name, t.x.length])")
    assert traces == [["TTFT", 201], ["TPOT", 201], ["hand-off", 201]]
    p99 = page.evaluate("() => document.getElementById('plot-cdf').data[1].x[198]")
    assert p99 == pytest.approx(summary["tpot_p99"] * 1e3, rel=1e-12)
    link = page.evaluate("() => document.getElementById('plot-link').data.map(t => [t.name, t.y.length])")
    assert link == [["link busy (%)", 200], ["waiting for the link", 200]]
    assert page.locator("#plot-cdf .scatterlayer .trace").count() == 3
    assert page.locator("#plot-link .scatterlayer .trace").count() == 2
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "web-ui.png"), full_page=True)
    assert (OUTPUT / "web-ui.png").stat().st_size > 10_000

    # editing a field leaves the preset: the chapter column no longer applies to the next run
    page.fill("#sim-rate", "10")
    assert page.input_value("#sim-preset") == ""
    page.click("#sim-run")
    page.wait_for_function("() => document.querySelector('#sim-command').textContent.includes('--rate 10')")
    assert page.text_content("#sim-table tr[data-key='tpot_p99'] td.chapter") == ""
    tpot = simulate(link="eth-25g", rate=10).summary["tpot_p99"]
    assert page.text_content("#sim-table tr[data-key='tpot_p99'] td.value") == f"{tpot * 1e3:,.1f} ms"


def test_invalid_simulation_input_shows_the_error_not_a_broken_page(page) -> None:
    page.fill("#sim-rate", "-1")
    page.click("#sim-run")
    page.wait_for_selector("#sim-error:not([hidden])")
    assert page.text_content("#sim-error") == "invalid --rate (got -1): Input should be greater than 0"
    page.fill("#sim-rate", "8")
    page.fill("#sim-requests", "1000000")
    page.click("#sim-run")
    page.wait_for_function("() => document.querySelector('#sim-error').textContent.includes('at most 20,000 per run')")
    page.fill("#sim-requests", "400")
    page.select_option("#sim-decode_device", "a100")
    page.click("#sim-run")
    page.wait_for_selector("#sim-error", state="hidden")
    page.wait_for_selector("#sim-table tbody tr")
    ttft = simulate(requests=400, decode_device="a100").summary["ttft_p99"]
    assert page.text_content("#sim-table tr[data-key='ttft_p99'] td.value") == f"{ttft * 1e3:,.1f} ms"
    assert page.is_visible("#calc-table")  # the rest of the page still works


def test_serving_levers_in_the_panel(page) -> None:
    """The "Scheduling & memory" fields reach the run; the table gains the levers' rows."""
    page.select_option("#sim-model", "opt-13b")
    page.select_option("#sim-device", "a100-40g")
    page.fill("#sim-requests", "200")
    page.select_option("#sim-kv_policy", "paged")
    page.select_option("#sim-preemption", "swap")
    page.select_option("#sim-prefix_caching", "false")
    page.click("#sim-run")
    page.wait_for_selector("#sim-table tr[data-key='preemptions']", timeout=120_000)
    assert page.text_content("#sim-command") == ("kvcargo simulate --requests 200 --model opt-13b --device a100-40g "
                                                 "--kv-policy paged --preemption swap")
    s = simulate(requests=200, model="opt-13b", device="a100-40g", kv_policy="paged", preemption="swap").summary
    assert page.text_content("#sim-table tr[data-key='preemptions'] td.value") == f"{s['preemptions']:,}"
    assert page.text_content("#sim-table tr[data-key='swap_out_GB'] td.value") == f"{s['swap_out_GB']:.3f} GB"
