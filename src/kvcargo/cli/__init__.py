"""The ``kvcargo`` command line: thin wrappers over the Python API.

Every command fails on bad input with one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys

import click

from kvcargo.errors import KvcargoError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvcargo")
def cli() -> None:
    """What it costs to move the KV cache from prefill to decode, and what to do about it."""


def _register() -> None:
    from kvcargo.cli import (
        calibrate,
        capacity,
        catalog,
        handoff,
        plan,
        reproduce,
        simulate,
        step,
        sweep,
        trace_stats,
        ui,
        validate,
    )

    for module in (handoff, catalog, simulate, step, reproduce, sweep, capacity, plan, ui, trace_stats, validate, calibrate):
        cli.add_command(module.command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    _register()
    try:
        cli.main(args=argv, prog_name="kvcargo", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("kvcargo: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # one line, as for every other bad input
        command = exc.ctx.command_path if isinstance(exc, click.UsageError) and exc.ctx else "kvcargo"
        click.echo(f"{command}: error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
    except KvcargoError as exc:
        click.echo(f"kvcargo: error: {exc}", err=True)
        sys.exit(2)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as exc:  # the machine, not the input: a full disk, a file removed mid-run
        click.echo(f"kvcargo: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), err=True)
        sys.exit(1)
