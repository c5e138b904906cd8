#!/usr/bin/env bash
# Create .venv with kvcargo and every optional part (numba, web UI, plots, Ray, Dask, Parquet).
# An argument names other extras (scripts/test.sh passes "all,test").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${1:-all}]"
# An editable install leaves kvcargo's bytecode to its first imports, which never write it where
# PYTHONDONTWRITEBYTECODE is set: every command would compile ~60 modules again (~0.1 s of a
# 0.3 s `kvcargo simulate`). Write it now; Python reads a cached .pyc even with that setting.
.venv/bin/python -m compileall -q src/kvcargo > /dev/null
# Build the compiled simulation engine, the serving levers' loop included, now (a few minutes,
# once, said on the terminal), not during the first run.
.venv/bin/python -m kvcargo.engine.aot
