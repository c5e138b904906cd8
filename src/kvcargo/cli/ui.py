"""``kvcargo ui``: the interactive page (calculator and live simulator) on a local web server."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import threading
import time
import webbrowser

import click

from kvcargo.errors import KvcargoError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address to listen on (anything but loopback exposes the server to the network)")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--open", "open_browser", is_flag=True, help="open the page in the default browser")
@click.option("--max-requests", type=click.IntRange(1, 50_000_000), default=20_000, show_default=True,
              help="most requests one simulation may have")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 86_400), default=30.0, show_default=True,
              help="wall-clock limit of one simulation, seconds (the run is stopped)")
@click.option("--workers", type=click.IntRange(1, 64), default=None,
              help="simulations running at once, one process each [default: min(2, CPUs)]")
@click.option("--catalog", "catalog_files", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="extra catalog TOML file (repeatable)")
def command(host: str, port: int, open_browser: bool, max_requests: int, timeout_s: float, workers: int | None,
            catalog_files: tuple[str, ...]) -> None:
    """Serve the calculator and the live simulator on a local web page (no internet needed)."""
    try:
        import uvicorn

        from kvcargo.web.app import create_app
    except ImportError as exc:
        raise KvcargoError(f"kvcargo ui needs the ui extra ({exc.name} is missing): pip install 'kvcargo[ui]'") from None
    loopback = is_loopback(host)
    allowed = [*LOOPBACK_NAMES, "[::1]"] if loopback else None
    app = create_app(max_requests=max_requests, timeout_s=timeout_s, workers=workers or min(2, os.cpu_count() or 1),
                     catalog_files=catalog_files, allowed_hosts=allowed)
    if not loopback:
        click.echo(f"kvcargo: warning: listening on {host}: anyone who can reach this machine can use the page",
                   err=True)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):  # type: ignore[no-untyped-def]
            # Stop the workers before uvicorn waits for open requests: a run in flight ends now
            # (503, the server is shutting down) instead of after the run's time limit.
            await asyncio.to_thread(app.state.pool.close)
            await super().shutdown(sockets)

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))

    def announce() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        name = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
        url = f"http://{name}:{bound}/"
        click.echo(f"kvcargo ui: serving {url} (Ctrl-C to stop)")
        if open_browser:
            webbrowser.open(url)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind
        raise KvcargoError(f"cannot listen on {host}:{port} (in use, or not permitted)") from None
