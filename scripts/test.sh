#!/usr/bin/env bash
# Install everything the test suite needs into .venv (from a fresh machine), then run
# lint, types and the tests. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# llama-cpp-python compiles llama.cpp from source the first time (about 8 minutes on
# 2 cores); pip caches the wheel, so later installs on the same machine are quick.
.venv/bin/pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install --quiet -e '.[llm,dev,bench]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import sluice, llama_cpp, fastapi, openai" # fail loudly if the install failed

.venv/bin/ruff check sluice tests bench
.venv/bin/mypy sluice
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
