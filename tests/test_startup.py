"""What a process loads: commands that only compute a few numbers never load the simulator or
numba; small runs stay plain Python; the engine compiled ahead of time gives the plain results.

Each check runs in a fresh interpreter (imports are per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from kvcargo.cli import main
try:
    main({args!r})
except SystemExit:
    pass
seen = {{"numba": "numba" in sys.modules, "engine": "kvcargo.engine.loop" in sys.modules}}
if seen["engine"]:
    from kvcargo.engine import aot
    seen["aot"] = aot.in_use()
print(json.dumps(seen), file=sys.stderr)
"""


def loaded(args: list[str], tmp_path: Path, jit: str | None = None) -> tuple[str, dict]:
    """stdout of ``kvcargo ARGS`` and what the process had loaded at the end."""
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("KVCARGO_JIT", None)
    if jit is not None:
        env["KVCARGO_JIT"] = jit
    p = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, env=env,
                       timeout=600, check=True)
    return p.stdout, json.loads(p.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["handoff"], ["--help"], ["catalog", "links"], ["handoff", "--links", "--json"]])
def test_the_calculator_and_the_catalog_never_load_the_engine(tmp_path: Path, args: list[str]) -> None:
    out, mods = loaded(args, tmp_path)
    assert out and mods == {"numba": False, "engine": False}


def test_a_small_run_stays_plain_python_with_the_plain_results(tmp_path: Path) -> None:
    auto, mods = loaded(["simulate", "--requests", "300", "--json"], tmp_path)
    plain, _ = loaded(["simulate", "--requests", "300", "--json"], tmp_path, jit="0")
    assert mods == {"numba": False, "engine": True, "aot": False}
    assert auto == plain and not list((tmp_path / "cache").glob("engine-*"))  # no engine was built for it


def test_the_engine_compiled_ahead_of_time_serves_later_processes_without_numba(tmp_path: Path) -> None:
    flags = ["simulate", "--requests", "300", "--link", "eth-25g", "--send", "layerwise", "--json"]
    forced, mods = loaded(flags, tmp_path, jit="1")  # builds the module
    assert mods["aot"] and list((tmp_path / "cache").glob("engine-*/kvcargo_engine_aot*.types"))
    later, mods = loaded(flags, tmp_path)
    assert mods == {"numba": False, "engine": True, "aot": True}
    plain, _ = loaded(flags, tmp_path, jit="0")
    jitted, mods = loaded(flags, tmp_path, jit="jit")
    assert mods == {"numba": True, "engine": True, "aot": False}
    assert forced == later == plain == jitted


WATCHED = ("numpy", "pydantic", "pydantic.plugin._loader", "kvcargo.config", "kvcargo.cli.simulate")
"""Modules whose loading a light command must not pay for (``pydantic.plugin._loader`` is imported
when pydantic builds a model's validator)."""
MODULES_PROBE = """
import sys
from kvcargo.cli import main
try:
    main({args!r})
except SystemExit:
    pass
print(" ".join(m for m in {watched!r} if m in sys.modules), file=sys.stderr)
"""


def watched_after(args: list[str], cache: Path) -> tuple[str, set[str]]:
    """stdout of ``kvcargo ARGS`` and which of :data:`WATCHED` the process had loaded."""
    env = {**os.environ, "KVCARGO_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", MODULES_PROBE.format(args=args, watched=WATCHED)], capture_output=True,
                       text=True, env=env, timeout=600, check=True)
    return p.stdout, set(p.stderr.strip().splitlines()[-1].split()) if p.stderr.strip() else set()


def test_help_lists_the_commands_without_loading_them(tmp_path: Path) -> None:
    first, _ = watched_after(["--help"], tmp_path)  # an empty cache: every command is imported once
    later, mods = watched_after(["--help"], tmp_path)
    assert later == first and "simulate" in later and "handoff" in later
    assert mods == set()


def test_the_calculator_builds_no_validator_once_the_catalog_is_cached(tmp_path: Path) -> None:
    first, _ = watched_after(["handoff", "--json"], tmp_path)
    later, mods = watched_after(["handoff", "--json"], tmp_path)
    assert later == first and json.loads(later)["kv_bytes"] == 268_435_456
    assert mods == {"numpy", "pydantic"}
