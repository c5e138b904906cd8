"""The interactive page and its JSON API (FastAPI).

Routes: ``GET /`` (the page), ``/static/*`` (its script and style), ``/vendor/plotly.min.js``
(from the installed ``plotly`` package: nothing comes from the internet), ``GET /api/handoff``,
``POST /api/simulate``, ``GET /api/catalog``, ``GET /api/presets``. Errors are JSON
``{"error": "one line"}``: 400 for a malformed request or a foreign ``Host``, 403 for a POST from
another site, 415 for a POST body not declared JSON, 422 for invalid parameters (with ``"field"``,
the parameter at fault), 413 for an oversized body, 503 when the simulator is busy or the server is
shutting down, 504 when a run passes the time limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvcargo import __version__
from kvcargo import catalog as catalog_mod
from kvcargo.config import DEFAULT_RATE, SimConfig, notes
from kvcargo.errors import KvcargoError, shown
from kvcargo.params import MAX_PROMPT
from kvcargo.web import checks, service
from kvcargo.web import presets as presets_mod
from kvcargo.web.workers import SimPool, SimulationTimeout, SimulatorBusy, WorkerFailed

STATIC = Path(str(resources.files("kvcargo.web").joinpath("static")))
MAX_BODY = 64 * 1024
"""Largest ``POST /api/simulate`` body (bytes)."""
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def plotly_js() -> Path | None:
    """plotly.min.js inside the installed plotly wheel, or None without plotly."""
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    """``{"error": "one line"}``, with ``field`` (the parameter at fault) when one is known."""
    body = {"error": message} | ({"field": field} if field else {})
    return JSONResponse(body, status_code=status)


def field_of(message: str) -> str | None:
    """The parameter an error message names first (``invalid --prompt ...`` → ``prompt``,
    ``parameter seed given more than once`` → ``seed``)."""
    m = re.search(r"--([a-z][a-z-]*)", message) or re.search(r"\bparameter ([a-z][a-z0-9_]*)\b", message)
    return m.group(1).replace("-", "_") if m else None


def host_name(host: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8000`` → ``[::1]``, ``a:80`` → ``a``)."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.split(":", 1)[0]


def refuse_request(request: Request, hosts: set[str] | None) -> JSONResponse | None:
    """An error response for a request the server must not answer, else None.

    A ``Host`` outside ``hosts`` (DNS rebinding), and on ``POST`` an ``Origin`` other than the
    page's own or a body that is not declared JSON: a form or ``text/plain`` POST from another
    site must not start a simulation (a browser sends those cross-site without asking).
    """
    host = request.headers.get("host", "")
    if hosts is not None and host_name(host) not in hosts:
        return _error(400, f"invalid Host header {shown(host)}: this server answers only {', '.join(sorted(hosts))}")
    if request.method == "POST":
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{host}":
            return _error(403, f"cross-site request refused (Origin {shown(origin)} is not this page's)")
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return _error(415, "send the parameters as JSON (Content-Type: application/json)")
    return None


def create_app(max_requests: int = 20_000, timeout_s: float = 30.0, workers: int = 2, queue: int = 8,
               catalog_files: Sequence[str] = (), allowed_hosts: Sequence[str] | None = None) -> FastAPI:
    """The web app.

    ``max_requests``: most requests one simulation may have; ``timeout_s``: wall-clock limit of a
    run; ``workers``: simulations running at once (one process each); ``queue``: runs that may
    wait for a worker before new ones are refused; ``catalog_files``: extra catalog TOML files
    (as ``--catalog`` on the CLI); ``allowed_hosts``: accepted ``Host`` headers (None: any).
    """
    if max_requests < 1 or timeout_s <= 0:
        raise KvcargoError("max_requests and timeout_s must be positive")
    catalog_files = tuple(str(f) for f in catalog_files)
    service.catalog(catalog_files)  # fail now, not on the first request, on a bad catalog file
    pool = SimPool(workers, timeout_s, queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool.warm()
        yield
        pool.close()

    app = FastAPI(title="kvcargo", version=__version__, lifespan=lifespan, docs_url=None,  # no CDN UI
                  redoc_url=None, openapi_url="/api/openapi.json")
    app.state.pool = pool
    app.state.limits = {"max_requests": max_requests, "timeout_s": timeout_s, "workers": workers,
                        "queue": queue, "max_prompt": MAX_PROMPT, **service.SIM_LIMITS}
    hosts = None if allowed_hosts is None else set(allowed_hosts)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        refused = refuse_request(request, hosts)
        response = refused or await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    @app.exception_handler(KvcargoError)
    async def invalid(request: Request, exc: KvcargoError) -> JSONResponse:
        return _error(422, str(exc), getattr(exc, "field", None) or field_of(str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    # ----------------------------------------------------------------------------- the page

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_bundle() -> Response:
        path = plotly_js()
        if path is None:
            return _error(404, "plotly is not installed: pip install 'kvcargo[ui]'")
        return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    # ------------------------------------------------------------------------------ the API

    @app.get("/api/handoff")
    def handoff(request: Request) -> dict[str, Any]:
        """The calculator (``kvcargo handoff --json``); query parameters as the CLI's options."""
        params = service.parse_handoff(request.query_params.multi_items())
        checks.check_catalog_keys(params.model_dump(), catalog_mod.load(catalog_files))
        return service.handoff(params, catalog_files)

    @app.get("/api/catalog")
    def catalog() -> dict[str, Any]:
        """Catalog entries by kind, the API's defaults and the server's limits."""
        return {**service.catalog(catalog_files),
                "defaults": {"handoff": service.handoff_defaults(), "simulate": service.simulate_defaults(),
                             "rate": DEFAULT_RATE},
                "limits": app.state.limits}

    @app.get("/api/presets")
    def presets() -> list[dict[str, Any]]:
        """The chapter's scenarios as simulation parameters, with the figures the chapter quotes."""
        return presets_mod.presets()

    def checked_simulation(body: dict[str, Any]) -> SimConfig:
        """The body as a configuration that passed every check a run makes before its engine
        starts: a bad request is answered here, never by a worker."""
        config = service.check_simulation(body, max_requests, catalog_files)
        checks.check_run(config)
        return config

    @app.post("/api/simulate")
    async def simulate(request: Request) -> Response:
        """One simulation (``kvcargo simulate --json``) plus the page's table and plot data, and
        ``notes``: what the run ignores or clips of the parameters (as the command says on stderr)."""
        body = await _read_json(request)
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object of simulation parameters")
        config = await run_in_threadpool(checked_simulation, body)
        try:
            payload = await pool.run({"config": config.model_dump()})
        except SimulationTimeout as exc:
            return _error(504, str(exc))
        except SimulatorBusy as exc:
            return _error(503, str(exc))
        except WorkerFailed as exc:
            return _error(500, f"the simulation failed: {exc}")
        except KvcargoError as exc:  # found by the run itself
            raise checks.with_field(exc, config) from None
        return JSONResponse({**payload, "notes": notes(config)})

    return app


async def _read_json(request: Request) -> Any:
    """The request body as JSON, at most MAX_BODY bytes (413 beyond, 400 if not JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise StarletteHTTPException(413, f"the body is larger than {MAX_BODY // 1024} KiB")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise StarletteHTTPException(413, f"the body is larger than {MAX_BODY // 1024} KiB")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StarletteHTTPException(400, f"the body is not valid JSON ({exc})") from None
