#!/usr/bin/env bash
# Install what the tests need (Python extras, Debian's chromium for the browser tests) and run
# the whole suite: once compiled with numba (KVCARGO_JIT=1: every run, even a small one), and the
# engine's differential tests once more as plain Python (KVCARGO_JIT=0) and with numba's JIT
# instead of the ahead-of-time engine (KVCARGO_JIT=jit), to prove every path gives bit-identical
# results.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh all,test
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium not found and no apt-get: browser tests will be skipped" >&2
  fi
fi
mkdir -p test-output
KVCARGO_JIT=1 .venv/bin/python -m pytest -n auto -q "$@"
for mode in 0 jit; do
  KVCARGO_JIT=$mode .venv/bin/python -m pytest -q -m "not browser" tests/test_engine_parity.py tests/test_oracle_reference.py \
    tests/test_oracle_random.py tests/test_default_random.py -k "not oracle_equals_the_companions" \
    tests/test_levers_parallel.py
done
