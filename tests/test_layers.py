"""The package's floor plan, checked on its import graph (read with ``ast``, nothing imported).

Faces (``cli``, ``web``) stand on the planner, the presentation layer (``report``, ``params``)
and the core; they import only downward, except that the CLI starts the web server. The
planner never imports a face, the workload never imports the presentation layer, and no module
takes part in an import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src" / "kvcargo"
FACES = ("kvcargo.cli", "kvcargo.web")
ALLOWED_FACE_IMPORTS = {("kvcargo.cli.ui", "kvcargo.web.app")}
"""``kvcargo ui`` starts the web server."""
ENTRY_POINT = "kvcargo.__main__"
"""``python -m kvcargo``: stands above the CLI."""
KNOWN_DEFERRED_CYCLES = [
    {"kvcargo.calibrated", "kvcargo.calibration_fit"},
    {"kvcargo.validate", "kvcargo.validate_calibrated"},
]
"""Circles closed only by an import inside a function (never at import time); the engine's own
(the compiled build importing every kernel and the summary) is left to the engine's layout."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _target(name: str) -> str | None:
    """The package module an imported name lives in (``kvcargo.cli.options.x`` → ``kvcargo.cli.options``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, at_import_time: bool) -> set[str]:
    """Package modules ``module`` imports: at import time only (module level, not under
    ``TYPE_CHECKING``), or also inside functions."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for s in ast.walk(tree) if isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test)
                   for n in ast.walk(s)}
    deferred = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                for n in ast.walk(f)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or (at_import_time and id(node) in deferred):
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {t for t in map(_target, names) if t and t.startswith("kvcargo") and t != module}
    return out


def _cycles(at_import_time: bool) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: _imports(m, at_import_time) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    assert {"kvcargo.config", "kvcargo.cli.handoff", "kvcargo.web.service", "kvcargo.report.handoff"} <= set(MODULES)
    assert "kvcargo.handoff" in _imports("kvcargo.cli.handoff", at_import_time=True)


def test_no_import_cycle_at_import_time() -> None:
    assert _cycles(at_import_time=True) == []


def test_no_cycle_through_deferred_imports_outside_the_engine() -> None:
    outside = [c for c in _cycles(at_import_time=False) if not any(m.startswith("kvcargo.engine") for m in c)]
    assert [c for c in outside if c not in KNOWN_DEFERRED_CYCLES] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_faces_import_only_downward(module: str) -> None:
    face = next((f for f in FACES if module.startswith(f)), None)
    for target in _imports(module, at_import_time=False):
        other = next((f for f in FACES if target.startswith(f)), None)
        if face is not None and other is not None and other != face:
            assert (module, target) in ALLOWED_FACE_IMPORTS, f"{module} imports the {other} face ({target})"
        if face is None and other is not None and module != ENTRY_POINT:
            pytest.fail(f"{module} lies beneath the faces but imports {target}")
        if module.startswith("kvcargo.workload"):
            assert not target.startswith("kvcargo.report"), f"{module} renders through {target}"


def test_the_engine_state_takes_part_in_no_cycle() -> None:
    """The engine's tables are declared beneath everything that reads them (the compiled
    containers included), even counting imports inside functions."""
    low = {"kvcargo.engine.state", "kvcargo.engine.layout", "kvcargo.engine._structs"}
    assert [c for c in _cycles(at_import_time=False) if c & low] == []
