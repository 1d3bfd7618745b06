#!/usr/bin/env bash
# Set up (dev requirements) and run the whole test suite, slow end-to-end tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-dev.txt
. .venv/bin/activate
python -m pytest -q "$@"
