"""The page in a real headless Chromium (Debian's ``chromium`` driven by Playwright).

Every test checks what a user sees against the CLI / the Python API, and that the page made no
request outside the local server and raised no script error.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
from kvcargo.report.timeseries import plot_data  # noqa: E402
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


@contextmanager
def open_page(browser, url: str, width: int = 1280, panel: bool = True) -> Iterator[object]:
    """The page at ``url``, ``width`` px wide, loaded (with the calculator's panel unless not
    ``panel``); requests that leave the local server are blocked and reported, as are script
    errors."""
    base_url = url.split("/#")[0].rstrip("/")
    context = browser.new_context(viewport={"width": width, "height": 1000})
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
    pg.goto(url)
    pg.wait_for_selector("body[data-ready='1']")
    if panel:
        pg.wait_for_selector("#calc-table tr")
    try:
        yield pg
    finally:
        context.close()
    assert outside == [], f"requests outside the local server: {outside}"
    assert errors == [], f"script errors: {errors}"


@pytest.fixture
def page(browser, base_url: str) -> Iterator[object]:
    with open_page(browser, base_url + "/") as pg:
        yield pg


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
    shown = page.text_content("#calc-error")
    assert "“Prompt tokens”" in shown and "--" not in shown and "greater than or equal to 1" in shown
    assert page.get_attribute("#calc-prompt", "aria-invalid") == "true"
    for panel in ("#calc-panel", "#calc-figure"):  # the numbers and the timeline are both stale
        assert "stale" in page.get_attribute(panel, "class")
    page.select_option("#calc-model", "llama3-70b")
    page.fill("#calc-prompt", "1024")
    page.wait_for_function("() => document.querySelector('#calc-error').textContent.startsWith('Llama-3-70B does not')")
    page.fill("#calc-devices_per_instance", "2")
    expect_panel(page, cli_panel("--model", "llama3-70b", "--prompt", "1024", "--devices-per-instance", "2"))
    assert page.is_hidden("#calc-error")
    assert "stale" not in page.get_attribute("#calc-panel", "class")
    assert "stale" not in page.get_attribute("#calc-figure", "class")
    assert page.get_attribute("#calc-prompt", "aria-invalid") is None


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
    assert link == [["link busy (%, 2.9 s average)", 200], ["hand-offs waiting for the link (mean per 1.8 s)", 41]]
    check_link_plot(page, simulate(link="eth-25g", rate=14))
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
    page.fill("#sim-requests", "300")
    page.click("#sim-run")
    page.wait_for_selector("#sim-table tbody tr", timeout=120_000)
    page.fill("#sim-rate", "-1")
    page.click("#sim-run")
    page.wait_for_selector("#sim-error:not([hidden])")
    shown = page.text_content("#sim-error")
    assert "“Rate (req/s)”" in shown and "--" not in shown and "greater than 0" in shown
    assert page.get_attribute("#sim-rate", "aria-invalid") == "true"
    assert "stale" in page.get_attribute("#sim-results", "class")  # the table and both plots
    page.fill("#sim-rate", "8")
    page.fill("#sim-requests", "1000000")
    page.click("#sim-run")
    page.wait_for_function("() => document.querySelector('#sim-error').textContent.includes('at most 20,000 per run')")
    page.fill("#sim-requests", "400")
    page.select_option("#sim-decode_device", "a100")
    page.click("#sim-run")
    page.wait_for_selector("#sim-error", state="hidden")
    assert "stale" not in page.get_attribute("#sim-results", "class")
    assert page.get_attribute("#sim-rate", "aria-invalid") is None
    # the error clears when the run is sent: wait for this run's answer, not the first run's table
    page.wait_for_function("() => document.querySelector('#sim-command').textContent.includes('--decode-device a100')",
                           timeout=120_000)
    ttft = simulate(requests=400, decode_device="a100").summary["ttft_p99"]
    assert page.text_content("#sim-table tr[data-key='ttft_p99'] td.value") == f"{ttft * 1e3:,.1f} ms"
    assert page.is_visible("#calc-table")  # the rest of the page still works


NICE = {1, 2, 2.5, 5}


def check_link_plot(pg, result) -> None:
    """Utilisation as a smoothed area that keeps the run's mean; the queue as steps; both y axes
    with round ticks over four intervals, so that their grids coincide."""
    traces = pg.evaluate("() => document.getElementById('plot-link').data.map(t => "
                         "({x: t.x, y: t.y, fill: t.fill, shape: t.line.shape, axis: t.yaxis || 'y'}))")
    busy, queue = traces
    assert (busy["fill"], busy["shape"], busy["axis"]) == ("tozeroy", "spline", "y")
    assert (queue["shape"], queue["axis"]) == ("hv", "y2")
    raw = plot_data(result)["link"]
    # the queue: the exact mean of each run of 5 bins, as steps from the run's start to its end
    means = [sum(raw["queue"][i:i + 5]) / 5 for i in range(0, 200, 5)]
    assert queue["y"] == pytest.approx([*means, means[-1]], rel=1e-12, abs=1e-12)
    assert queue["x"][0] == pytest.approx(0, abs=1e-9) and queue["x"][-1] == pytest.approx(200 * raw["bin_s"])
    assert max(busy["y"]) <= 100 + 1e-9 and sum(busy["y"]) / len(busy["y"]) == pytest.approx(
        100 * sum(raw["busy"]) / len(raw["busy"]), rel=0.02)
    roughness = lambda ys: sum(abs(a - b) for a, b in zip(ys, ys[1:]))  # noqa: E731
    assert roughness(busy["y"]) < roughness([100 * b for b in raw["busy"]])
    axes = pg.evaluate("() => { const l = document.getElementById('plot-link').layout; "
                       "return [l.yaxis.range, l.yaxis.dtick, l.yaxis2.range, l.yaxis2.dtick]; }")
    (lo1, hi1), step1, (lo2, hi2), step2 = axes
    assert (lo1, hi1, step1) == (0, 100, 25)
    assert lo2 == 0 and hi2 == pytest.approx(4 * step2) and hi2 >= max(means)
    mantissa = step2 / 10 ** math.floor(math.log10(step2))
    assert any(mantissa == pytest.approx(m) for m in NICE)


def overflowing(pg) -> list[str]:
    """Elements of the page that stick out of their card (or the page out of the window)."""
    return pg.evaluate("""() => {
      const out = [];
      if (document.documentElement.scrollWidth > window.innerWidth) out.push('page: ' + document.documentElement.scrollWidth);
      for (const card of document.querySelectorAll('.card')) {
        const box = card.getBoundingClientRect();
        for (const e of card.querySelectorAll('input, select, button, fieldset, label, table, svg, .plot, p')) {
          const r = e.getBoundingClientRect();
          if (r.width === 0) continue;  // hidden
          if (r.left < box.left - 0.5 || r.right > box.right + 0.5) out.push(`${e.tagName}#${e.id}: ${r.left}-${r.right}`);
        }
      }
      return out;
    }""")


def test_narrow_layout_fits_a_phone_and_keeps_its_text_readable(browser, base_url: str) -> None:
    with open_page(browser, base_url + "/", width=420) as pg:
        assert overflowing(pg) == []
        # the timeline is drawn at its own width: one SVG unit per pixel, ticks at their 11 px
        scale = pg.evaluate("() => { const s = document.getElementById('calc-timeline'); "
                            "return s.getBoundingClientRect().width / s.viewBox.baseVal.width; }")
        assert scale == pytest.approx(1, abs=0.01)
        tick = pg.evaluate("() => document.querySelector('.tl-tick').getBoundingClientRect().height")
        assert tick >= 10
        label = pg.evaluate("() => { const t = document.getElementById('calc-exposed-label').getBoundingClientRect(); "
                            "const s = document.getElementById('calc-timeline').getBoundingClientRect(); "
                            "return [t.left >= s.left, t.right <= s.right + 0.5]; }")
        assert label == [True, True]
        # the controls stack: one select per row, two numbers per row
        model, link = (pg.locator(sel).bounding_box() for sel in ("#calc-model", "#calc-link"))
        assert link["y"] > model["y"] + model["height"] - 1
        rate, requests = (pg.locator(sel).bounding_box() for sel in ("#sim-rate", "#sim-requests"))
        assert rate["y"] == pytest.approx(requests["y"], abs=1) and requests["x"] > rate["x"] + rate["width"]

        pg.fill("#sim-requests", "300")
        pg.click("#sim-run")
        pg.wait_for_selector("#plot-link .main-svg", timeout=120_000)
        pg.click("#sim-pin")
        pg.select_option("#sim-kv_compress", "fp8")
        pg.click("#sim-run")
        pg.wait_for_function("() => document.getElementById('plot-cdf').data.length === 6")
        assert overflowing(pg) == []  # the results, the pinned column and the plots too
        for plot in ("#plot-cdf", "#plot-link"):
            width = pg.evaluate(f"() => document.querySelector('{plot} .main-svg').getBoundingClientRect().width")
            assert width <= 420 - 20
        OUTPUT.mkdir(exist_ok=True)
        pg.screenshot(path=str(OUTPUT / "web-ui-420.png"), full_page=True)


def table_columns(pg) -> dict[str, list[str]]:
    heads = pg.eval_on_selector_all("#sim-table thead th", "hs => hs.filter(h => !h.hidden).map(h => h.textContent)")
    rows = pg.eval_on_selector_all("#sim-table tbody tr", "rows => rows.map(r => [...r.children].map(c => c.textContent))")
    return {h: [r[i] for r in rows] for i, h in enumerate(heads)}


def test_pinned_run_is_overlaid_on_the_next_in_the_cdf_and_the_table(page) -> None:
    page.select_option("#sim-preset", "eth-25g-14")
    page.click("#sim-run")
    page.wait_for_selector("#sim-table tbody tr", timeout=120_000)
    assert page.is_hidden("#sim-unpin") and page.is_hidden("#sim-pinned-head")
    page.click("#sim-pin")
    assert page.text_content("#sim-pinned-command") == "kvcargo simulate --rate 14 --link eth-25g"
    page.select_option("#sim-kv_compress", "fp8")
    page.click("#sim-run")
    page.wait_for_function("() => document.querySelector('#sim-command').textContent.includes('fp8')")
    before, after = simulate(link="eth-25g", rate=14), simulate(link="eth-25g", rate=14, kv_compress="fp8")
    cols = table_columns(page)
    assert list(cols) == ["Metric", "This run", "Pinned", "Chapter"]
    assert cols["This run"] == [r["text"] for r in result_table(after.summary)]
    assert cols["Pinned"] == [r["text"] for r in result_table(before.summary)]
    assert cols["Chapter"] == [""] * len(cols["Metric"])  # the run is no longer the preset's
    traces = page.evaluate("() => document.getElementById('plot-cdf').data.map(t => [t.name, t.line.dash])")
    assert traces == [["TTFT", "solid"], ["TPOT", "solid"], ["hand-off", "solid"],
                      ["TTFT (pinned)", "dash"], ["TPOT (pinned)", "dash"], ["hand-off (pinned)", "dash"]]
    p99 = page.evaluate("() => [document.getElementById('plot-cdf').data[1].x[198], "
                        "document.getElementById('plot-cdf').data[4].x[198]]")
    assert p99 == pytest.approx([after.summary["tpot_p99"] * 1e3, before.summary["tpot_p99"] * 1e3], rel=1e-12)
    OUTPUT.mkdir(exist_ok=True)
    page.screenshot(path=str(OUTPUT / "web-ui-pinned.png"), full_page=True)

    page.click("#sim-unpin")
    assert list(table_columns(page)) == ["Metric", "This run", "Chapter"]
    assert page.evaluate("() => document.getElementById('plot-cdf').data.length") == 3


def test_the_url_holds_the_page_state_and_a_reload_restores_it(browser, page) -> None:
    page.fill("#calc-prompt", "4096")
    page.check("#calc-send-layerwise")
    expect_panel(page, cli_panel("--prompt", "4096", "--send", "layerwise"))
    page.select_option("#sim-preset", "eth-25g-14")
    page.click("#sim-run")
    page.wait_for_selector("#sim-table tbody tr", timeout=120_000)
    page.click("#sim-pin")
    page.fill("#sim-requests", "400")
    page.select_option("#sim-kv_compress", "fp8")
    url = page.url
    fragment = url.split("#", 1)[1]
    assert fragment == ("c.prompt=4096&c.send=layerwise&s.rate=14&s.requests=400&s.link=eth-25g&s.kv_compress=fp8"
                        "&pin=1&p.rate=14&p.link=eth-25g")
    with open_page(browser, url) as shared:
        expect_panel(shared, cli_panel("--prompt", "4096", "--send", "layerwise"))
        assert [shared.input_value(f"#sim-{k}") for k in ("rate", "requests", "link", "kv_compress", "model")] == \
            ["14", "400", "eth-25g", "fp8", "llama3-8b"]
        shared.wait_for_selector("#sim-pinned:not([hidden])", timeout=120_000)  # the pinned run ran again
        assert shared.text_content("#sim-pinned-command") == "kvcargo simulate --rate 14 --link eth-25g"
        shared.click("#sim-run")
        shared.wait_for_function("() => document.querySelector('#sim-command').textContent.includes('fp8')")
        cols = table_columns(shared)
        assert cols["Pinned"] == [r["text"] for r in result_table(simulate(link="eth-25g", rate=14).summary)]
        assert cols["This run"] == [r["text"] for r in result_table(
            simulate(link="eth-25g", rate=14, requests=400, kv_compress="fp8").summary)]
        assert shared.url == url  # nothing changed: the same state, the same URL
    with open_page(browser, url.split("#")[0] + "#c.prompt=oops&c.model=nope&s.link=nowhere&s.rate=9",
                   panel=False) as odd:
        shown = odd.wait_for_selector("#calc-error:not([hidden])").text_content()
        assert "“Prompt tokens”" in shown  # a bad value from a URL is reported like a typed one
        assert odd.input_value("#calc-model") == "llama3-8b" and odd.input_value("#sim-link") == "ib-ndr"
        assert odd.input_value("#sim-rate") == "9"
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
