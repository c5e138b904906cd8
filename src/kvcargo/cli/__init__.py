"""The ``kvcargo`` command line: thin wrappers over the Python API.

Every command fails on bad input with one line on stderr and exit status 2.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import threading
from gettext import gettext as _
from pathlib import Path

# numpy asks the kernel for transparent huge pages for every large array; where the kernel then
# compacts memory synchronously (``defrag=madvise``, a common default) a million-request run
# spent ~0.5 s more in the kernel than it saves. Set before numpy is imported; a user's setting wins.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
# numpy's BLAS starts a thread per core when numpy is imported (~0.07 s of wall time and twice that
# of CPU on a 2-core machine, half of what the calculator costs); kvcargo does no large linear
# algebra, so a command keeps one. A user's setting wins.
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")
# pydantic looks up plugins in every installed distribution's entry points the first time it
# builds a model (~18 ms of a 0.2 s `kvcargo simulate` in a venv with the optional extras);
# kvcargo's models use none. A user's setting wins.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

import click  # noqa: E402 - after the environment above, which numpy reads when imported

from kvcargo import cachefiles  # noqa: E402
from kvcargo.errors import KvcargoError  # noqa: E402

NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""What click ≥ 8.2 raises for ``kvcargo`` (or a group) given nothing to do: its message is the help."""

COMMANDS = ("handoff", "catalog", "simulate", "step", "reproduce", "sweep", "capacity", "plan", "ui", "trace-stats",
            "validate", "calibrate")
"""Each command lives in ``kvcargo.cli.<name>`` (dashes as underscores) as ``command``."""


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (or the command list is shown), so
    ``kvcargo handoff`` never loads the simulator, the planner or the web server."""

    pause_collector = False
    """Whether importing a command's module pauses Python's cyclic garbage collector and then
    freezes what the import built (set by :func:`run`, the console script). An import builds
    thousands of long-lived objects (modules, classes, pydantic's validators, numpy) and no
    garbage, yet the collector scanned them over and over: ~10 ms of a ~0.15 s default
    ``kvcargo simulate``. Frozen, they are never scanned again; later garbage is collected as
    usual. Left off for :func:`main`'s in-process callers, whose earlier objects it would freeze."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = f"kvcargo.cli.{cmd_name.replace('-', '_')}"
        if not self.pause_collector or module in sys.modules or not gc.isenabled():
            return importlib.import_module(module).command
        gc.disable()
        try:
            return importlib.import_module(module).command
        finally:
            gc.freeze()
            gc.enable()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help``, as click writes it, kept in kvcargo's cache while the
        commands' modules are unchanged: listing them otherwise imports every command (the
        simulator, the planner, the web server) to read its first help line."""
        files = [Path(__file__).with_name(f"{name.replace('-', '_')}.py") for name in COMMANDS]
        rows = cachefiles.cached("command-list", (cachefiles.stamp(files), formatter.width),
                                 lambda: self._command_rows(ctx, formatter.width))
        if rows:
            with formatter.section(_("Commands")):
                formatter.write_dl(rows)

    def _command_rows(self, ctx: click.Context, width: int) -> list[tuple[str, str]]:
        """(name, first help line) of each command shown, fitted to ``width`` (click's rule)."""
        commands = [(name, cmd) for name in self.list_commands(ctx)
                    if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        limit = width - 6 - max((len(name) for name, _cmd in commands), default=0)
        return [(name, cmd.get_short_help_str(limit)) for name, cmd in commands]


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvcargo")
def cli() -> None:
    """What it costs to move the KV cache from prefill to decode, and what to do about it."""


def _register() -> None:
    """Import every command now, for callers that read ``cli.commands`` (``main`` needs only the
    one it runs)."""
    for name in COMMANDS:
        cli.add_command(cli.get_command(click.Context(cli), name))  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    try:
        cli.main(args=argv, prog_name="kvcargo", standalone_mode=False)
    except NO_ARGS_IS_HELP as exc:  # the whole help, as click shows it, not folded into one line
        click.echo(exc.format_message(), err=True)
        sys.exit(2)
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
    except MemoryError:  # a size the machine cannot hold (numpy names it, over several lines)
        click.echo("kvcargo: error: out of memory: the run is larger than this machine can hold (fewer --requests, "
                   "shorter --output or a trace's output lengths, or --summary-only)", err=True)
        sys.exit(2)
    except OSError as exc:  # the machine, not the input: a full disk, a file removed mid-run
        click.echo(f"kvcargo: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""), err=True)
        sys.exit(1)


def run() -> None:
    """The console script and ``python -m kvcargo``: :func:`main`, then leave without tearing the
    interpreter down.

    Freeing every module and object at exit (numpy, pydantic, the engine, the run's arrays) cost
    ~40 ms of a ~0.2 s default ``kvcargo simulate``. When the command succeeded and no other thread
    is running, kvcargo flushes its output, runs the exit handlers that libraries registered and
    ends the process at once; anything else (an error, a live thread, a platform without
    CPython's exit-handler hook) exits the ordinary way. Files kvcargo writes are closed by then
    (``with`` blocks), and its temporary files have no name on disk. The command's import pauses
    the garbage collector (:attr:`LazyGroup.pause_collector`)."""
    cli.pause_collector = True  # type: ignore[attr-defined]
    main()
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None or threading.active_count() > 1:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: let the ordinary exit report it as it would
        return
    run_exit_handlers()
    os._exit(0)
