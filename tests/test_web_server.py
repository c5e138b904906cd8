"""The web server for real: uvicorn on a socket, concurrent clients, and ``kvcargo ui`` itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from web_support import live_server  # noqa: E402

from kvcargo.web import create_app  # noqa: E402


def test_calculator_answers_while_simulations_run_and_extra_runs_are_refused() -> None:
    app = create_app(max_requests=5_000_000, timeout_s=6.0, workers=1, queue=0)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        assert client.post("/api/simulate", json={"requests": 10}).status_code == 200  # worker up
        long_run: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: long_run.setdefault(
            "r", client.post("/api/simulate", json={"requests": 3_000_000})))
        thread.start()
        deadline = time.monotonic() + 10
        while app.state.pool._pending == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        busy = client.post("/api/simulate", json={})
        assert busy.status_code == 503
        assert busy.json()["error"].startswith("the simulator is busy (1 runs in progress or waiting)")
        slowest = 0.0
        for prompt in range(1024, 1024 + 20 * 64, 64):
            t0 = time.perf_counter()
            r = client.get("/api/handoff", params={"prompt": prompt})
            slowest = max(slowest, time.perf_counter() - t0)
            assert r.status_code == 200 and r.json()["prompt_tokens"] == prompt
        assert thread.is_alive(), "the long run should still be going"
        assert slowest < 2.0
        thread.join(60)
        assert long_run["r"].status_code == 504
        assert client.post("/api/simulate", json={}).status_code == 200


def kvcargo_ui(*args: str) -> subprocess.Popen[str]:
    # A session of its own, so that a test can press Ctrl-C as a terminal does (the whole group).
    return subprocess.Popen([sys.executable, "-m", "kvcargo", "ui", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_kvcargo_ui_serves_the_page_and_the_api() -> None:
    proc = kvcargo_ui("--port", "0", "--max-requests", "1000", "--timeout", "20")
    try:
        line = proc.stdout.readline()
        assert line.startswith("kvcargo ui: serving http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.split()[3]
        assert httpx.get(url).text.startswith("<!doctype html>")
        handoff = httpx.get(url + "api/handoff", params={"prompt": 4096, "send": "layerwise"}).json()
        cli = json.loads(subprocess.run([sys.executable, "-m", "kvcargo", "handoff", "--prompt", "4096", "--send",
                                         "layerwise", "--json"], capture_output=True, text=True).stdout)
        assert {k: v for k, v in handoff.items() if k not in ("layers", "panel")} == cli
        limits = httpx.get(url + "api/catalog").json()["limits"]
        assert limits["max_requests"] == 1000 and limits["timeout_s"] == 20
        r = httpx.post(url + "api/simulate", json={"requests": 2000}, timeout=60)
        assert r.status_code == 422 and "at most 1,000 per run" in r.json()["error"]
        # bound to loopback: other Host headers are refused (DNS rebinding)
        assert httpx.get(url + "api/presets", headers={"Host": "attacker.example"}).status_code == 400
    finally:
        proc.terminate()
        proc.wait(30)


def test_kvcargo_ui_bad_options_exit_2() -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        proc = kvcargo_ui("--port", str(busy.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 2 and "kvcargo: error: cannot listen on 127.0.0.1:" in err, err
    finally:
        busy.close()
    proc = kvcargo_ui("--port", "70000")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "70000 is not in the range 0<=x<=65535" in err
    proc = kvcargo_ui("--catalog", "/nonexistent/catalog.toml")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "does not exist" in err


def test_ctrl_c_ends_a_run_in_flight_and_exits_at_once() -> None:
    proc = kvcargo_ui("--port", "0", "--max-requests", "50000000", "--timeout", "600", "--workers", "1")
    try:
        line = proc.stdout.readline()
        assert line.startswith("kvcargo ui: serving http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.split()[3]
        assert httpx.post(url + "api/simulate", json={"requests": 10}, timeout=300).status_code == 200  # worker up
        long_run: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: long_run.setdefault(
            "r", httpx.post(url + "api/simulate", json={"requests": 20_000_000}, timeout=600)))
        thread.start()
        time.sleep(1.5)
        assert thread.is_alive(), "the long run should still be going"
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the server and its workers
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
        thread.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert took < 5, f"the server took {took:.1f} s to exit"
    assert proc.returncode == 130 and "Traceback" not in out + err, err  # 130: stopped by SIGINT
    r = long_run["r"]
    assert r.status_code == 503 and r.json() == {"error": "the server is shutting down"}
